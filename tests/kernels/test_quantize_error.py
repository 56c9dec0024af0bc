"""The one-pass quantize-and-measure path (accel.quantize_error, kernels quant_error_fused):
the same bytes and, bit for bit, the same error sums as quantize() then dequant_error(), for
every scheme it covers; None (the two-pass path decides) wherever it must not answer."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.quant import accel
from workbench.quant.evaluate import measure, quantize, quantize_measure
from workbench.schemes import get_scheme, list_schemes

from kernel_testutil import weights
from test_fused_error import assert_sums_equal


def _covered() -> list[str]:
    out = []
    for n in list_schemes():
        spec = accel.spec_for(n)
        if spec is not None and spec.family == "affine" and spec.quant in ("int", "ternary"):
            out.append(n)
    return out


COVERED = _covered()


def test_it_covers_the_integer_and_ternary_schemes():
    assert {"int4-g128", "int8-channel", "int3-g64", "int5-g64-asym", "ternary-g64"} <= set(COVERED)
    # grouped, channel, asymmetric and float16-scale variants are all among them
    assert len(COVERED) >= 20


@pytest.mark.parametrize("name", COVERED)
def test_one_pass_equals_two_passes(name):
    s = get_scheme(name)
    answered = 0
    for shape, seed in [((12, 512), 3), ((64, 256), 4), ((3, 1024), 5)]:
        if not s.can_take(shape):
            continue
        w = weights(shape, seed=seed)
        qt = quantize(w, name)
        ref = accel.dequant_error(w, qt, backend="cpu")
        got = accel.quantize_error(name, w, backend="cpu")
        if got is None:       # a scale at the edge of its range, a clip rule the kernel lacks
            continue
        answered += 1
        nbytes, sums = got
        assert nbytes == qt.nbytes
        # the same dequantized values through the same accumulator: bit for bit
        for f in ("n", "sse", "sig", "deq", "dot", "max_abs_err"):
            assert getattr(sums, f) == getattr(ref, f), f
        assert (sums.ch_sse == ref.ch_sse).all() and (sums.ch_sig == ref.ch_sig).all()
        # measure() gives the same answer as quantize_measure()
        nb2, sums2 = measure(w, name)
        qt3, sums3 = quantize_measure(w, name)
        assert nb2 == qt3.nbytes
        assert_sums_equal(sums2, sums3)
    spec = accel.spec_for(name)
    if spec.quant == "int" and spec.clip == "minmax" and not spec.pot and spec.gran != "tensor":
        assert answered > 0, f"{name}: the one-pass kernel never answered"


def test_nonfinite_rows_leave_it_to_the_two_pass_path():
    w = weights((8, 256), seed=1)
    w[3, 17] = np.nan
    assert accel.quantize_error("int4-g128", w, backend="cpu") is None
    w[3, 17] = np.inf
    assert accel.quantize_error("int4-g128", w, backend="cpu") is None


def test_scales_at_the_edge_of_their_range_go_to_the_reference():
    # a float16 scale that saturates (the reference refuses), a float32 scale whose inverse
    # overflows (1e-38 / 127) and one whose range overflows: never answered in one pass
    big = np.full((2, 128), 1e9, np.float32)
    assert accel.quantize_error("int4-g128", big, backend="cpu") is None
    tiny = np.full((2, 128), 1e-38, np.float32)
    assert accel.quantize_error("int8-channel", tiny, backend="cpu") is None
    huge = np.full((2, 128), 3e38, np.float32)
    huge[:, ::2] *= -1
    assert accel.quantize_error("int8-channel-asym", huge, backend="cpu") is None
    # measure() then gives what the two-pass path gives (here: the reference's values)
    nbytes, sums = measure(tiny, "int8-channel")
    qt, ref = quantize_measure(tiny, "int8-channel")
    assert nbytes == qt.nbytes
    assert_sums_equal(sums, ref)


def test_read_only_weights_and_odd_shapes():
    w = weights((16, 384), seed=7)
    w.setflags(write=False)                 # a memory-mapped model's weights
    nbytes, sums = accel.quantize_error("int4-g64", w, backend="cpu")
    qt = quantize(w, "int4-g64")
    assert nbytes == qt.nbytes
    assert_sums_equal(sums, accel.dequant_error(w, qt, backend="cpu"))
    # columns not a multiple of 8, or of the group: not this kernel's
    assert accel.quantize_error("int8-channel", weights((4, 12)), backend="cpu") is None
    assert accel.quantize_error("int4-g128", weights((4, 192)), backend="cpu") is None
    # the numpy backend never takes it
    assert accel.quantize_error("int4-g128", weights((4, 256)), backend="numpy") is None


def test_other_families_are_not_covered():
    w = weights((4, 256), seed=2)
    for name in ("q4_0", "q4_k", "nf4", "fp8-e4m3", "fp16"):
        if name in list_schemes():
            assert accel.quantize_error(name, w, backend="cpu") is None

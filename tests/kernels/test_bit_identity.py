"""Every registered scheme: CPU kernels bit-identical to the numpy reference.

The test matrix comes from the registry (list_schemes), so a new scheme is tested here
automatically; schemes without a kernel must still round-trip through the fallback.
"""

from __future__ import annotations

import numpy as np
import pytest

from workbench.quant import accel
from workbench.quant.accel import spec_for
from workbench.schemes import get_scheme, list_schemes

from kernel_testutil import same_bits, same_qt, weights

BASE = list_schemes()
VARIANTS = [n for n in list_schemes(variants=True) if n not in set(BASE)]
SHAPES = [(16, 256), (3, 512), (5, 7), (1, 13), (13,), (2, 3, 64), (7, 40)]


def _eligible(scheme, shapes=SHAPES):
    return [s for s in shapes if scheme.can_take(s)]


@pytest.mark.parametrize("name", BASE)
def test_dequantize_and_quantize_match_reference(name):
    s = get_scheme(name)
    shapes = _eligible(s)
    assert shapes, f"{name}: no test shape is eligible"
    for i, shape in enumerate(shapes):
        w = weights(shape, seed=i)
        ref_qt = s.quantize(w)
        ref = s.dequantize(ref_qt)
        got = accel.dequantize(ref_qt, backend="cpu")
        assert same_bits(got, ref), (name, shape)
        qt = accel.quantize(s, w, backend="cpu")
        assert same_qt(qt, ref_qt), (name, shape)


@pytest.mark.parametrize("name", BASE)
def test_every_registered_scheme_has_a_dequant_kernel(name):
    assert spec_for(get_scheme(name)) is not None
    assert accel.has_kernel(name, "dequantize", "cpu")
    assert accel.has_kernel(name, "error", "cpu")


@pytest.mark.parametrize("name", VARIANTS)
def test_clip_and_pot_variants(name):
    s = get_scheme(name)
    for i, shape in enumerate(_eligible(s, [(6, 256), (3, 7)])):
        w = weights(shape, seed=10 + i)
        ref_qt = s.quantize(w)
        assert same_qt(accel.quantize(s, w, backend="cpu"), ref_qt), (name, shape)
        assert same_bits(accel.dequantize(ref_qt, backend="cpu"), s.dequantize(ref_qt))


QUANT_KERNEL_SCHEMES = [n for n in BASE if spec_for(get_scheme(n)).quant is not None]


@pytest.mark.parametrize("name", QUANT_KERNEL_SCHEMES)
def test_quantize_edge_values(name):
    """Zero rows, constant rows, tiny and huge magnitudes, ties of the rounding."""
    s = get_scheme(name)
    cols = 256
    rng = np.random.default_rng(7)
    rows = [np.zeros(cols), np.full(cols, -0.0), np.full(cols, 3.0), np.full(cols, -1e-30),
            rng.standard_normal(cols) * 1e-20, rng.standard_normal(cols) * 1e20,
            np.round(rng.standard_normal(cols) * 8) / 2,          # many exact .5 ties
            np.arange(cols) - cols / 2.0]
    w = np.stack(rows).astype(np.float32)
    if not s.can_take(w.shape):
        pytest.skip("shape not eligible")
    from workbench.core.errors import WorkbenchError
    try:
        with np.errstate(all="ignore"):
            ref_qt = s.quantize(w)
            ref = s.dequantize(ref_qt)
    except WorkbenchError as exc:           # the reference refuses: so must the kernel path
        with pytest.raises(WorkbenchError, match=str(exc)[:30]):
            accel.quantize(s, w, backend="cpu")
        return
    assert same_qt(accel.quantize(s, w, backend="cpu"), ref_qt)
    assert same_bits(accel.dequantize(ref_qt, backend="cpu"), ref)


@pytest.mark.parametrize("name", ["fp8-e4m3", "fp8-e5m2"])
def test_fp8_rounding_on_every_midpoint(name):
    """Values at, just below and just above every midpoint between FP8 grid values."""
    s = get_scheme(name)
    grid = np.unique(np.abs(s.table[np.isfinite(s.table)])).astype(np.float64)
    mids = (grid[1:] + grid[:-1]) / 2
    vals = np.concatenate([grid, mids]).astype(np.float32)
    vals = np.concatenate([vals, np.nextafter(vals, np.float32(0)), np.nextafter(vals, np.float32(np.inf))])
    vals = np.concatenate([vals, -vals])
    n = (vals.size + 63) // 64 * 64
    w = np.zeros(n, np.float32)
    w[: vals.size] = vals
    w = w.reshape(-1, 64)
    w[:, 0] = s.fmax                       # scale 1.0: the values are rounded as they are
    ref_qt = s.quantize(w)
    assert same_qt(accel.quantize(s, w, backend="cpu"), ref_qt)


def test_fp16_and_bf16_keep_nonfinite_and_payloads():
    w = np.array([[np.nan, np.inf, -np.inf, 7e4, -7e4, 6e-8, -0.0, 1e-45, 3.3e38, 1.0]], np.float32)
    from workbench.core.errors import WorkbenchError
    w_all = w
    for name in ("fp16", "bf16", "fp32"):
        s = get_scheme(name)
        w = w_all
        if name == "fp16":     # finite values beyond float16 are refused (issue 9), both paths
            for path in (s.quantize, lambda x: accel.quantize(s, x, backend="cpu")):
                with pytest.raises(WorkbenchError, match="fp16 cannot represent value 3.3e"):
                    path(w)
            w = np.where(np.isfinite(w) & (np.abs(w) > 65504), np.float32(65504), w)
        with np.errstate(all="ignore"):
            ref_qt = s.quantize(w)
        assert same_qt(accel.quantize(s, w, backend="cpu"), ref_qt)
        assert same_bits(accel.dequantize(ref_qt, backend="cpu"), s.dequantize(ref_qt))
    # every float16 / bfloat16 bit pattern decodes exactly as numpy does
    allbits = np.arange(65536, dtype=np.uint32).astype(np.uint16).reshape(256, 256)
    for name, data in (("fp16", allbits.view(np.float16)), ("bf16", allbits)):
        s = get_scheme(name)
        from workbench.schemes.base import QuantizedTensor
        qt = QuantizedTensor(name, (256, 256), {"data": data})
        assert same_bits(accel.dequantize(qt, backend="cpu"), s.dequantize(qt))


def test_out_argument_and_shapes():
    s = get_scheme("int4-g64")
    w = weights((4, 2, 64))
    qt = s.quantize(w)
    out = np.empty(w.size, np.float32)
    res = accel.dequantize(qt, backend="cpu", out=out)
    assert res is out
    assert same_bits(out.reshape(w.shape), s.dequantize(qt))
    assert accel.dequantize(qt, backend="cpu").shape == w.shape
    with pytest.raises(ValueError):
        accel.dequantize(qt, backend="cpu", out=np.empty(3, np.float32))


def test_quantize_refuses_like_the_reference():
    from workbench.core.errors import WorkbenchError
    w = weights((4, 64))
    w[1, 3] = np.nan
    with pytest.raises(WorkbenchError):
        accel.quantize("int4-g64", w, backend="cpu")
    with pytest.raises(WorkbenchError):
        accel.quantize("int4-g64", weights((4, 60)), backend="cpu")


def test_numpy_backend_is_the_reference():
    s = get_scheme("nf4-g64")
    w = weights((4, 128))
    qt = accel.quantize(s, w, backend="numpy")
    assert same_qt(qt, s.quantize(w))
    assert same_bits(accel.dequantize(qt, backend="numpy"), s.dequantize(qt))


@pytest.mark.parametrize("name", ["int8-channel", "int4-g128", "int4-g128-asym", "int3-g64",
                                  "int2-g32-asym", "ternary-g64", "nf4-g64", "fp8-e4m3",
                                  "q4_0", "q8_0"])
def test_nonfinite_found_inside_the_kernels(name):
    """NaN (either sign) / +-Inf anywhere in a block: refused with the reference's count;
    huge finite values next to them are not mistaken for Inf."""
    from workbench.core.errors import WorkbenchError
    s = get_scheme(name)
    neg_nan = np.array([0xFFC00001], np.uint32).view(np.float32)[0]
    for bad, where in ((np.nan, [(0, 0)]), (neg_nan, [(3, 255)]), (np.inf, [(1, 100), (2, 7)]),
                       (-np.inf, [(5, 128), (5, 129), (5, 130)])):
        w = weights((6, 256), seed=3)
        w[4, 17] = np.finfo(np.float32).max
        w[4, 18] = -np.finfo(np.float32).max
        for r, c in where:
            w[r, c] = bad
        with pytest.raises(WorkbenchError) as ref:
            s.quantize(w)
        with pytest.raises(WorkbenchError) as got:
            accel.quantize(s, w, backend="cpu")
        assert str(got.value) == str(ref.value)
    w = weights((6, 256), seed=3)
    w[4, 17] = np.finfo(np.float32).max
    w[4, 18] = -np.finfo(np.float32).max
    try:
        with np.errstate(all="ignore"):
            ref_qt = s.quantize(w)
    except WorkbenchError as exc:          # e.g. a GGML float16 scale overflows
        with pytest.raises(WorkbenchError, match=str(exc)[:30]):
            accel.quantize(s, w, backend="cpu")
        return
    assert same_qt(accel.quantize(s, w, backend="cpu"), ref_qt)


def test_float64_to_float16_rounding_matches_numpy():
    """The ternary scale is float16(float64 mean): one rounding, ties to even, subnormals."""
    from kernels import cpu
    rng = np.random.default_rng(5)
    f16 = np.arange(0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)
    mids = (f16[1:] + f16[:-1]) / 2                     # exact ties in float64
    vals = np.concatenate([f16, mids, np.nextafter(mids, 0), np.nextafter(mids, 1e9),
                           np.abs(rng.standard_normal(2000)) * np.exp2(rng.uniform(-40, 16, 2000)),
                           [0.0, 1e-300, 2.0 ** -25, np.nextafter(2.0 ** -25, 1)]])
    vals = np.minimum(vals, 65504.0)
    want = vals.astype(np.float16).view(np.uint16)
    got = np.array([cpu._f64_to_f16_bits(v) for v in vals], np.int64).astype(np.uint16)
    assert np.array_equal(got, want)

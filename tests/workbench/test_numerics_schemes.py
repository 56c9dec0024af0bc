"""Issue 9, numerics: no Inf/NaN from finite input, explicit refusals naming the tensor and the
scale that cannot hold a value, tiny scales handled, kernels and reference agreeing."""

from __future__ import annotations

import math

import numpy as np
import pytest

from workbench.core.errors import WorkbenchError
from workbench.quant.evaluate import quantize, quantize_measure
from workbench.quant.metrics import from_sums
from workbench.schemes import get_scheme, list_schemes

FMAX = float(np.finfo(np.float32).max)
NON_GGML = [s for s in list_schemes(variants=True)
            if getattr(get_scheme(s), "ggml_type", None) is None
            and (not s.startswith("int") or s.split("-")[1] in ("tensor", "channel", "g32"))]


def _rows(*values, cols=128):
    rng = np.random.default_rng(1)
    base = rng.standard_normal((len(values), cols)).astype(np.float32) * 0.02
    for i, v in enumerate(values):
        base[i, 5] = v
    return base


HOSTILE = {
    "above_fp16": np.full((4, 128), 7e4, np.float32),
    "flt_max": np.where(np.arange(512).reshape(4, 128) % 2, FMAX, -FMAX).astype(np.float32),
    "outlier_1e30": _rows(1e30, 0.0, -1e30, 0.5),
    "near_limit": np.full((2, 128), 1.5e38, np.float32),
    "subnormal_rows": np.vstack([np.full((1, 128), 1e-41, np.float32),
                                 np.full((1, 128), -1e-39, np.float32),
                                 np.where(np.arange(128) % 2, 1e-40, 0).astype(np.float32)[None],
                                 np.ones((1, 128), np.float32)]),
    "zeros": np.zeros((4, 128), np.float32),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_values_never_give_nan_inf_or_a_traceback(case):
    """Every non-GGML scheme on each hostile tensor: a WorkbenchError naming the tensor, or a
    finite dequantization with finite, defined metrics (kernel path and reference path)."""
    w = HOSTILE[case]
    refused = finite = 0
    for name in NON_GGML:
        s = get_scheme(name)
        try:
            qt, sums = quantize_measure(w, name, tensor="blk.0.w")
        except WorkbenchError as exc:
            assert str(exc).startswith("tensor 'blk.0.w': "), str(exc)
            assert "represent" in str(exc), str(exc)
            with pytest.raises(WorkbenchError):       # the reference agrees it cannot
                s.quantize(w, tensor="blk.0.w")
            refused += 1
            continue
        deq = s.dequantize(qt)
        assert np.isfinite(deq).all(), name
        e = from_sums(sums)
        for v in (e.mse, e.rel_rmse, e.cosine, e.max_abs_err):
            assert math.isfinite(v), (name, e)
        assert not math.isnan(e.sqnr_db), name
        ref = s.quantize(w)                            # the kernel result is the reference's
        for k, a in ref.arrays.items():
            np.testing.assert_array_equal(a.view(np.uint8), qt.arrays[k].view(np.uint8),
                                          err_msg=f"{name} {k}")
        finite += 1
    assert refused + finite == len(NON_GGML)
    if case in ("zeros", "subnormal_rows"):
        assert refused == 0


def test_int4_g128_outlier_refused_not_saturated():
    w = _rows(1.2e30, 0.1)
    w = np.hstack([w] * 1)
    with pytest.raises(WorkbenchError) as exc:
        quantize(w, "int4-g128", tensor="model.layers.0.mlp.down_proj.weight")
    assert str(exc.value) == (
        "tensor 'model.layers.0.mlp.down_proj.weight': int4-g128's float16 scale cannot "
        "represent value 1.2e+30 (a block takes |w| up to 458528; use a channel/tensor scheme "
        "or keep this tensor)")
    # the largest value a block holds is kept; channel scales (float32) take the outlier
    edge = _rows(65504.0 * 7)
    assert np.isfinite(get_scheme("int4-g128").dequantize(quantize(edge, "int4-g128"))).all()
    qt = quantize(w, "int4-channel")
    assert np.isfinite(get_scheme("int4-channel").dequantize(qt)).all()


@pytest.mark.parametrize("name,value,msg", [
    ("fp16", 7e4, "fp16 cannot represent value 7e+04"),
    ("bf16", FMAX, "bf16 cannot represent value 3.4e+38"),
    ("int8-channel", FMAX, "int8-channel cannot represent value 3.4e+38"),
    ("fp8-e4m3", -FMAX, "fp8-e4m3 cannot represent value 3.4e+38"),
    ("nf4-g64", 2e38, "nf4-g64 cannot represent value 2e+38"),
    ("ternary-g64", 1e30, "ternary-g64's float16 scale cannot represent a block mean"),
    ("int8-g32@pot", 32768.0 * 127 * 1.5, "int8-g32@pot's float16 scale cannot represent"),
])
def test_refusals_name_the_scheme_and_value(name, value, msg):
    w = _rows(value, 0.25)
    with pytest.raises(WorkbenchError, match="^tensor 'x': " + msg.replace("+", r"\+")):
        quantize(w, name, tensor="x")


def test_casts_keep_what_fits_and_pass_nonfinite_through():
    w = np.array([[65504.0, 65519.0, -65504.0, np.inf, np.nan, 3.3895314e38]], np.float32)
    fp16 = get_scheme("fp16")
    got = fp16.dequantize(fp16.quantize(w[:, :5]))
    assert got[0, 1] == 65504.0 and np.isinf(got[0, 3]) and np.isnan(got[0, 4])
    bf = get_scheme("bf16")
    assert bf.dequantize(bf.quantize(w))[0, 5] == np.float32(3.3895314e38)


def test_tiny_float32_scales_divide_instead_of_an_infinite_inverse():
    """Weights ~1e-39: a channel scale ~1e-41 has an infinite float32 inverse. Before: NaN codes
    and relative error > 1; now the block is quantized as well as its subnormal scale allows."""
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((3, 128)) * 1e-39).astype(np.float32)
    for name in ("int8-channel", "int8-tensor-asym", "int4-channel@mse", "nf4-g64"):
        qt, sums = quantize_measure(w, name)
        err = from_sums(sums)
        normal = from_sums(quantize_measure(w * np.float32(1e38), name)[1])  # same, scaled up
        assert err.rel_rmse < 1.2 * normal.rel_rmse + 1e-3, (name, err.rel_rmse, normal.rel_rmse)
        np.testing.assert_array_equal(get_scheme(name).quantize(w).arrays.get("codes"),
                                      qt.arrays.get("codes"))
    # zeros next to a tiny absmax stay zero under nf4 (0 * inf was NaN -> the top code)
    z = np.where(np.arange(128) % 2, 1e-40, 0).astype(np.float32).reshape(2, 64)
    d = get_scheme("nf4-g64").dequantize(get_scheme("nf4-g64").quantize(z))
    assert (d[z == 0] == 0).all() and np.allclose(d[z != 0], z[z != 0], rtol=0.01)


def test_float16_scale_underflow_stores_zeros_and_says_so_in_the_metrics():
    """std 1e-8 under a float16-scaled group scheme: the scale underflows float16, the block is
    stored as zeros (not garbage): relative error exactly 1, SQNR exactly 0 dB."""
    w = (np.random.default_rng(0).standard_normal((4, 128)) * 1e-8).astype(np.float32)
    qt, sums = quantize_measure(w, "int4-g128")
    e = from_sums(sums)
    assert (qt.arrays["scales"] == 0).all()
    assert e.rel_rmse == 1.0 and e.sqnr_db == 0.0

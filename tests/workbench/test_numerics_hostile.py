"""Numerics on hostile but finite weights: no Inf/NaN from finite input, no math domain
error, defined SQNR for exact and all-zero tensors, empty tensors evaluated cleanly."""

from __future__ import annotations

import math

import numpy as np
import pytest

from workbench.core.errors import WorkbenchError
from workbench.quant.evaluate import evaluate, evaluate_tensor, quantize
from workbench.formats.loaders import open_model
from workbench.quant.metrics import sqnr_db
from workbench.quant.plan import Plan
from workbench.core.progress import run

FLT_MAX = float(np.finfo(np.float32).max)


@pytest.mark.parametrize("scheme,value,refused", [
    ("fp16", 1e5, True),           # above 65504: refused, not Inf
    ("fp16", 6.0e4, False),
    ("q8_0", 3e38, True),          # its float16 block scale would overflow
    ("int4-g128", 1e30, True),     # float16 group scale: refused, not saturated
    ("bf16", FLT_MAX, True),        # rounds to bfloat16 infinity: refused
    ("int8-channel", FLT_MAX, None),  # refused or finite, never Inf/NaN metrics
    ("fp8-e4m3", FLT_MAX, None),
    ("int8-channel", 1e38, False),
])
def test_finite_extremes_never_give_non_finite_results(make_safetensors, scheme, value, refused):
    w = np.random.default_rng(0).standard_normal((4, 256)).astype(np.float32)
    w[1, 7] = value
    w[2, 9] = -value
    m = open_model(make_safetensors({"x.weight": w}))
    if refused:
        with pytest.raises(WorkbenchError, match=f"model1.safetensors: tensor 'x.weight'.*{scheme}"):
            evaluate_tensor(m, "x.weight", scheme, cache=None)
        return
    try:
        r = evaluate_tensor(m, "x.weight", scheme, cache=None)
    except WorkbenchError as exc:
        assert refused is None and scheme in str(exc) and "x.weight" in str(exc)
        return
    e = r.error
    assert all(math.isfinite(v) for v in (e.mse, e.rel_rmse, e.max_abs_err, e.cosine)), e
    assert not math.isnan(e.sqnr_db)


def test_sqnr_is_defined_everywhere():
    assert sqnr_db(1.0, 0.0) == math.inf            # exact
    assert sqnr_db(0.0, 0.0) == math.inf            # all zeros, exact
    assert sqnr_db(0.0, 1.0) == -math.inf           # all zeros, quantized to non-zeros
    assert sqnr_db(1e300, math.inf) == -math.inf    # an error that overflowed
    assert sqnr_db(100.0, 1.0) == pytest.approx(20.0)


def test_all_zero_and_empty_tensors(make_safetensors):
    m = open_model(make_safetensors({
        "z.weight": np.zeros((8, 64), np.float32), "e.weight": np.zeros((3, 0), np.float32),
        "r.weight": np.zeros((0, 4), np.float32), "i": np.zeros((3, 0), np.int64),
        "d": np.zeros((3, 0), np.float64)}))
    for scheme in ("q4_0", "int4-g32", "fp8-e4m3", "nf4-g64", "q8_0"):
        r = evaluate_tensor(m, "z.weight", scheme, cache=None)
        assert r.error.sqnr_db == math.inf and r.error.cosine == 1.0
    ev = run(evaluate(m, Plan(default="q8_0")))
    assert ev.tensors["e.weight"].params == 0 and ev.tensors["r.weight"].params == 0
    for name in ("e.weight", "r.weight", "i", "d"):
        qt = ev.tensors[name]
        assert qt.bytes == 0, name


def test_tiny_weights_error_is_bounded():
    """std 1e-8 weights: nothing worse than zeroing (relative error <= 1) for every scheme
    that is not a GGML block type (those are the kernels' own property tests)."""
    w = (np.random.default_rng(1).standard_normal((8, 256)) * 1e-8).astype(np.float32)
    for scheme in ("int4-g128", "int8-channel", "int4-g32-asym", "nf4-g64", "fp8-e4m3"):
        from workbench.quant.metrics import tensor_error
        from workbench.schemes import get_scheme
        wq = get_scheme(scheme).dequantize(quantize(w, scheme)).reshape(w.shape)
        assert tensor_error(w, wq).rel_rmse <= 1.0, scheme


@pytest.mark.parametrize("scheme", ["q4_1", "q5_1", "q2_k", "q4_k", "q5_k", "q4_0", "q8_0",
                                    "q3_k", "q6_k", "iq4_nl"])
def test_ggml_tiny_weights_never_worse_than_zeros(scheme):
    """std 1e-8 weights sit at float16's smallest steps: a rounded min alone used to put the
    affine formats at relative error 1.4; a block worse than zeros is now stored as zeros."""
    from workbench.quant.metrics import tensor_error
    from workbench.schemes import get_scheme
    w = (np.random.default_rng(1).standard_normal((8, 256)) * 1e-8).astype(np.float32)
    wq = get_scheme(scheme).dequantize(quantize(w, scheme)).reshape(w.shape)
    assert tensor_error(w, wq).rel_rmse <= 1.0
    # ordinary weights are untouched by the rule: error well below zeroing
    w2 = np.random.default_rng(2).standard_normal((8, 256)).astype(np.float32)
    wq2 = get_scheme(scheme).dequantize(quantize(w2, scheme)).reshape(w2.shape)
    assert tensor_error(w2, wq2).rel_rmse < 0.5

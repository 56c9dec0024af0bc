"""GPTQ for the MLX schemes (workbench.quant.methods.mlx_gptq): the result is in mlx's own
layout (mx.dequantize reads exactly the values the column loop compensated with). Its output
error on real weights: tests/workbench/test_mlx_weighted.py."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.schemes import get_scheme


@pytest.mark.parametrize("name", ["mlx-q3-g32", "mlx-q2-g64@bf16", "mlx-nvfp4", "mlx-mxfp4"])
def test_gptq_mlx_bytes_are_mlx_layout_and_decode_to_the_loop_values(name):
    mx = pytest.importorskip("mlx.core")
    from workbench.quant.methods import gptq as g
    from workbench.quant.methods.mlx_gptq import MlxColumns
    s = get_scheme(name)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((256, 64)) @ rng.standard_normal((64, 64)) * 0.3
    w = rng.standard_normal((6, 64)).astype(np.float32)
    H = 2.0 * x.T @ x / len(x)
    W, U, _dead, hdiag = g.hessian_factor(H, w)
    cq = MlxColumns(s, *w.shape, hdiag)
    g.gptq_columns(W.copy(), U, cq, None)
    qt = cq.result(None, w.shape, {"method": "gptq"})
    ref = s.quantize(w)
    assert qt.nbytes == ref.nbytes == s.nbytes(w.shape)
    assert {k: (a.dtype, a.shape) for k, a in qt.arrays.items()} == {
        k: (a.dtype, a.shape) for k, a in ref.arrays.items()}
    deq = s.dequantize(qt)
    np.testing.assert_array_equal(deq.astype(np.float64), cq.deq)   # what the loop used
    a = qt.arrays
    cfg = s.mlx_config
    if s.mode == "affine":
        dt = mx.bfloat16 if s.dtype == "BF16" else mx.float16
        sc = mx.array(a["scales"].view(np.float16)) if dt == mx.float16 else \
            mx.array(a["scales"]).view(mx.bfloat16)
        bi = mx.array(a["biases"].view(np.float16)) if dt == mx.float16 else \
            mx.array(a["biases"]).view(mx.bfloat16)
        out = mx.dequantize(mx.array(a["weight"]), sc, bi, group_size=cfg["group_size"],
                            bits=cfg["bits"])
    else:
        out = mx.dequantize(mx.array(a["weight"]), mx.array(a["scales"]),
                            group_size=cfg["group_size"], bits=cfg["bits"], mode=cfg["mode"])
    np.testing.assert_array_equal(np.array(out.astype(mx.float32)), deq)

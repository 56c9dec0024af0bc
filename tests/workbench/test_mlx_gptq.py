"""GPTQ for the MLX schemes (workbench.quant.methods.mlx_gptq): the result is in mlx's own
layout (mx.dequantize reads exactly the values the column loop compensated with), and on the
demo model's real weights and calibration Hessians its layer output error is below mlx's
rounding's at the same bytes."""

from __future__ import annotations

import numpy as np
import pytest

import workbench as qw
from workbench.core.progress import run
from workbench.quant.methods import get_method
from workbench.running.methods_apply import collect_stats
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


@pytest.fixture(scope="module")
def real():
    model = qw.open_model()
    names = ["model.layers.1.self_attn.q_proj.weight", "model.layers.2.mlp.down_proj.weight"]
    stats = run(collect_stats(model, names=names, samples=4, want_h=True))
    return model, {n: stats[n] for n in names}


def test_gptq_mlx_lower_output_error_than_mlx_rounding(real):
    model, stats = real
    gptq = get_method("gptq")
    for n, st in stats.items():
        w = np.asarray(model.read_matrix(n), np.float32)
        H = np.asarray(st.H, np.float64)
        for name in ("mlx-q3-g64", "mlx-q2-g32", "mlx-q4-g64@bf16", "mlx-nvfp4"):
            s = get_scheme(name)
            q_g, q_r = gptq.quantize(w, s, st, tensor=n), s.quantize(w)
            assert q_g.nbytes == q_r.nbytes

            def err(qt):
                d = s.dequantize(qt).astype(np.float64) - w
                return float(np.einsum("ij,jk,ik->", d, H, d))
            assert err(q_g) < 0.8 * err(q_r), (n, name, err(q_g) / err(q_r))

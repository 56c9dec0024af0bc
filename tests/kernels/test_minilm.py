"""Real weights: a few all-MiniLM-L6-v2 tensors through every scheme's kernels."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.quant import accel
from workbench.schemes import get_scheme, list_schemes

from kernel_testutil import same_bits, same_qt

TENSORS = ["encoder.layer.0.attention.self.query.weight",      # 384 x 384
           "encoder.layer.3.intermediate.dense.weight",         # 1536 x 384
           "encoder.layer.5.output.LayerNorm.weight"]           # 384 (1-D)


@pytest.fixture(scope="module")
def minilm(minilm_path):
    from safetensors import safe_open
    out = {}
    with safe_open(minilm_path, framework="np") as f:
        names = set(f.keys())
        for t in TENSORS:
            key = t if t in names else next(k for k in names if k.endswith(t))
            out[t] = np.asarray(f.get_tensor(key), dtype=np.float32)
    return out


@pytest.mark.parametrize("name", list_schemes())
def test_minilm_bit_identical(minilm, name):
    s = get_scheme(name)
    ggml = getattr(s, "ggml_type", None) is not None
    for t, w in minilm.items():
        if not s.can_take(w.shape) or (ggml and w.size > 200_000):
            continue                  # the numpy K-quant references are slow: one tensor
        ref_qt = s.quantize(w)
        assert same_bits(accel.dequantize(ref_qt, backend="cpu"), s.dequantize(ref_qt)), t
        if accel.has_kernel(s, "quantize", "cpu"):
            assert same_qt(accel.quantize(s, w, backend="cpu"), ref_qt), t
        sums = accel.dequant_error(w, ref_qt, backend="cpu")
        assert sums.max_abs_err == float(np.abs(w.astype(np.float64).reshape(sums.ch_sse.size, -1)
                                                - s.dequantize(ref_qt).astype(np.float64)
                                                .reshape(sums.ch_sse.size, -1)).max())

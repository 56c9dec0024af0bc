"""GGML schemes on the real all-MiniLM-L6-v2 weights: error bounds, identity with gguf, and
quality against llama.cpp's own reference quantizers.

The REF_* numbers are relative RMSEs measured once with ggml's ``quantize_row_*_ref`` (and
``quantize_iq4_nl`` without an importance matrix), built from ggml commit 9a4acb3 beside the
project, on exactly these tensors (see docs/schemes.md, GGML block formats). The issue's target: each K-type no
worse than 2 % above llama.cpp's reference.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from workbench.schemes import get_scheme

FFN_DOWN = "encoder.layer.0.output.dense.weight"          # (384, 1536): rows of 1536 = 6*256
QUERY = "encoder.layer.0.attention.self.query.weight"     # (384, 384): 32-blocks only

# relative RMSE of llama.cpp's reference quantizer on these tensors
REF = {
    (FFN_DOWN, "q2_k"): 0.31159, (FFN_DOWN, "q3_k"): 0.15666, (FFN_DOWN, "q4_k"): 0.07490,
    (FFN_DOWN, "q5_k"): 0.04064, (FFN_DOWN, "q6_k"): 0.01912, (FFN_DOWN, "iq4_nl"): 0.07923,
    (QUERY, "q4_0"): 0.08732, (QUERY, "q4_1"): 0.07903, (QUERY, "q5_0"): 0.04340,
    (QUERY, "q5_1"): 0.03833, (QUERY, "q8_0"): 0.00546, (QUERY, "iq4_nl"): 0.07696,
}
CASES = sorted(REF)


def rel_rmse(a, b) -> float:
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    return float(np.sqrt(np.sum((a - b) ** 2) / np.sum(b ** 2)))


@pytest.fixture(scope="module")
def weights(minilm):
    return {n: minilm.read_matrix(n) for n in (FFN_DOWN, QUERY)}


@pytest.mark.parametrize("tensor,name", CASES)
def test_quality_vs_llama_cpp_reference(weights, tensor, name):
    w = weights[tensor]
    s = get_scheme(name)
    qt = s.quantize(w, tensor=tensor)
    back = s.dequantize(qt)
    rel = rel_rmse(back, w)
    assert rel <= REF[(tensor, name)] * 1.02, f"{name} on {tensor}: {rel:.5f} vs llama.cpp {REF[(tensor, name)]:.5f}"
    # Q3_K/Q6_K search their scales against the decoded error (schemes/ggml/sym_k.py): at
    # least 3 % below llama.cpp's error
    if name in ("q3_k", "q6_k"):
        assert rel <= REF[(tensor, name)] * 0.97, f"{name}: {rel:.5f}"
    # the legacy quantizers are byte-exact copies of the reference rules: equal error
    if name in ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0"):
        assert abs(rel - REF[(tensor, name)]) < 2e-5
    # and gguf decodes our bytes to the same floats
    ref = gguf.quants.dequantize(qt.arrays["blocks"], s.ggml_type)
    assert np.array_equal(ref.view(np.uint32), back.view(np.uint32))


def test_sqnr_ordering_on_real_weights(weights):
    w = weights[FFN_DOWN]
    sqnr = {}
    for name in ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "q8_0"):
        s = get_scheme(name)
        sqnr[name] = -20 * np.log10(rel_rmse(s.dequantize(s.quantize(w)), w))
    vals = list(sqnr.values())
    assert vals == sorted(vals), sqnr
    # roughly 6 dB per bit from 3 to 6 bits
    assert 15 < sqnr["q6_k"] - sqnr["q3_k"] < 21, sqnr


def test_quantize_bytes_identical_to_gguf_on_real_weights(weights):
    w = weights[QUERY]
    for name in ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0"):
        s = get_scheme(name)
        ours = s.quantize(w).arrays["blocks"].reshape(-1, s.type_size)
        ref = gguf.quants.quantize(w, s.ggml_type).reshape(-1, s.type_size)
        assert float(np.mean(np.all(ours == ref, axis=1))) == 1.0, name

"""IQ4_NL against ggml's own quantize_iq4_nl (kernels.ggml_ref): the same error as ggml, with
and without an importance matrix, and ggml decodes the workbench's bytes exactly."""

from __future__ import annotations

import numpy as np
import pytest

from kernels import ggml_ref


@pytest.fixture(scope="module")
def ggml(llama_bin):
    if not ggml_ref.available():
        pytest.fail(f"libggml-base not found under {ggml_ref.cache_dir()}")
    return ggml_ref


@pytest.mark.parametrize("name", ["encoder.layer.0.output.dense.weight",
                                  "encoder.layer.3.attention.self.query.weight"])
def test_iq4_nl_error_equals_ggmls_plain_and_weighted(ggml, minilm, name):
    """Measured on these MiniLM matrices: plain relative-RMSE ratio 1.000, importance-weighted
    1.000 (lognormal per-column importance) while the unweighted bytes are ~1.15x ggml's
    weighted error; the bound allows 0.5 %."""
    from workbench.quant.evaluate import quantize
    from workbench.quant.methods.ggml_weighted import weighted_encode
    from workbench.schemes import get_scheme
    s = get_scheme("iq4_nl")
    w = np.ascontiguousarray(minilm.read_matrix(name), np.float32)
    x = w.astype(np.float64)
    plain_raw = quantize(w, "iq4_nl").arrays["blocks"]
    plain = ggml.dequantize("iq4_nl", plain_raw, w.shape[1])
    assert np.array_equal(plain.view(np.uint32),
                          s.dequantize(quantize(w, "iq4_nl")).reshape(w.shape).view(np.uint32))
    theirs = ggml.dequantize("iq4_nl", ggml.quantize("iq4_nl", w), w.shape[1])
    r = np.sqrt(((x - plain) ** 2).sum() / ((x - theirs) ** 2).sum())
    assert r <= 1.005, r
    qv = np.random.default_rng(0).lognormal(0.0, 1.5, w.shape[1]).astype(np.float32)
    raw = weighted_encode(s, w, np.broadcast_to(qv, w.shape)).reshape(w.shape[0], -1)
    ours = ggml.dequantize("iq4_nl", raw, w.shape[1])
    theirs_w = ggml.dequantize("iq4_nl", ggml.quantize("iq4_nl", w, imatrix=qv), w.shape[1])
    e = lambda y: (qv * (x - y) ** 2).sum()       # noqa: E731
    assert np.sqrt(e(ours) / e(theirs_w)) <= 1.005
    assert e(ours) < e(plain)                      # the importance matters

"""The IQ4_XS quantize kernel (kernels/iq4xs_quant.py) against its numpy reference
(workbench.schemes.ggml.iq4_xs, ggml's quantize_row_iq4_nl_impl in float32): the same bytes
plain and importance-weighted on ordinary, edge and hostile weights, the same refusals, and the
quantize paths (evaluate, methods.ggml_weighted) use it."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.core.errors import WorkbenchError
from workbench.quant import accel
from workbench.schemes import get_scheme

from kernel_testutil import same_bits, same_qt, weights

S = get_scheme("iq4_xs")


def _kernel_bytes(w, qw=None):
    from kernels import iq4xs_quant
    w = np.ascontiguousarray(w, np.float32)
    blocks = np.empty((w.shape[0], w.shape[1] // 256 * 136), np.uint8)
    flags = np.empty(w.shape[0], np.uint8)
    iq4xs_quant.encode_blocks(w, blocks, flags, None if qw is None else np.ascontiguousarray(qw))
    return blocks, flags


def _hostile(seed=3):
    from workbench.schemes.ggml.iq4_nl import KVALUES
    rng = np.random.default_rng(seed)
    rows = [rng.standard_normal(512) * s for s in (1e-30, 1e-12, 1e-6, 1e-3, 1.0, 7.0, 1e3)]
    rows += [rng.laplace(size=512), np.abs(rng.standard_normal(512)),
             -np.abs(rng.standard_normal(512))]
    w = np.stack(rows).astype(np.float32)
    edge = np.zeros((6, 512), np.float32)
    edge[0, 32:64] = -0.0                                  # zero and -0 sub-blocks
    edge[0, 256:] = rng.standard_normal(256).astype(np.float32)
    edge[0, 256:288] = 0.0                                 # a zero sub-block in a live block
    edge[1, :32] = np.resize(KVALUES.astype(np.float32), 32) * np.float32(0.01)
    mids = (KVALUES[1:].astype(np.float32) + KVALUES[:-1]) / 2
    edge[1, 32:64] = np.resize(np.concatenate([mids, [-127.0]]), 32) * np.float32(0.01)
    edge[2] = (rng.standard_normal(512) * 1e-40).astype(np.float32)   # float32 subnormals
    edge[3, :] = np.float32(0.37)
    edge[4, 3], edge[4, 9] = 2.0, -2.0                     # a |max| tie: the first one wins
    edge[5] = (rng.standard_normal(512) * 30000).astype(np.float32)
    return np.concatenate([w, edge])


def test_iq4_xs_has_a_quantize_kernel():
    assert accel.has_kernel("iq4_xs", "quantize", "cpu")


def test_same_bytes_as_reference_plain():
    w = _hostile()
    blocks, flags = _kernel_bytes(w)
    assert not flags.any()
    ref = S.quantize(w).arrays["blocks"]
    assert np.array_equal(blocks, ref), np.argwhere((blocks != ref).any(axis=1)).ravel()
    qt = accel.quantize(S, w, backend="cpu")
    assert same_qt(qt, S.quantize(w))
    assert same_bits(accel.dequantize(qt, backend="cpu"), S.dequantize(qt))


def _weighted_ref(w, qw):
    enc = S.encode(w.reshape(-1, 256), np.ascontiguousarray(qw, np.float32).reshape(-1, 256))
    return enc.view(np.uint8).reshape(w.shape[0], -1)


def test_weighted_same_bytes_as_reference():
    """Per-column importance with dead columns and a dead sub-block, per-row importance."""
    rng = np.random.default_rng(21)
    w = _hostile(5)
    qcol = rng.lognormal(0.0, 1.5, 512).astype(np.float32)
    qcol[::9] = 0.0
    qcol[64:96] = 0.0
    qrow = rng.lognormal(0.0, 1.0, w.shape).astype(np.float32)
    for qw in (np.broadcast_to(qcol, w.shape), qrow):
        blocks, flags = _kernel_bytes(w, qw)
        assert not flags.any()
        assert np.array_equal(blocks, _weighted_ref(w, qw))
    assert not np.array_equal(_kernel_bytes(w, qrow)[0], _kernel_bytes(w)[0])


def test_scale_overflow_refused_like_the_reference():
    w = weights((3, 256), seed=2)
    w[1, 7] = np.float32(3e8)                         # float16 d = scale/32 overflows
    blocks, flags = _kernel_bytes(w)
    assert flags[1] & 1 and not flags[0] and not flags[2]
    with pytest.raises(WorkbenchError) as ref:
        S.quantize(w)
    with pytest.raises(WorkbenchError) as got:
        accel.quantize(S, w, backend="cpu")
    assert str(got.value) == str(ref.value) and "overflows" in str(got.value)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nonfinite_refused_with_the_reference_count(bad):
    w = weights((4, 256), seed=4)
    w[2, 40] = bad
    w[3, 95] = bad
    assert list(_kernel_bytes(w)[1] & 2) == [0, 0, 2, 2]
    with pytest.raises(WorkbenchError) as ref:
        S.quantize(w)
    with pytest.raises(WorkbenchError) as got:
        accel.quantize(S, w, backend="cpu")
    assert str(got.value) == str(ref.value) and "2 NaN/Inf" in str(got.value)


def test_evaluate_and_weighted_encode_use_the_kernel(monkeypatch):
    from workbench.quant.evaluate import quantize
    from workbench.quant.methods.ggml_weighted import SUPPORTED, weighted_encode
    from workbench.schemes.ggml.iq4_xs import IQ4_XS
    assert "iq4_xs" in SUPPORTED
    rng = np.random.default_rng(22)
    w = (rng.standard_normal((6, 512)) * 0.1).astype(np.float32)
    qw = np.broadcast_to(rng.lognormal(0, 1, 512).astype(np.float32), w.shape)
    ref, wref = S.quantize(w), _weighted_ref(w, qw)

    def boom(self, x, qw=None):
        raise AssertionError("the numpy IQ4_XS encoder ran")
    monkeypatch.setattr(IQ4_XS, "encode", boom)
    assert same_qt(quantize(w, "iq4_xs"), ref)
    assert np.array_equal(weighted_encode(S, w, qw).reshape(w.shape[0], -1), wref)

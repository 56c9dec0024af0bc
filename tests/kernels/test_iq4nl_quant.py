"""The IQ4_NL quantize kernel (kernels/iq4nl_quant.py) against its numpy reference
(workbench.schemes.ggml.iq4_nl + search.codebook_search): the same bytes on ordinary, edge and
hostile weights, the same refusals, and the quantize paths (evaluate, export) use it."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.quant import accel
from workbench.core.errors import WorkbenchError
from workbench.schemes import get_scheme

from kernel_testutil import same_qt, weights

S = get_scheme("iq4_nl")


def _kernel_bytes(w):
    from kernels import iq4nl_quant
    w = np.ascontiguousarray(w, np.float32)
    blocks = np.empty((w.shape[0], w.shape[1] // 32 * 18), np.uint8)
    flags = np.empty(w.shape[0], np.uint8)
    iq4nl_quant.encode_blocks(w, blocks, flags)
    return blocks, flags


def test_iq4_nl_has_a_quantize_kernel():
    assert accel.has_kernel("iq4_nl", "quantize", "cpu")


@pytest.mark.parametrize("cols", [32, 64, 96, 128, 160, 416, 1536])
def test_same_bytes_as_reference_for_every_group_remainder(cols):
    """4 blocks are searched together: rows of 1..48 blocks (remainders 0..3) all match."""
    rng = np.random.default_rng(cols)
    w = (rng.standard_normal((5, cols)) * rng.uniform(1e-3, 30, (5, 1))).astype(np.float32)
    blocks, flags = _kernel_bytes(w)
    assert not flags.any()
    assert np.array_equal(blocks, S.quantize(w).arrays["blocks"])


def test_same_bytes_on_many_scales_and_distributions():
    rng = np.random.default_rng(11)
    rows = []
    for scale in (1e-30, 1e-12, 1e-6, 1e-3, 1.0, 7.0, 1e3, 1e6):
        rows.append(rng.standard_normal(256) * scale)
        rows.append(rng.laplace(size=256) * scale)
        rows.append(rng.uniform(-1, 1, 256) * scale)
        rows.append(np.abs(rng.standard_normal(256)) * scale)       # one-signed blocks
        rows.append(-np.abs(rng.standard_normal(256)) * scale)
    w = np.stack(rows).astype(np.float32)
    blocks, flags = _kernel_bytes(w)
    assert not flags.any()
    ref = S.quantize(w).arrays["blocks"]
    assert np.array_equal(blocks, ref), np.argwhere((blocks != ref).any(axis=1)).ravel()


def test_edge_blocks_same_bytes():
    """Zero and -0 blocks, constant blocks, one non-zero weight, exact codebook multiples
    (ties of the nearest-value search), float16-subnormal scales, float32 subnormal weights,
    a weight of largest |x| repeated with both signs."""
    from workbench.schemes.ggml.iq4_nl import KVALUES
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((8, 256)) * 0.02).astype(np.float32)
    w[0, :32] = 0.0
    w[0, 32:64] = -0.0
    w[0, 64:96] = 0.5
    w[0, 96:128] = -3.0
    w[1, :32] = 0.0
    w[1, 5] = 1e-3
    w[1, 32:64] = np.resize(KVALUES.astype(np.float32), 32) * np.float32(0.01)
    mids = (KVALUES[1:].astype(np.float32) + KVALUES[:-1]) / 2
    w[1, 64:96] = np.resize(np.concatenate([mids, [-127.0]]), 32).astype(np.float32) * np.float32(0.01)
    w[2, :64] *= np.float32(1e-6)                     # float16-subnormal block scales
    w[3, :64] = (rng.standard_normal(64) * 1e-40).astype(np.float32)   # float32 subnormals
    w[3, 64:96] = np.float32(1.4e-45)                 # the smallest subnormal everywhere
    w[4, :32] = rng.standard_normal(32).astype(np.float32)
    w[4, 3] = 2.0
    w[4, 9] = -2.0                                    # |max| tie: the first one is mx
    w[5, ::2] = 0.0
    w[6] = (rng.standard_normal(256) * 8000).astype(np.float32)   # near the float16 limit
    w[7, :32] = np.linspace(-1, 1, 32, dtype=np.float32)
    for rows in (slice(0, 8), slice(1, 2), slice(3, 4), slice(6, 8)):
        part = np.ascontiguousarray(w[rows])
        got = accel.quantize(S, part, backend="cpu")
        assert same_qt(got, S.quantize(part)), rows
        blocks, flags = _kernel_bytes(part)
        assert not flags.any(), rows                  # decided by the kernel, not the fallback
    assert not S.dequantize(S.quantize(np.ascontiguousarray(w[:1, :64]))).any()


def test_scale_overflow_refused_like_the_reference():
    w = weights((3, 64), seed=2)
    w[1, 7] = np.float32(3e7)                         # float16 d = 3e7/127 overflows
    blocks, flags = _kernel_bytes(w)
    assert flags[1] & 1 and not flags[0] and not flags[2]
    with pytest.raises(WorkbenchError) as ref:
        S.quantize(w)
    with pytest.raises(WorkbenchError) as got:
        accel.quantize(S, w, backend="cpu")
    assert str(got.value) == str(ref.value)
    assert "overflows" in str(got.value)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_refused_with_the_reference_count(bad):
    w = weights((4, 96), seed=4)
    w[2, 40] = bad
    w[3, 95] = bad
    w[0, 3] = np.finfo(np.float32).max / 4           # huge finite: not mistaken for Inf
    blocks, flags = _kernel_bytes(w)
    assert list(flags & 2) == [0, 0, 2, 2]
    with pytest.raises(WorkbenchError) as ref:
        S.quantize(w)
    with pytest.raises(WorkbenchError) as got:
        accel.quantize(S, w, backend="cpu")
    assert str(got.value) == str(ref.value) and "2 NaN/Inf" in str(got.value)


def test_reference_sums_in_index_order():
    """codebook_search's sums are sequential float32 sums (what the kernel reproduces): a
    block whose pairwise and sequential sums differ still gets the kernel's bytes."""
    from workbench.schemes.ggml.search import _seqsum
    rng = np.random.default_rng(9)
    a = rng.standard_normal((2000, 32)).astype(np.float32)
    b = rng.standard_normal((2000, 32)).astype(np.float32)
    seq = _seqsum(a, b)
    want = np.zeros(2000, np.float32)
    for j in range(32):
        want = want + a[:, j] * b[:, j] if j else a[:, 0] * b[:, 0]
    assert np.array_equal(seq, want)
    assert not np.array_equal(seq, np.einsum("ij,ij->i", a, b))   # the orders do differ
    w = (rng.standard_normal((64, 256)) * 0.05).astype(np.float32)
    assert np.array_equal(_kernel_bytes(w)[0], S.quantize(w).arrays["blocks"])


def test_evaluate_and_export_quantize_use_the_kernel(monkeypatch):
    """evaluate.quantize (which the GGUF exporter calls per row chunk) never runs the numpy
    encoder for IQ4_NL, and gives its bytes."""
    from workbench.quant.evaluate import quantize
    from workbench.schemes.ggml.iq4_nl import IQ4_NL
    w = weights((8, 256), seed=6)
    ref = S.quantize(w)

    def boom(self, x):
        raise AssertionError("the numpy IQ4_NL encoder ran")
    monkeypatch.setattr(IQ4_NL, "encode", boom)
    assert same_qt(quantize(w, "iq4_nl"), ref)


def _weighted_ref(w, qw):
    """The numpy reference of the importance-weighted encoding, packed rows."""
    x = w.reshape(-1, 32)
    enc = S.encode(x, np.ascontiguousarray(qw, np.float32).reshape(-1, 32))
    return enc.view(np.uint8).reshape(w.shape[0], -1)


def test_weighted_same_bytes_as_reference():
    """qw * sqrt(2 sum(x^2)/32 + x^2) weights: per-column importance with dead columns,
    per-row importance, a block whose importance is all zero, edge blocks."""
    rng = np.random.default_rng(21)
    w = (rng.standard_normal((12, 416)) * rng.uniform(1e-4, 5, (12, 1))).astype(np.float32)
    w[0, :32] = 0.0
    w[1, :64] *= np.float32(1e-6)
    w[2, 32:64] = np.float32(0.25)
    qcol = rng.lognormal(0.0, 1.5, 416).astype(np.float32)
    qcol[::9] = 0.0
    qcol[64:96] = 0.0                                 # a whole block without importance
    qrow = rng.lognormal(0.0, 1.0, w.shape).astype(np.float32)
    for qw in (np.broadcast_to(qcol, w.shape), qrow):
        want = _weighted_ref(w, qw)
        blocks, flags = _kernel_bytes_weighted(w, qw)
        assert not flags.any()
        assert np.array_equal(blocks, want)
    # the importance changes the result (the weighted path is not the plain one)
    assert not np.array_equal(_kernel_bytes_weighted(w, qrow)[0], _kernel_bytes(w)[0])


def _kernel_bytes_weighted(w, qw):
    from kernels import iq4nl_quant
    blocks = np.empty((w.shape[0], w.shape[1] // 32 * 18), np.uint8)
    flags = np.empty(w.shape[0], np.uint8)
    iq4nl_quant.encode_blocks(np.ascontiguousarray(w), blocks, flags, np.ascontiguousarray(qw))
    return blocks, flags


def test_weighted_encode_runs_the_kernel_and_matches(monkeypatch):
    """methods.ggml_weighted (the imatrix method) takes IQ4_NL through the kernel, for block
    counts that do and do not divide into 64-block rows."""
    from workbench.quant.methods.ggml_weighted import SUPPORTED, weighted_encode
    from workbench.schemes.ggml.iq4_nl import IQ4_NL
    assert "iq4_nl" in SUPPORTED
    rng = np.random.default_rng(22)
    cases = []
    for shape in ((6, 256), (3, 96), (1, 32)):
        w = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        qw = np.broadcast_to(rng.lognormal(0, 1, shape[1]).astype(np.float32), shape)
        cases.append((w, qw, _weighted_ref(w, qw)))

    def boom(self, x, qw=None):
        raise AssertionError("the numpy IQ4_NL encoder ran")
    monkeypatch.setattr(IQ4_NL, "encode", boom)
    for w, qw, want in cases:
        got = weighted_encode(S, w, qw).reshape(w.shape[0], -1)
        assert np.array_equal(got, want), w.shape

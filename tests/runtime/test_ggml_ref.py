"""ggml's own C quantizers/dequantizers (kernels.ggml_ref, ctypes over the built libggml-base)
against the workbench's: the same bytes for the round-to-nearest types, and for every type
ggml's to_float of the workbench's bytes equals the workbench's decode bit for bit."""

from __future__ import annotations

import numpy as np
import pytest


from workbench.quant import accel
from kernels import ggml_ref
from workbench.quant.evaluate import quantize

ALL = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl"]


@pytest.fixture(scope="module")
def ggml(llama_bin):
    if not ggml_ref.available():
        pytest.fail(f"libggml-base not found under {ggml_ref.cache_dir()}")
    return ggml_ref


def _mat(seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((24, 512)).astype(np.float32)
    w[3] *= 1e-3
    w[5, :32] = 0.0
    w[7, 100] = 40.0                                     # an outlier
    return w


@pytest.mark.parametrize("ty", ALL)
def test_ggml_decodes_our_bytes_exactly(ggml, ty):
    w = _mat()
    qt = quantize(w, ty)
    raw = next(iter(qt.arrays.values())).view(np.uint8).reshape(w.shape[0], -1)
    assert raw.shape[1] == ggml.row_bytes(ty, w.shape[1])
    theirs = ggml.dequantize(ty, raw, w.shape[1])
    ours = accel.dequantize(qt, backend="cpu").reshape(w.shape)
    assert np.array_equal(theirs.view(np.uint32), ours.view(np.uint32))


@pytest.mark.parametrize("ty", ["q4_0", "q5_0", "q8_0"])
def test_round_to_nearest_types_give_ggmls_bytes(ggml, ty):
    w = _mat(1)
    qt = quantize(w, ty)
    ours = next(iter(qt.arrays.values())).view(np.uint8).reshape(w.shape[0], -1)
    assert np.array_equal(ours, ggml.quantize(ty, w))


def test_ggml_quantize_checks_its_arguments(ggml):
    with pytest.raises(ValueError, match="multiple of 256"):
        ggml.quantize("q4_k", np.zeros((2, 384), np.float32))
    with pytest.raises(ValueError, match="imatrix has 3 values"):
        ggml.quantize("q4_k", np.zeros((2, 256), np.float32), imatrix=np.ones(3))
    with pytest.raises(ValueError, match="unknown GGML type"):
        ggml.type_id("q9_z")


@pytest.mark.parametrize("ty", ["q2_k", "q4_k", "q5_k"])
def test_importance_weighted_k_quants_beat_ggmls_imatrix_quantization(ggml, minilm, ty):
    """Given the same per-column importance, the workbench's weighted Q2_K/Q4_K/Q5_K search
    (methods.ggml_weighted) has <= 0.97x the importance-weighted error of ggml's imatrix
    quantization on a real MiniLM FFN-down matrix (measured 0.927 / 0.956 / 0.918), and ggml
    decodes those bytes exactly as the workbench does."""
    from workbench.quant.methods.ggml_weighted import weighted_encode
    from workbench.schemes import get_scheme
    w = np.ascontiguousarray(minilm.read_matrix("encoder.layer.0.output.dense.weight"),
                             np.float32)
    qv = np.random.default_rng(0).lognormal(0.0, 1.5, w.shape[1]).astype(np.float32)
    s = get_scheme(ty)
    raw = weighted_encode(s, w, np.broadcast_to(qv, w.shape)).reshape(w.shape[0], -1)
    ours = ggml.dequantize(ty, raw, w.shape[1])
    mine = s.decode(raw.reshape(-1).view(s.block_dtype)).reshape(w.shape)
    assert np.array_equal(ours.view(np.uint32), mine.view(np.uint32))
    theirs = ggml.dequantize(ty, ggml.quantize(ty, w, imatrix=qv), w.shape[1])
    x = w.astype(np.float64)
    ratio = np.sqrt((qv * (x - ours) ** 2).sum() / (qv * (x - theirs) ** 2).sum())
    assert ratio <= 0.97, ratio
    # the importance matters: the unweighted encoding is worse on the weighted error
    plain = ggml.dequantize(ty, next(iter(quantize(w, ty).arrays.values())).view(np.uint8)
                            .reshape(w.shape[0], -1), w.shape[1])
    assert (qv * (x - ours) ** 2).sum() < (qv * (x - plain) ** 2).sum()


def test_ggml_dequantize_into_a_given_array(ggml):
    w = _mat(2)
    raw = ggml.quantize("q5_k", w)
    out = np.full(w.shape, np.nan, np.float32)
    assert ggml.dequantize("q5_k", raw, w.shape[1], out=out) is out
    assert np.array_equal(out, ggml.dequantize("q5_k", raw, w.shape[1]))
    with pytest.raises(ValueError, match="C-contiguous float32"):
        ggml.dequantize("q5_k", raw, w.shape[1], out=np.empty(w.shape, np.float64))


def test_vs_ggml_times_the_decoders_into_arrays_allocated_once(ggml):
    """bench --vs-ggml: dequantize figures into preallocated arrays, and the fresh-array ratio."""
    from types import SimpleNamespace

    from workbench.bench.ggml import format_table, run_vs_ggml
    mats = {"a": _mat(3), "b": _mat(4)[:, :256]}
    model = SimpleNamespace(
        path="tiny", tensors=list(mats),
        info=lambda n: SimpleNamespace(shape=mats[n].shape, dtype="F32"),
        read_matrix=lambda n: mats[n])
    rep = run_vs_ggml(model, types=("q5_k",), threads=1, repeats=1)
    (row,) = rep["rows"]
    assert row["tensors"] == 2
    for k in ("deq_ratio_1t", "deq_ratio_nt", "deq_ratio_1t_fresh", "quant_ratio_1t",
              "quant_ratio_1t_cpu"):
        assert row[k] > 0
    text = format_table(rep)
    assert "fresh x" in text and "cpu x" in text and "q5_k" in text

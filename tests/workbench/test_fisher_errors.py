"""The fisher measure's per-scheme errors (workbench.planning.sensitivity.fisher_errors): a tall tensor's
errors under row-local schemes come from a proportional sample of its rows and track the exact
sums; candidates a runtime maps to one scheme are measured once."""

import numpy as np
import pytest

from workbench.planning import fisher as F
from workbench.planning import sensitivity as S
from workbench.formats.loaders import open_model
from workbench.core.progress import run

safetensors_numpy = pytest.importorskip("safetensors.numpy")

SCHEMES = ["q2_k", "q3_k", "q4_0", "q4_k", "q5_1", "q6_k", "q8_0", "iq4_nl"]


def _model(tmp_path, rows=3000, cols=256, seed=0):
    rng = np.random.default_rng(seed)
    tall = rng.standard_normal((rows, cols)).astype(np.float32)
    tall[rng.integers(0, rows, 40)] *= 6            # a few rows carry much of the error
    tall[:, 7] *= 4                                 # and one input channel
    small = rng.standard_normal((512, cols)).astype(np.float32)
    path = tmp_path / "m.safetensors"
    safetensors_numpy.save_file({"tall.weight": tall, "small.weight": small}, str(path))
    # a Fisher diagonal with heavy tails along rows and columns, like a real model's
    f_row = rng.lognormal(0, 1.5, (rows, 1))
    f_col = rng.lognormal(0, 1.0, (1, cols))
    diag = {"tall.weight": (f_row * f_col).astype(np.float32),
            "small.weight": rng.lognormal(0, 1, (512, cols)).astype(np.float32)}
    return open_model(path), diag


def test_sampled_rows_track_the_exact_errors(tmp_path):
    model, diag = _model(tmp_path)
    exact = run(F.fisher_errors(model, SCHEMES, diag, 10, rows_sampled=False))
    sampled = run(F.fisher_errors(model, SCHEMES, diag, 10))
    for s in SCHEMES:
        # the small tensor (no more than ERROR_ROWS_MIN rows) is measured on every row
        assert sampled[("small.weight", s)] == exact[("small.weight", s)]
        rel = sampled[("tall.weight", s)] / exact[("tall.weight", s)] - 1
        assert abs(rel) < 0.05, (s, rel)
        assert sampled[("tall.weight", s)] != exact[("tall.weight", s)]   # it did sample
    # what decides the allocation, one scheme's error against another's, much closer still
    for a, b in [("q4_0", "q4_k"), ("q5_1", "q6_k"), ("q3_k", "iq4_nl")]:
        r_s = sampled[("tall.weight", a)] / sampled[("tall.weight", b)]
        r_e = exact[("tall.weight", a)] / exact[("tall.weight", b)]
        assert abs(r_s / r_e - 1) < 0.02, (a, b, r_s, r_e)


def test_sampling_draws_rows_by_their_error_share(tmp_path):
    model, diag = _model(tmp_path)
    wm = model.read_matrix("tall.weight")
    idx, fs, ws = F._error_rows(diag["tall.weight"], wm)
    assert len(idx) == wm.shape[0] // F.ERROR_ROW_FRACTION
    assert np.array_equal(ws, wm[idx])
    share = np.einsum("ij,ij,ij->i", diag["tall.weight"], wm, wm)
    top = np.argsort(share)[-20:]                   # the heaviest rows are always drawn
    assert set(top) <= set(idx.tolist())
    assert F._error_rows(diag["small.weight"], model.read_matrix("small.weight")) is None


def test_a_runtimes_fallbacks_are_measured_once(tmp_path, monkeypatch):
    """llama.cpp stores a K-quant of a tensor whose rows are not a multiple of 256 as its
    fallback (q4_k -> q5_0, q6_k -> q8_0): those candidates share one measurement."""
    model, diag = _model(tmp_path, rows=512, cols=96)
    calls = []
    real = F._fisher_error

    def counting(model, n, info, applied, *a):
        calls.append((n, applied))
        return real(model, n, info, applied, *a)
    monkeypatch.setattr(F, "_fisher_error", counting)
    out = run(F.fisher_errors(model, ["q4_k", "q5_0", "q6_k", "q8_0"], diag, 1,
                              runtime="llama.cpp"))
    assert out[("tall.weight", "q4_k")] == out[("tall.weight", "q5_0")] > 0
    assert out[("tall.weight", "q6_k")] == out[("tall.weight", "q8_0")] > 0
    assert out[("tall.weight", "q4_k")] > out[("tall.weight", "q8_0")]
    assert sorted(calls) == sorted((n, s) for n in ("small.weight", "tall.weight")
                                   for s in ("q5_0", "q8_0"))


def test_errors_measured_during_the_pass_equal_those_measured_after(tiny_arch, monkeypatch):
    """The fisher table's errors come partly from a worker thread fed block by block during
    the output-gradient pass (EarlyFisherErrors): the same values as measuring every tensor
    after the pass, and the blocks' tensors are among those measured early."""
    folder = tiny_arch("llama")
    model = open_model(str(folder))
    schemes = ["q4_0", "q8_0", "int4-g32"]
    early = F.EarlyFisherErrors(model, schemes)
    try:
        diag, count = run(F.fisher_diagonals(model, samples=6, max_len=24, batch_size=4,
                                             early=early))
        during = run(F.fisher_errors(model, schemes, diag, count, early=early))
    finally:
        early.close()
    measured_early = {n for n, _ in early.pending()}
    assert any(".layers.0." in n for n in measured_early)
    assert any(".layers.1." in n for n in measured_early)
    after = run(F.fisher_errors(model, schemes, diag, count))
    assert during == after
    assert sum(v > 0 for v in after.values()) >= len(measured_early) * len(schemes) // 2


def test_the_objective_says_its_unit(tiny_arch, tmp_path, capsys):
    """On a causal LM the fisher total is a predicted mean KL per token (check's kl_mean), on
    an encoder a predicted 1 - cosine; weight and activation totals have no output units.
    allocate and frontier say so in their text and JSON (predicted_unit)."""
    import json

    from workbench.cli import main
    llama, bert = tiny_arch("llama"), tiny_arch("bert")
    assert S.predicted_unit(open_model(str(llama)), "fisher") == "kl"
    assert S.predicted_unit(open_model(str(bert)), "output") == "1-cosine"
    assert S.predicted_unit(open_model(str(llama)), "weight") == "sensitivity"
    assert main(["allocate", str(llama), "--budget-bpw", "5", "--samples", "4",
                 "--methods", "rtn", "-o", str(tmp_path / "p.json")]) == 0
    out = capsys.readouterr().out
    assert "predicted KL divergence" in out and "nats/token" in out, out
    assert main(["frontier", str(llama), "--points", "2", "--samples", "4", "--recipes", "",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["predicted_unit"] == "kl"


def test_a_tensor_read_in_chunks_draws_the_same_rows(tmp_path, monkeypatch):
    """Above the streaming size the rows are scored and gathered a chunk at a time: the same
    rows, weights and F as from the whole tensor, so the same errors for every scheme,
    per-tensor scales (found from the chunks) included."""
    from workbench.quant import streaming
    model, diag = _model(tmp_path)
    f = diag["tall.weight"]
    idx, fs, ws = F._error_rows(f, model.read_matrix("tall.weight"))
    monkeypatch.setattr(streaming, "CHUNK_ELEMENTS", 256 * 37)
    idx2, fs2, ws2 = F._error_rows_chunked(model, "tall.weight", f)
    assert np.array_equal(idx, idx2) and np.array_equal(fs, fs2) and np.array_equal(ws, ws2)
    schemes = SCHEMES + ["int4-tensor", "int8-tensor-asym"]
    whole = run(F.fisher_errors(model, schemes, diag, 10))
    monkeypatch.setattr(streaming, "STREAM_ELEMENTS", 1)
    read = []
    real = model.read_matrix
    monkeypatch.setattr(model, "read_matrix", lambda n: read.append(n) or real(n))
    chunked = run(F.fisher_errors(model, schemes, diag, 10))
    assert "tall.weight" not in read                     # never read whole
    for s in schemes:
        assert chunked[("tall.weight", s)] > 0
        assert chunked[("tall.weight", s)] == pytest.approx(whole[("tall.weight", s)], rel=1e-9), s


def test_float_cast_errors_equal_casting_and_weighing(tmp_path, monkeypatch):
    # fp16 / bf16 errors come from one fused pass (kernels.stats_kernels.cast_sq_err): the
    # float64 sums of casting, widening back and weighing, and the scheme's own path
    # (with its overflow refusal) where a weight does not fit
    model, diag = _model(tmp_path)
    fused = run(F.fisher_errors(model, ["fp16", "bf16", "q8_0"], diag, 10, rows_sampled=False))
    monkeypatch.setattr(F, "_cast_error", lambda *a: None)
    plain = run(F.fisher_errors(model, ["fp16", "bf16", "q8_0"], diag, 10, rows_sampled=False))
    assert fused.keys() == plain.keys()
    for k, v in plain.items():        # (the sums' order differs: float64 rounding apart)
        assert fused[k] == pytest.approx(v, rel=1e-12, abs=0)
    assert 0 < fused[("tall.weight", "fp16")] < fused[("tall.weight", "bf16")] \
        < fused[("tall.weight", "q8_0")]


def test_cast_error_kernel_rounds_as_numpy_does():
    from kernels.stats_kernels import cast_sq_err
    from workbench.core.floatbits import bf16_to_f32, f32_to_bf16
    rng = np.random.default_rng(3)
    # float16's subnormals, its normal boundary, ties at both precisions, the overflow edge
    edge = np.array([0.0, -0.0, 1e-8, 2.9802322e-08, 5.96e-8, 6.09e-5, 6.103515625e-05,
                     1.00048828125, 1.000244140625, 1.0009765625, 2 ** -24 * 2.5,
                     -2 ** -24 * 2.5, 2 ** -25, 65504.0, 65519.99, -65519.99], np.float32)
    vals = np.concatenate([edge, (rng.standard_normal(20000)
                                  * np.exp(rng.uniform(-25, 11, 20000))).astype(np.float32)])
    vals = vals[np.abs(vals) < 65519.99].reshape(-1, 1)
    f = np.ones_like(vals)
    for kind, cast in (("fp16", vals.astype(np.float16).astype(np.float32)),
                       ("bf16", bf16_to_f32(f32_to_bf16(vals)))):
        for i in range(0, len(vals), 997):          # element by element on a sample
            ref = float((np.float64(cast[i, 0]) - np.float64(vals[i, 0])) ** 2)
            assert cast_sq_err(f[i:i + 1], vals[i:i + 1], kind) == ref
        want = float(np.sum((cast.astype(np.float64) - vals) ** 2))
        assert cast_sq_err(f, vals, kind) == pytest.approx(want, rel=1e-12)
    one = np.ones((1, 2), np.float32)
    assert cast_sq_err(one, np.array([[1.0, 65520.0]], np.float32), "fp16") is None
    assert cast_sq_err(one, np.array([[1.0, 3.4e38]], np.float32), "bf16") is None
    assert cast_sq_err(one, np.array([[1.0, np.nan]], np.float32), "fp16") is None

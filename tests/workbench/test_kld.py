"""`check` on a causal LM as `llama-perplexity --kl-divergence` scores it (workbench.running.kld): the
text as one stream in chunks of --ctx tokens, each scored on its second half; the float model's
next-token distributions cached on disk, sparse (top-64, 64 ids drawn from the rest, the
remaining mass)."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("transformers")

from workbench.cli import main  # noqa: E402
from workbench.core.errors import WorkbenchError  # noqa: E402
from workbench.running.kld import (kld_check, make_chunks, median, percentile,  # noqa: E402
                           scored_positions, text_stream)
from workbench.formats.loaders import open_model  # noqa: E402
from workbench.quant.plan import KEEP, Plan  # noqa: E402
from workbench.core.progress import run  # noqa: E402

from tests.tiny_archs import DEMO  # noqa: E402

CTX = 64


@pytest.fixture(autouse=True)
def kld_cache(tmp_path, monkeypatch):
    d = tmp_path / "kld-cache"
    monkeypatch.setenv("QUANT_WORKBENCH_KLD_CACHE", str(d))
    return d


def test_chunks_replace_the_first_token_by_bos_and_drop_the_tail():
    ids = np.arange(1, 26)
    g = make_chunks(ids, 8, bos=0)
    assert g.shape == (3, 8)
    assert g[:, 0].tolist() == [0, 0, 0] and g[1, 1:].tolist() == list(range(10, 17))
    assert make_chunks(ids, 8, None)[2, 0] == 17
    assert make_chunks(ids, 8, None, max_chunks=2).shape == (2, 8)
    assert list(scored_positions(512)) == list(range(256, 511))      # 255 scored tokens


def test_percentiles_as_llama_perplexity():
    v = np.sort(np.random.default_rng(0).gamma(0.3, size=1001))
    assert percentile(v, 0.999) == pytest.approx(np.percentile(v, 99.9), rel=1e-12)
    assert percentile(v, 0.99) == pytest.approx(np.percentile(v, 99), rel=1e-12)
    assert median(v) == np.median(v) and median(v[:-1]) == np.median(v[:-1])


def test_second_half_of_each_chunk_is_scored(tiny_arch):
    """ppl_base equals the float model's perplexity, run by transformers itself, over positions
    ctx/2 .. ctx-2 of each chunk predicting the next token; chunks * (ctx - 1 - ctx/2) tokens."""
    import torch
    import transformers
    folder = tiny_arch("llama")
    model = open_model(str(folder))
    res = run(kld_check(model, Plan(default="q4_0"), ctx=CTX, chunks=5))
    k = res["kld"]
    assert (k["chunks"], k["ctx"]) == (5, CTX)
    assert k["tokens"] == res["tokens"] == 5 * (CTX - 1 - CTX // 2)
    ids, bos = text_stream(model, None)
    grid = make_chunks(ids, CTX, bos, 5)
    net = transformers.AutoModelForCausalLM.from_pretrained(str(folder),
                                                            torch_dtype=torch.float32).eval()
    with torch.no_grad():
        lp = torch.log_softmax(net(torch.from_numpy(grid)).logits.double(), -1)
    first = CTX // 2
    nll = -lp[:, first:CTX - 1].gather(-1, torch.from_numpy(grid[:, first + 1:])[..., None])
    assert k["ppl_base"] == pytest.approx(float(torch.exp(nll.mean())), rel=1e-4)
    assert 0 < k["mean"] and k["ppl_ratio"] == pytest.approx(k["ppl_quant"] / k["ppl_base"])
    assert k["median"] <= k["p99"] <= k["p999"] <= k["max"]


def test_model_against_itself_is_zero_and_the_cache_is_hit(kld_cache):
    model = open_model(str(DEMO))
    first = run(kld_check(model, Plan(default=KEEP), ctx=CTX, chunks=4))
    k = first["kld"]
    assert k["cache"] == "written" and k["same_top1"] == 100.0
    assert k["mean"] < 1e-9 and k["max"] < 1e-7 and k["ppl_ratio"] == pytest.approx(1, abs=1e-6)
    q = run(kld_check(model, Plan(default="q4_0"), ctx=CTX, chunks=4))
    assert q["kld"]["cache"] == "hit" and q["kld"]["mean"] > 1e-4
    assert q["kld"]["ppl_base"] == k["ppl_base"]
    files = list(kld_cache.glob("*.safetensors"))
    assert len(files) == 1 and files[0].stat().st_size < 4 * 31 * 1100
    # a fresh computation of the same plan gives the cached run's figures exactly
    fresh = run(kld_check(model, Plan(default="q4_0"), ctx=CTX, chunks=4, use_cache=False))
    drop = ("cache", "seconds")
    assert {a: b for a, b in fresh["kld"].items() if a not in drop} == \
        {a: b for a, b in q["kld"].items() if a not in drop}
    # a corrupt entry is ignored and rewritten
    files[0].write_bytes(b"\x00garbage" * 10)
    again = run(kld_check(model, Plan(default="q4_0"), ctx=CTX, chunks=4))
    assert again["kld"]["cache"] == "written" and again["kld"]["mean"] == q["kld"]["mean"]
    assert run(kld_check(model, Plan(default="q4_0"), ctx=CTX, chunks=4))["kld"]["cache"] == "hit"


def test_sparse_base_is_close_to_the_full_distribution():
    """The trained demo model (vocab 512), q4_0: the KLD from the sparse base (top-64, 64 ids
    drawn from the rest) is within 1% of the KLD against the full float distribution; the
    top-64 with the rest merged into one outcome alone is a lower bound, further off."""
    model = open_model(str(DEMO))
    res = run(kld_check(model, Plan(default="q4_0"), ctx=CTX, chunks=8, exact=True))
    full = res["kld_full"]
    assert abs(full["sparse_error_rel"]) <= 0.01
    assert res["kld"]["p999"] == pytest.approx(full["p999"], rel=0.02)
    merged = run(kld_check(model, Plan(default="q4_0"), ctx=CTX, chunks=8, exact=True,
                           tail_samples=0))
    assert 0 < merged["kld_full"]["sparse_error_rel"] and merged["kld"]["tail_samples"] == 0
    assert abs(full["sparse_error_rel"]) < merged["kld_full"]["sparse_error_rel"]


def test_cli_check_reports_llama_perplexity_figures(capsys, monkeypatch):
    monkeypatch.setenv("QUANT_WORKBENCH_PROGRESS_EVERY", "0.01")   # progress lines at once
    args = ["check", str(DEMO), "--scheme", "q8_0", "--ctx", str(CTX), "--chunks", "3"]
    assert main([*args, "--json"]) == 0
    cap = capsys.readouterr()
    res = json.loads(cap.out)
    assert set(res["kld"]) >= {"ppl_base", "ppl_quant", "ppl_ratio", "mean", "median", "p99",
                               "p999", "same_top1", "tokens", "chunks", "ctx"}
    assert res["kld"]["chunks"] == 3 and res["kld"]["tokens"] == 3 * 31
    # no tty: progress lines on stderr, the blocks' and the end's among them (the network is
    # built in under 0.01 s when an earlier test left it cached, so its line may not show)
    assert "check: 100.0% done" in cap.err and "float and quantized: block" in cap.err
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "Mean PPL(Q)/PPL(base)" in out and "Same top p" in out and "from the cache" in out


def test_short_text_is_one_shorter_chunk_and_too_long_ctx_is_refused(tmp_path, capsys):
    short = tmp_path / "short.txt"
    short.write_text("The quick brown fox jumps over the lazy dog. " * 3)
    assert main(["check", str(DEMO), "--scheme", "q8_0", "--held-out", str(short), "--json"]) == 0
    k = json.loads(capsys.readouterr().out)["kld"]
    assert k["chunks"] == 1 and k["ctx"] < 512 and "one chunk" in k["note"]
    assert main(["check", str(DEMO), "--scheme", "q8_0", "--ctx", "4096"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        ": --ctx 4096 is longer than the model's 512 positions (config.json): choose a "
        "smaller --ctx")


def test_the_api_refuses_a_long_ctx_in_its_own_terms():
    import workbench as qw
    model = qw.open_model(DEMO)
    with pytest.raises(WorkbenchError, match=r": ctx=4096 is longer than the model's 512 "
                                             r"positions \(config.json\): choose a smaller "
                                             r"ctx=$"):
        qw.check_plan(model, "q8_0", ctx=4096, progress=False)

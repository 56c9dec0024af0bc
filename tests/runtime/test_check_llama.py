"""`check --runtime llama.cpp` on the demo causal LM: the plan's GGUF judged by
llama-perplexity --kl-divergence against an F16 export (tiny text, --ctx 64)."""

from __future__ import annotations

import json
import os

import pytest

from .test_llama_kld_runtime import CTX, DEMO, _cli, text, tools  # noqa: F401 (fixtures)

pytestmark = pytest.mark.runtime


def test_check_runtime_llama_cpp(tools, tmp_path, text):
    env = dict(os.environ)
    r = _cli("check", DEMO, "--scheme", "q4_0", "--runtime", "llama.cpp", "--held-out", text,
             "--ctx", CTX, "--json", "--save-gguf", tmp_path / "kept.gguf", env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout)
    k = res["kld"]
    assert res["runtime"] == "llama.cpp" and res["model_kind"] == "causal-lm"
    assert set(k) >= {"ppl_ratio", "mean", "median", "p99", "p999", "same_top1", "ppl_base",
                      "ppl_quant", "tokens", "chunks", "ctx"}
    assert (res["tokens"], res["chunks"], res["ctx"]) == (37 * 31, 37, CTX)
    assert 0.03 < k["mean"] < 0.5 and 70 < k["same_top1"] < 99.5
    assert res["bytes"] == (tmp_path / "kept.gguf").stat().st_size
    assert "export_f16" in res["seconds"]
    # the second check of the same model and text reuses the float model's logits
    r = _cli("check", DEMO, "--scheme", "q8_0", "--runtime", "llama.cpp", "--held-out", text,
             "--ctx", CTX, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "export_f16" not in r.stdout and "base cached" in r.stdout
    assert "KLD 99.9%" in r.stdout and "same top-1" in r.stdout

"""Exports checked by llama.cpp itself: llama-embedding on MiniLM (cosine to the float model),
llama-simple / llama-perplexity on the demo causal LM, llama-quantize on our F16 GGUF."""

from __future__ import annotations

import re

import gguf
import numpy as np
import pytest

from workbench.export import export
from workbench.formats.loaders import open_model
from workbench.quant.plan import Plan
from workbench.core.progress import run

from .conftest import ROOT, THREADS, llama_embeddings, perplexity, run_tool

pytestmark = pytest.mark.runtime

MIXED = Plan(default="q4_k", fallback="q8_0", rules=[
    {"match": "re:attention\\.self\\.value\\.weight$", "scheme": "q8_0"},
    {"match": "re:output\\.dense\\.weight$", "scheme": "q6_k"},
    {"match": "re:intermediate\\.dense\\.weight$", "scheme": "q4_0"},
    {"match": "embeddings.word_embeddings.weight", "scheme": "q8_0"},
    # llama.cpp never re-types these: the rules are skipped with a note
    {"match": "re:LayerNorm", "scheme": "q4_0"},
    {"match": "embeddings.token_type_embeddings.weight", "scheme": "q8_0"},
])

# (name, plan, minimum cosine of every sentence embedding to the float model's)
MINILM_CASES = [
    ("f16", Plan(default="fp16"), 0.9999),
    ("q8_0", Plan(default="q8_0"), 0.999),
    ("q4_0", Plan(default="q4_0"), 0.96),
    ("q4_k", Plan(default="q4_k"), 0.96),   # 384-wide rows fall back to q5_0, as llama-quantize
    ("mixed", MIXED, 0.96),
]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.parametrize("label,plan,min_cos", MINILM_CASES, ids=[c[0] for c in MINILM_CASES])
def test_minilm_hf_to_gguf_embeds_in_llama_cpp(llama_bin, minilm_folder, sentences,
                                               minilm_reference, tmp_path, label, plan, min_cos):
    model = open_model(minilm_folder)
    out = tmp_path / f"minilm-{label}.gguf"
    info = run(export(model, plan, "gguf", out))
    assert info["architecture"] == "bert" and info["runnable_by_llama_cpp"]
    reader = gguf.GGUFReader(str(out))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    # never re-typed by llama.cpp: whatever the plan says, they stay float
    for name in ("token_types.weight", "position_embd.weight", "token_embd_norm.weight",
                 "blk.0.attn_output_norm.weight", "blk.0.attn_q.bias"):
        assert types[name] in ("F32", "F16"), (name, types[name])
    emb = llama_embeddings(llama_bin, out, sentences[1])
    assert emb.shape == minilm_reference.shape
    cos = cosines(emb, minilm_reference)
    print(f"\nllama-embedding {label}: cosine mean {cos.mean():.5f} min {cos.min():.5f}, "
          f"{out.stat().st_size / 1e6:.2f} MB")         # the figures `pytest -s` reports
    assert cos.min() >= min_cos, (label, cos.min())
    if label == "q4_k":
        assert types["blk.0.attn_q.weight"] == "Q5_0"            # 384 % 256 != 0 -> Q5_0
        assert info["fallbacks"]["fallbacks"] == {"q4_k->q5_0": 31}
        assert types["blk.0.ffn_down.weight"] == "Q4_K"          # 1536-wide rows take Q4_K
    if label == "mixed":
        assert types["blk.0.attn_v.weight"] == "Q8_0"
        assert types["blk.0.ffn_up.weight"] == "Q4_0"
        assert types["blk.0.ffn_down.weight"] == "Q6_K"
        assert types["blk.0.attn_q.weight"] == "Q8_0"            # plan fallback, not q5_0
        # token types + the embeddings LayerNorm (w, b) + 2 LayerNorms (w, b) in each of 6 layers
        assert info["fallbacks"]["tensors"]["skipped"] == 1 + 2 + 6 * 4


def test_gguf_source_requantized_embeds(llama_bin, minilm_folder, sentences, minilm_reference,
                                        tmp_path):
    """HF -> our F16 GGUF -> (a GGUF source) -> our Q4_K GGUF: names and metadata carried."""
    f16 = tmp_path / "minilm-f16.gguf"
    run(export(open_model(minilm_folder), Plan(default="fp16"), "gguf", f16))
    q = tmp_path / "minilm-q4k-from-gguf.gguf"
    info = run(export(open_model(f16), Plan(default="q4_k"), "gguf", q))
    assert info["fallbacks"]["fallbacks"] == {"q4_k->q5_0": 31}
    cos = cosines(llama_embeddings(llama_bin, q, sentences[1]), minilm_reference)
    assert cos.min() >= 0.96


def test_llama_quantize_takes_our_f16_gguf(llama_bin, minilm_folder, sentences, minilm_reference,
                                           tmp_path):
    f16 = tmp_path / "minilm-f16.gguf"
    run(export(open_model(minilm_folder), Plan(default="fp16"), "gguf", f16))
    out = tmp_path / "minilm-lq-q4k.gguf"
    r = run_tool(llama_bin, "llama-quantize", f16, out, "Q4_K_M", THREADS)
    assert out.is_file()
    assert "falling back" in r.stdout + r.stderr      # llama-quantize says so, as we do
    cos = cosines(llama_embeddings(llama_bin, out, sentences[1]), minilm_reference)
    assert cos.min() >= 0.96


def _perplexity(llama_bin, path) -> float:
    return perplexity(llama_bin, path, ROOT / "resources" / "calibration.txt")


@pytest.fixture(scope="module")
def demo_ggufs(tmp_path_factory):
    d = tmp_path_factory.mktemp("demo")
    model = open_model(ROOT / "resources" / "demo_model")
    out = {}
    for label, plan in [("f16", Plan(default="fp16")), ("q8_0", Plan(default="q8_0")),
                        ("q4_k", Plan(default="q4_k")),
                        ("mixed", Plan(default="q4_k", rules=[
                            {"match": "re:down_proj", "scheme": "q6_k"},
                            {"match": "re:v_proj", "scheme": "q8_0"},
                            {"match": "model.embed_tokens.weight", "scheme": "q4_0"},
                            {"match": "re:norm", "scheme": "q8_0"}]))]:
        path = d / f"demo-{label}.gguf"
        info = run(export(model, plan, "gguf", path))
        assert info["architecture"] == "qwen2" and info["runnable_by_llama_cpp"]
        out[label] = path
    return out


@pytest.mark.parametrize("label", ["f16", "q8_0", "q4_k", "mixed"])
def test_demo_model_generates(llama_bin, demo_ggufs, label):
    r = run_tool(llama_bin, "llama-simple", "-m", demo_ggufs[label], "-n", "16",
                 "The engineer measured")
    m = re.search(r"decoded (\d+) tokens", r.stdout + r.stderr)
    assert m and int(m.group(1)) == 16, (r.stdout + r.stderr)[-1500:]


def test_demo_model_perplexity_finite_and_close(llama_bin, demo_ggufs):
    ppl = {k: _perplexity(llama_bin, p) for k, p in demo_ggufs.items()}
    assert all(np.isfinite(v) and v > 1 for v in ppl.values()), ppl
    # llama-perplexity reads the file as one text in windows across lines, which the demo model
    # (trained one line per sample) never saw: f16 178.3, q8_0 178.5, q4_k 174.1 (2026-11-26);
    # q8_0 must not move it more than 1%
    assert abs(ppl["q8_0"] - ppl["f16"]) / ppl["f16"] < 0.01, ppl
    assert abs(ppl["q4_k"] - ppl["f16"]) / ppl["f16"] < 0.10, ppl

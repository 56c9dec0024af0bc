"""Gemma 3's fp16 GGUF export run by llama.cpp on an input three times its sliding window.

A generated gemma3_text (tests/tiny_archs.py: hidden 256, sliding_window 64) with a
SentencePiece-style tokenizer (write_spm_tokenizer: byte fallback, U+2581 spaces, as
transformers writes Gemma's), exported at fp16, and a 200-token text:

* llama.cpp's tokens (llama-embedding --verbose-prompt) equal transformers' (the tokenizer is
  written as llama.cpp's ``llama`` model with scores, not as a BPE pre-tokenizer);
* every token's final hidden state (llama-embedding, pooling none) has cosine >= 0.999 with
  transformers' ``last_hidden_state``, for two configs: llama.cpp's own every-6th-global
  pattern on 6 layers, and alternating sliding/global ``layer_types`` on 4 layers with
  ``query_pre_attn_scalar`` (256) unlike head_dim (64). Without the exporter's per-layer
  pattern key the second gave a minimum cosine of 0.942 (0.9999998 on the first 64 tokens),
  without its query scale 0.955 from the second token on.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from workbench.export import export
from workbench.formats.loaders import open_model
from workbench.quant.plan import Plan
from workbench.core.progress import run

from tests.tiny_archs import ROOT, make_tiny, write_spm_tokenizer
from .conftest import THREADS, run_tool

pytestmark = pytest.mark.runtime

WINDOW = 64
N_TOKENS = 200
F16_COS = 0.999
SLIDE, FULL = "sliding_attention", "full_attention"
CONFIGS = {
    "every-6th": dict(num_hidden_layers=6),
    "alternating-qscale": dict(num_hidden_layers=4, layer_types=[SLIDE, FULL, SLIDE, FULL],
                               query_pre_attn_scalar=256),
}


def _text(tok) -> str:
    """The first N_TOKENS tokens of the calibration text, on one line (llama-embedding takes
    each line as its own prompt), with a few characters only byte fallback can encode."""
    words = (ROOT / "resources" / "calibration.txt").read_text(encoding="utf-8").split()
    text = "Costs 5 \u20ac or \U0001f680,  twice: " + " ".join(words)
    return tok.decode(tok(text).input_ids[1:N_TOKENS])


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def case(request, tmp_path_factory):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    if "gemma3_text" not in __import__("transformers").CONFIG_MAPPING:
        pytest.skip("transformers has no gemma3_text")
    d = tmp_path_factory.mktemp(f"gemma3-{request.param}")
    folder = d / "hf"
    folder.mkdir()
    n_vocab = write_spm_tokenizer(folder)
    make_tiny("gemma3_text", folder, overrides=dict(CONFIGS[request.param], vocab_size=n_vocab,
                                                    sliding_window=WINDOW, bos_token_id=2,
                                                    eos_token_id=1, pad_token_id=0),
              tokenizer=False)
    out = d / "f16.gguf"
    info = run(export(open_model(folder), Plan(default="fp16"), "gguf", out))
    assert info["runnable_by_llama_cpp"], info.get("not_runnable")
    tok = AutoTokenizer.from_pretrained(folder)
    text = _text(tok)
    ids = tok(text).input_ids
    lm = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = lm.base_model(torch.tensor([ids])).last_hidden_state[0].double().numpy()
    return request.param, out, text, ids, ref


def _llama(llama_bin, path, text):
    """(token ids, final hidden states (T, H)) from llama-embedding, pooling none."""
    r = run_tool(llama_bin, "llama-embedding", "-m", path, "-p", text, "--pooling", "none",
                 "--embd-normalize", "-1", "--embd-output-format", "json", "-t", THREADS, "-c",
                 "512", "--verbose-prompt")
    start = r.stdout.index("{")
    # --verbose-prompt prints "  ID -> 'piece'" per prompt token on stdout, before the JSON
    ids = [int(m) for m in re.findall(r"^\s*(\d+) -> '", r.stdout[:start], re.M)]
    data = json.loads(r.stdout[start:])
    return ids, np.array([d["embedding"] for d in data["data"]], dtype=np.float64)


def test_tokens_and_hidden_states_match_transformers_past_the_window(llama_bin, case):
    import gguf
    name, path, text, ids, ref = case
    assert len(ids) >= 3 * WINDOW
    r = gguf.GGUFReader(str(path))
    assert r.fields["tokenizer.ggml.model"].contents() == "llama"
    assert r.fields["gemma3.attention.sliding_window"].contents() == WINDOW
    pattern = r.fields.get("gemma3.attention.sliding_window_pattern")
    if name == "alternating-qscale":
        assert pattern is not None and pattern.contents() == [True, False, True, False]
    else:
        assert pattern is None     # llama.cpp's own every-6th pattern
    ours_ids, hidden = _llama(llama_bin, path, text)
    assert ours_ids[:len(ids)] == ids and len(ours_ids) == len(ids)
    assert hidden.shape == ref.shape
    cos = (hidden * ref).sum(1) / (np.linalg.norm(hidden, axis=1) * np.linalg.norm(ref, axis=1))
    assert cos.min() >= F16_COS, (name, cos.min(), int(cos.argmin()))

"""HF -> GGUF for each causal architecture the exporter converts, checked against transformers:
llama.cpp's greedy continuation (llama-simple) equals transformers' greedy `generate` on the
same weights. Qwen2 is the demo model; Llama, Mistral and GPT-2 are small random models built
with transformers here (weights scaled so the next token is never a near-tie), all with the
demo model's byte-level BPE tokenizer."""

from __future__ import annotations

import json
import shutil

import pytest

from workbench.export import export
from workbench.formats.loaders import open_model
from workbench.quant.plan import Plan
from workbench.core.progress import run

from .conftest import ROOT, run_tool

pytestmark = pytest.mark.runtime
PROMPT = "The engineer measured"
N = 16


def _random_model(arch: str, folder):
    import torch
    import transformers as tf
    torch.manual_seed(0)
    common = dict(vocab_size=512, bos_token_id=0, eos_token_id=0)
    if arch == "gpt2":
        cfg = tf.GPT2Config(n_embd=128, n_layer=2, n_head=4, n_positions=256, **common)
        model = tf.GPT2LMHeadModel(cfg)
    else:
        kw = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  rms_norm_eps=1e-6, tie_word_embeddings=False, **common)
        if arch == "llama":
            model = tf.LlamaForCausalLM(tf.LlamaConfig(attention_bias=True, **kw))
        else:
            model = tf.MistralForCausalLM(tf.MistralConfig(**kw))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2:
                p.normal_(0.0, 0.08)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.05)
    model.save_pretrained(folder, safe_serialization=True)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    out = {}
    for arch in ("qwen2", "llama", "mistral", "gpt2"):
        f = tmp_path_factory.mktemp(arch) / arch
        if arch == "qwen2":
            shutil.copytree(ROOT / "resources" / "demo_model", f)
        else:
            f.mkdir()
            _random_model(arch, f)
            for name in ("tokenizer.json", "tokenizer_config.json"):
                shutil.copy(ROOT / "resources" / "demo_model" / name, f / name)
        out[arch] = f
    return out


def _hf_greedy(folder) -> str:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = tok(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=N, min_new_tokens=N, do_sample=False)
    return tok.decode(out[0])


@pytest.mark.parametrize("arch", ["qwen2", "llama", "mistral", "gpt2"])
def test_greedy_continuation_matches_transformers(llama_bin, folders, tmp_path, arch):
    folder = folders[arch]
    out = tmp_path / f"{arch}.gguf"
    info = run(export(open_model(folder), Plan(default="fp32"), "gguf", out))
    assert info["runnable_by_llama_cpp"]
    assert info["architecture"] == {"mistral": "llama"}.get(arch, arch)
    r = run_tool(llama_bin, "llama-simple", "-m", out, "-n", N, PROMPT)
    ours = r.stdout.rstrip("\n")
    # llama-simple prints each piece with printf("%s"): a NUL byte token prints as nothing
    ref = _hf_greedy(folder).replace("\x00", "")
    assert ours == ref, (arch, ours, ref)
    assert len(ref) > len(PROMPT) + 4

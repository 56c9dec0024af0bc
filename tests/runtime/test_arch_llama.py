"""Every architecture's GGUF export run by the real llama.cpp, against transformers.

For the tiny model of each architecture (tests/tiny_archs.py, fixture `tiny_arch`):

* fp16 export: llama-simple's greedy continuation equals transformers' greedy `generate`
  (decoders), and llama-embedding's final hidden state of every prompt token (pooling none)
  has cosine >= 0.999 with transformers' `last_hidden_state`;
* q4_k export: llama.cpp loads and runs it; every token's hidden state keeps cosine >=
  Q4K_MIN_COS with transformers' float model, and the mean over tokens is within
  Q4K_VS_LLAMA of what llama.cpp's own quantizer gives (llama-quantize --pure Q4_K_S of the
  fp16 export, same prompt): random tiny models lose more to 4 bits than trained ones
  (measured 0.917-0.999 minimum, docs/architectures.md); for MoE models the file holds merged
  3-D Q4_K expert tensors and F32 routers;
* a MoE GGUF written by llama.cpp's own convert_hf_to_gguf.py re-typed here (GGUF->GGUF)
  runs in llama.cpp with its merged experts re-typed.

Exports are shared between the tests (one per architecture and scheme); prompts are a few
tokens, so the whole tier stays short.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from workbench.export import export
from workbench.formats.loaders import open_model
from workbench.quant.plan import Plan
from workbench.core.progress import run

from .conftest import THREADS, run_tool

pytestmark = pytest.mark.runtime

PROMPT = "The engineer measured the weights of every layer"
# MoE: a prompt whose routing has no near-tie. With 4 random experts, top-2 of 4 routing is
# sometimes decided by a probability gap of 1e-4 (qwen3_moe, PROMPT's last token, layer 0:
# 1.2e-4): fp16 weights flip such a choice, and that token's hidden state then differs (cos
# 0.985) while every other token's is 0.9999999. The first of these prompts whose prompt and
# greedy continuation keep every top-k gap >= MIN_ROUTING_GAP in transformers is used (the
# test fails if none does, never skips).
MOE_PROMPTS = [PROMPT, "The engineer measured", "Every layer of the model", "A small model"]
MIN_ROUTING_GAP = 2e-3
N = 12
F16_COS = 0.999
Q4K_MIN_COS = 0.90
Q4K_VS_LLAMA = 0.01
ARCHS = ["llama", "qwen2", "qwen3", "qwen3_moe", "mistral", "mixtral", "gemma2", "gemma3_text",
         "phi3", "deepseek_v3", "gpt2", "bert"]
ENCODERS = {"bert"}
MOE = {"qwen3_moe", "mixtral", "deepseek_v3"}
LLAMA_SRC = Path(os.environ.get("QW_LLAMA_CACHE", Path.home() / ".cache" / "quant-workbench")) \
    / f"llama-cpp-python-{os.environ.get('QW_LLAMA_VERSION', '0.3.36')}" / "src"


@pytest.fixture(scope="module")
def exported(tiny_arch, tmp_path_factory):
    """get(arch, scheme) -> the GGUF export of the tiny `arch` under Plan(default=scheme),
    written once per module."""
    d = tmp_path_factory.mktemp("arch-ggufs")
    cache: dict = {}

    def get(arch: str, scheme: str) -> Path:
        if (arch, scheme) not in cache:
            out = d / f"{arch}-{scheme}.gguf"
            info = run(export(open_model(tiny_arch(arch)), Plan(default=scheme), "gguf", out))
            assert info["runnable_by_llama_cpp"], info.get("not_runnable")
            cache[(arch, scheme)] = out
        return cache[(arch, scheme)]

    return get


@pytest.fixture(scope="module")
def reference(tiny_arch):
    """get(arch) -> transformers' (prompt, prompt token ids, last_hidden_state (T, H) float64,
    greedy text), computed once per architecture in float32."""
    cache: dict = {}

    def get(arch: str):
        if arch not in cache:
            cache[arch] = _hf_reference(tiny_arch(arch), arch in ENCODERS, arch in MOE)
        return cache[arch]

    return get


def _routing_gap(lm, ids) -> float | None:
    """The smallest gap, over tokens and layers, between the k-th and (k+1)-th router
    probabilities (softmax routers that report router logits; None for others)."""
    import torch
    k = getattr(lm.config, "num_experts_per_tok", None)
    try:
        with torch.no_grad():
            out = lm(ids, output_router_logits=True)
    except TypeError:
        return None
    logits = getattr(out, "router_logits", None)
    if not logits or k is None:
        return None
    gaps = []
    for r in logits:
        p = torch.softmax(r.float(), -1).sort(-1, descending=True).values
        gaps.append(float((p[:, k - 1] - p[:, k]).min()))
    return min(gaps)


def _hf_reference(folder: Path, encoder: bool, moe: bool):
    import torch
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        if encoder:
            base = AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
            ids = tok(PROMPT, return_tensors="pt").input_ids
            return PROMPT, ids[0].tolist(), base(ids).last_hidden_state[0].double().numpy(), None
        lm = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        gaps = []
        for prompt in (MOE_PROMPTS if moe else [PROMPT]):
            ids = tok(prompt, return_tensors="pt").input_ids
            out = lm.generate(ids, max_new_tokens=N, min_new_tokens=N, do_sample=False)
            gap = _routing_gap(lm, out) if moe else None
            gaps.append(gap)
            if gap is None or gap >= MIN_ROUTING_GAP:
                h = lm.base_model(ids).last_hidden_state[0]
                return prompt, ids[0].tolist(), h.double().numpy(), tok.decode(out[0])
    raise AssertionError(f"every prompt has a near-tie in routing: gaps {gaps}")


def _llama_hidden(llama_bin, gguf_path: Path, prompt: str) -> np.ndarray:
    """llama-embedding's final hidden state of every prompt token (pooling none), (T, H)."""
    r = run_tool(llama_bin, "llama-embedding", "-m", gguf_path, "-p", prompt, "--pooling",
                 "none", "--embd-normalize", "-1", "--embd-output-format", "json", "-t", THREADS,
                 "-c", "256")
    data = json.loads(r.stdout[r.stdout.index("{"):])
    return np.array([d["embedding"] for d in data["data"]], dtype=np.float64)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def _greedy(llama_bin, gguf_path: Path, prompt: str) -> str:
    r = run_tool(llama_bin, "llama-simple", "-m", gguf_path, "-n", N, prompt)
    # llama-simple prints each piece with printf("%s"): a NUL byte token prints as nothing
    return r.stdout.rstrip("\n")


@pytest.mark.parametrize("arch", ARCHS)
def test_f16_hidden_states_match_transformers(llama_bin, exported, reference, arch):
    prompt, ids, ref, _ = reference(arch)
    ours = _llama_hidden(llama_bin, exported(arch, "fp16"), prompt)
    cos = _cosines(ours, ref)
    assert cos.min() >= F16_COS, (arch, cos.round(5).tolist())


@pytest.mark.parametrize("arch", [a for a in ARCHS if a not in ENCODERS])
def test_f16_greedy_tokens_match_transformers(llama_bin, exported, reference, arch):
    prompt, _, _, text = reference(arch)
    ours = _greedy(llama_bin, exported(arch, "fp16"), prompt)
    assert ours == text.replace("\x00", ""), (arch, ours, text)
    assert len(text) > len(prompt) + 4


@pytest.mark.parametrize("arch", ARCHS)
def test_q4_k_runs_close_to_transformers(llama_bin, exported, reference, arch, tmp_path):
    import gguf
    path = exported(arch, "q4_k")
    prompt, ids, ref, _ = reference(arch)
    cos = _cosines(_llama_hidden(llama_bin, path, prompt), ref)
    theirs = tmp_path / "llama-quantize-q4_k_s.gguf"
    run_tool(llama_bin, "llama-quantize", "--pure", exported(arch, "fp16"), theirs, "Q4_K_S",
             THREADS)
    cos_llama = _cosines(_llama_hidden(llama_bin, theirs, prompt), ref)
    assert cos.min() >= Q4K_MIN_COS, (arch, cos.round(4).tolist())
    assert cos.mean() >= cos_llama.mean() - Q4K_VS_LLAMA, (arch, cos.mean(), cos_llama.mean())
    types = {t.name: (t.tensor_type.name, len(t.shape)) for t in gguf.GGUFReader(str(path)).tensors}
    assert "Q4_K" in {t for t, _ in types.values()}
    if arch in MOE:
        exps = {n: v for n, v in types.items() if "_exps." in n}
        assert exps and all(v == ("Q4_K", 3) for v in exps.values()), exps
        routers = {n: v for n, v in types.items() if "ffn_gate_inp" in n}
        assert routers and all(v == ("F32", 2) for v in routers.values()), routers


def test_converter_moe_gguf_retyped_runs(llama_bin, tiny_arch, reference, tmp_path):
    """GGUF->GGUF for a MoE GGUF written by llama.cpp's convert_hf_to_gguf.py: the workbench
    re-types its merged experts (Q4_K), keeps routers F32, and llama.cpp runs the result."""
    import gguf
    if not (LLAMA_SRC / "convert_hf_to_gguf.py").is_file():
        pytest.skip(f"no convert_hf_to_gguf.py in {LLAMA_SRC}")
    folder = tiny_arch("qwen3_moe")
    f16 = tmp_path / "converter-f16.gguf"
    # the converter names pre-tokenizers by a hash of known tokenizers' outputs; the demo
    # model's byte-level BPE (GPT-2's regex) is not among them, so it is told "gpt-2"
    code = ("import runpy, sys; sys.path[:0] = [sys.argv[1], sys.argv[1] + '/gguf-py']; "
            "import conversion.base as b; "
            "b.TextModel.get_vocab_base_pre = lambda self, tok: 'gpt-2'; "
            "sys.argv = [sys.argv[1] + '/convert_hf_to_gguf.py'] + sys.argv[2:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", code, str(LLAMA_SRC), str(folder), "--outtype",
                        "f16", "--outfile", str(f16)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    out = tmp_path / "retyped-q4_k.gguf"
    src = open_model(f16)
    assert src.info("blk.1.ffn_up_exps.weight").shape == (4, 256, 256)
    info = run(export(src, Plan(default="q4_k"), "gguf", out))
    assert info["architecture"] == "qwen3moe"
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(out)).tensors}
    assert types["blk.1.ffn_up_exps.weight"] == "Q4_K"
    assert types["blk.1.ffn_gate_inp.weight"] == "F32"
    prompt, ids, ref, _ = reference("qwen3_moe")
    cos = _cosines(_llama_hidden(llama_bin, out, prompt), ref)
    assert cos.min() >= Q4K_MIN_COS, cos.round(4).tolist()
    # the same plan as a llama-quantize --tensor-type-file (HF names mapped to the converter's,
    # one line per merged expert tensor): llama-quantize gives every tensor the same type
    types_file = tmp_path / "types.txt"
    run(export(open_model(folder), Plan(default="q4_k"), "llama-tensor-types", types_file))
    assert "ffn_up_exps" in types_file.read_text()
    theirs = tmp_path / "llama-quantize.gguf"
    run_tool(llama_bin, "llama-quantize", "--tensor-type-file", types_file, f16, theirs, "Q8_0",
             THREADS)
    assert {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(theirs)).tensors} == types

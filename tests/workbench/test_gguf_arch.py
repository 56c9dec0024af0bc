"""HF folder -> runnable GGUF for each architecture: llama.cpp's architecture name, the tensors
llama.cpp's loader asks for (gguf's MODEL_TENSORS of that architecture), merged 3-D expert
tensors holding exactly the experts' weights, float routers, DeepSeek's MLA split, Gemma's
norm + 1, and the refusals (experts given different schemes). The runtime tier
(tests/runtime/test_arch_llama.py) runs these files in llama.cpp."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from workbench.core.errors import WorkbenchError
from workbench.export import export
from workbench.formats.loaders import open_model
from workbench.quant.plan import Plan
from workbench.core.progress import run

EXPECTED_ARCH = {"llama": "llama", "mistral": "llama", "mixtral": "llama", "qwen2": "qwen2",
                 "qwen3": "qwen3", "qwen3_moe": "qwen3moe", "gemma2": "gemma2",
                 "gemma3_text": "gemma3", "phi3": "phi3", "deepseek_v3": "deepseek2",
                 "gpt2": "gpt2", "bert": "bert"}
MOE = {"qwen3_moe": 4, "mixtral": 4, "deepseek_v3": 4}


def _reader(path):
    import gguf
    return gguf.GGUFReader(str(path))


def _field(r, key):
    f = r.fields.get(key)
    return None if f is None else f.contents()


def _allowed_names(arch_name: str, n_blocks: int) -> set[str]:
    import gguf
    arch = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch_name)
    out = set()
    for t in gguf.MODEL_TENSORS[arch]:
        base = gguf.TENSOR_NAMES[t]
        for b in range(n_blocks):
            n = base.format(bid=b)
            out.update({n + ".weight", n + ".bias"})
    return out


@pytest.fixture(scope="module")
def f16_exports(tiny_arch, tmp_path_factory):
    """{arch: (folder, gguf path, export info)} of every tiny architecture exported as fp16."""
    from tests.tiny_archs import available
    d = tmp_path_factory.mktemp("gguf-arch")
    out = {}
    for arch in available():
        folder = tiny_arch(arch)
        path = d / f"{arch}.gguf"
        info = run(export(open_model(folder), Plan(default="fp16"), "gguf", path))
        out[arch] = (folder, path, info)
    return out


@pytest.mark.parametrize("arch", sorted(EXPECTED_ARCH))
def test_architecture_names_and_tensors_are_llama_cpps(f16_exports, arch):
    if arch not in f16_exports:
        pytest.skip(f"transformers has no {arch}")
    folder, path, info = f16_exports[arch]
    assert info["runnable_by_llama_cpp"] and "not_runnable" not in info
    assert info["architecture"] == EXPECTED_ARCH[arch]
    r = _reader(path)
    assert _field(r, "general.architecture") == EXPECTED_ARCH[arch]
    cfg = json.loads((folder / "config.json").read_text())
    n_blocks = cfg.get("num_hidden_layers", cfg.get("n_layer"))
    assert _field(r, f"{EXPECTED_ARCH[arch]}.block_count") == n_blocks
    names = [t.name for t in r.tensors]
    allowed = _allowed_names(EXPECTED_ARCH[arch], n_blocks)
    assert set(names) <= allowed, sorted(set(names) - allowed)
    assert "token_embd.weight" in names and len(names) == len(set(names))
    # no Hugging Face name survives
    assert not [n for n in names if "layers." in n or "experts." in n or n.startswith("model.")]
    tokens = _field(r, "tokenizer.ggml.tokens")
    emb = next(t for t in r.tensors if t.name == "token_embd.weight")
    assert len(tokens) == int(emb.shape[1])       # ggml shape (n_embd, n_vocab)


@pytest.mark.parametrize("arch", sorted(MOE))
def test_experts_merged_into_3d_tensors_with_the_experts_weights(f16_exports, arch):
    if arch not in f16_exports:
        pytest.skip(f"transformers has no {arch}")
    folder, path, info = f16_exports[arch]
    r = _reader(path)
    src = open_model(folder)
    n_e = MOE[arch]
    assert _field(r, f"{EXPECTED_ARCH[arch]}.expert_count") == n_e
    assert _field(r, f"{EXPECTED_ARCH[arch]}.expert_used_count") == 2
    exps = {t.name: t for t in r.tensors if re.search(r"ffn_(gate|up|down)_exps\.weight$", t.name)}
    moe_layers = {int(n.split(".")[1]) for n in exps}
    assert moe_layers == ({1} if arch == "deepseek_v3" else {0, 1})
    assert len(exps) == 3 * len(moe_layers)
    hf_w = {"mixtral": {"gate": "w1", "up": "w3", "down": "w2"}}.get(
        arch, {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"})
    part = "block_sparse_moe" if arch == "mixtral" else "mlp"
    for name, t in exps.items():
        bid, proj = int(name.split(".")[1]), name.split(".")[2].split("_")[1]
        data = np.asarray(t.data)
        assert data.ndim == 3 and data.shape[0] == n_e and t.tensor_type.name == "F16"
        for e in range(n_e):
            w = src.read(f"model.layers.{bid}.{part}.experts.{e}.{hf_w[proj]}.weight")
            assert data.shape[1:] == w.shape
            np.testing.assert_array_equal(data[e], w.astype(np.float16))
    routers = [t for t in r.tensors if t.name.endswith("ffn_gate_inp.weight")]
    assert len(routers) == len(moe_layers)
    assert all(t.tensor_type.name == "F32" for t in routers)
    src.close()


def test_moe_q4_k_export_keeps_routers_float(tiny_arch, tmp_path):
    folder = tiny_arch("qwen3_moe")
    path = tmp_path / "q4k.gguf"
    info = run(export(open_model(folder), Plan(default="q4_k"), "gguf", path))
    types = {t.name: t.tensor_type.name for t in _reader(path).tensors}
    assert types["blk.1.ffn_gate_inp.weight"] == "F32"
    assert types["blk.1.ffn_up_exps.weight"] == "Q4_K"
    assert types["blk.1.ffn_down_exps.weight"] == "Q4_K"
    assert types["blk.1.attn_q_norm.weight"] == "F32"
    assert info["types"]["F32"] >= 2 + 4 * 2 + 1       # routers, 4 norms a layer, output norm
    # a rule naming a router (patterns never reach one: workbench.quant.plan) is ignored with a
    # note: llama.cpp never re-types it
    plan = Plan(default="q4_k", rules=[{"match": "model.layers.1.mlp.gate.weight",
                                        "scheme": "q8_0"}])
    info = run(export(open_model(folder), plan, "gguf", path))
    assert "ffn_gate_inp" in info["notes"]["model.layers.1.mlp.gate.weight"]
    assert {t.name: t.tensor_type.name for t in _reader(path).tensors}[
        "blk.1.ffn_gate_inp.weight"] == "F32"


def test_experts_given_different_schemes_are_refused(tiny_arch, tmp_path):
    folder = tiny_arch("qwen3_moe")
    plan = Plan(default="q4_k", rules=[
        {"match": "model.layers.0.mlp.experts.3.up_proj.weight", "scheme": "q8_0"}])
    out = tmp_path / "x.gguf"
    with pytest.raises(WorkbenchError, match=r"blk\.0\.ffn_up_exps\.weight.*q8_0"):
        run(export(open_model(folder), plan, "gguf", out))
    assert not out.exists()
    # one rule for every expert of the projection is fine
    plan = Plan(default="q4_k", rules=[
        {"match": r"re:model\.layers\.0\.mlp\.experts\.\d+\.up_proj\.weight", "scheme": "q8_0"}])
    run(export(open_model(folder), plan, "gguf", out))
    types = {t.name: t.tensor_type.name for t in _reader(out).tensors}
    assert types["blk.0.ffn_up_exps.weight"] == "Q8_0"
    assert types["blk.1.ffn_up_exps.weight"] == "Q4_K"


def test_deepseek_mla_split_and_keys(f16_exports):
    if "deepseek_v3" not in f16_exports:
        pytest.skip("transformers has no deepseek_v3")
    folder, path, _ = f16_exports["deepseek_v3"]
    cfg = json.loads((folder / "config.json").read_text())
    r = _reader(path)
    nope, v, lora = cfg["qk_nope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
    n_head = cfg["num_attention_heads"]
    t = {x.name: np.asarray(x.data) for x in r.tensors}
    src = open_model(folder)
    for b in range(cfg["num_hidden_layers"]):
        kv_b = src.read(f"model.layers.{b}.self_attn.kv_b_proj.weight").reshape(n_head, nope + v,
                                                                                 lora)
        k_b, v_b = t[f"blk.{b}.attn_k_b.weight"], t[f"blk.{b}.attn_v_b.weight"]
        assert k_b.shape == (n_head, lora, nope) and v_b.shape == (n_head, v, lora)
        np.testing.assert_array_equal(k_b, kv_b[:, :nope, :].transpose(0, 2, 1).astype(np.float16))
        np.testing.assert_array_equal(v_b, kv_b[:, nope:, :].astype(np.float16))
        assert f"blk.{b}.attn_kv_b.weight" not in t
    bias = src.read("model.layers.1.mlp.gate.e_score_correction_bias")
    np.testing.assert_array_equal(t["blk.1.exp_probs_b.bias"], bias)
    assert _field(r, "deepseek2.attention.head_count_kv") == 1
    assert _field(r, "deepseek2.attention.kv_lora_rank") == lora
    assert _field(r, "deepseek2.attention.key_length") == lora + cfg["qk_rope_head_dim"]
    assert _field(r, "deepseek2.attention.key_length_mla") == nope + cfg["qk_rope_head_dim"]
    assert _field(r, "deepseek2.attention.value_length_mla") == v
    assert _field(r, "deepseek2.leading_dense_block_count") == 1
    assert _field(r, "deepseek2.expert_shared_count") == 1
    assert _field(r, "deepseek2.expert_gating_func") == 2          # sigmoid, as transformers
    assert "blk.1.ffn_up_shexp.weight" in t and "blk.0.ffn_up.weight" in t
    src.close()


@pytest.mark.parametrize("arch", ["gemma2", "gemma3_text"])
def test_gemma_norms_stored_plus_one(f16_exports, arch):
    if arch not in f16_exports:
        pytest.skip(f"transformers has no {arch}")
    folder, path, _ = f16_exports[arch]
    t = {x.name: (x.tensor_type.name, np.asarray(x.data)) for x in _reader(path).tensors}
    src = open_model(folder)
    w = src.read("model.layers.1.post_feedforward_layernorm.weight")
    kind, data = t["blk.1.post_ffw_norm.weight"]
    assert kind == "F32"
    np.testing.assert_array_equal(data, w + np.float32(1.0))
    kind, data = t["output_norm.weight"]
    np.testing.assert_array_equal(data, src.read("model.norm.weight") + np.float32(1.0))
    src.close()


def test_moe_gguf_retyped_gguf_to_gguf(f16_exports, tmp_path):
    """The GGUF->GGUF path on a MoE GGUF: merged 3-D experts re-typed as a whole, routers and
    norms left as llama-quantize leaves them, every key/value kept."""
    if "qwen3_moe" not in f16_exports:
        pytest.skip("transformers has no qwen3_moe")
    _, f16, _ = f16_exports["qwen3_moe"]
    src = open_model(f16)
    assert src.info("blk.1.ffn_up_exps.weight").shape == (4, 256, 256)
    out = tmp_path / "q.gguf"
    run(export(src, Plan(default="q4_k"), "gguf", out))
    a, b = _reader(f16), _reader(out)
    types = {t.name: t.tensor_type.name for t in b.tensors}
    assert types["blk.1.ffn_up_exps.weight"] == "Q4_K"
    assert types["blk.0.ffn_gate_inp.weight"] == "F32"
    assert _field(b, "general.architecture") == "qwen3moe"
    assert _field(b, "qwen3moe.expert_count") == 4
    assert _field(b, "tokenizer.ggml.tokens") == _field(a, "tokenizer.ggml.tokens")
    from gguf.quants import dequantize
    x = next(t for t in b.tensors if t.name == "blk.1.ffn_up_exps.weight")
    deq = dequantize(x.data, x.tensor_type).reshape(4, 256, 256)
    ref = np.asarray(next(t for t in a.tensors if t.name == "blk.1.ffn_up_exps.weight").data,
                     np.float32)
    rel = np.linalg.norm(deq - ref) / np.linalg.norm(ref)
    assert 0.02 < rel < 0.1, rel          # re-typed (not copied): Q4_K's error on N(0, s) rows
    # the bytes are the Q4_K scheme's own of the 1,024 rows of 4 x 256 experts' weights
    from workbench.schemes import get_scheme
    blocks = get_scheme("q4_k").quantize(ref.reshape(-1, 256)).arrays["blocks"]
    assert np.asarray(x.data).tobytes() == np.ascontiguousarray(blocks).tobytes()
    src.close()


def test_fused_3d_experts_checkpoint_gives_the_same_gguf(tiny_arch, tmp_path, f16_exports):
    """A checkpoint with a layer's experts fused into 3-D tensors (transformers 5's in-memory
    layout: mlp.experts.gate_up_proj (E, 2I, H), mlp.experts.down_proj (E, H, I)) exports the
    same merged llama.cpp tensors as the per-expert checkpoint."""
    import shutil

    from safetensors.numpy import save_file
    if "qwen3_moe" not in f16_exports:
        pytest.skip("transformers has no qwen3_moe")
    folder, per_expert_gguf, _ = f16_exports["qwen3_moe"]
    src = open_model(folder)
    fused_dir = tmp_path / "fused"
    fused_dir.mkdir()
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(folder / f, fused_dir / f)
    tensors = {}
    for n in src.tensors:
        m = re.match(r"(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.", n)
        if m is None:
            tensors[n] = src.read(n)
    for b in range(2):
        pre = f"model.layers.{b}.mlp.experts"
        tensors[f"{pre}.gate_up_proj"] = np.stack([np.concatenate(
            [src.read(f"{pre}.{e}.gate_proj.weight"), src.read(f"{pre}.{e}.up_proj.weight")])
            for e in range(4)])
        tensors[f"{pre}.down_proj"] = np.stack([src.read(f"{pre}.{e}.down_proj.weight")
                                                for e in range(4)])
    save_file(tensors, str(fused_dir / "model.safetensors"))
    out = tmp_path / "fused.gguf"
    info = run(export(open_model(fused_dir), Plan(default="fp16"), "gguf", out))
    assert info["runnable_by_llama_cpp"]
    a = {t.name: np.asarray(t.data) for t in _reader(per_expert_gguf).tensors}
    b = {t.name: np.asarray(t.data) for t in _reader(out).tensors}
    assert sorted(a) == sorted(b)
    for n in a:
        np.testing.assert_array_equal(a[n], b[n], err_msg=n)
    src.close()


def test_llama3_rope_scaling_writes_rope_freqs(tiny_arch, tmp_path):
    """Llama 3.1's rope_type llama3: the rope_freqs tensor holds the factors llama.cpp divides
    each rope frequency by, i.e. transformers' default inverse frequencies over its llama3 ones."""
    import shutil

    import torch
    import transformers
    src = tiny_arch("llama")
    folder = tmp_path / "llama31"
    shutil.copytree(src, folder)
    cfg = json.loads((folder / "config.json").read_text())
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64}
    cfg["rope_parameters"] = rope
    (folder / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "l.gguf"
    run(export(open_model(folder), Plan(default="fp16"), "gguf", out))
    r = _reader(out)
    freqs = next(np.asarray(t.data) for t in r.tensors if t.name == "rope_freqs.weight")
    assert _field(r, "llama.rope.freq_base") == 500000.0
    conf = transformers.LlamaConfig(**{k: v for k, v in cfg.items() if not k.startswith("_")})
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    inv_l3, _ = ROPE_INIT_FUNCTIONS["llama3"](conf, torch.device("cpu"))
    dim = cfg["head_dim"]
    inv = 1.0 / (500000.0 ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    np.testing.assert_allclose(freqs, inv / inv_l3.double().numpy(), rtol=1e-5)
    assert freqs.min() == 1.0 and freqs.max() == 8.0


@pytest.fixture(scope="module")
def gemma3_spm(tmp_path_factory):
    """A tiny gemma3_text with a SentencePiece-style tokenizer (byte fallback, U+2581 spaces),
    alternating sliding/global layers and query_pre_attn_scalar 256 unlike head_dim 64,
    exported at fp16: (folder, gguf path)."""
    import transformers

    from tests.tiny_archs import make_tiny, write_spm_tokenizer
    if "gemma3_text" not in transformers.CONFIG_MAPPING:
        pytest.skip("transformers has no gemma3_text")
    d = tmp_path_factory.mktemp("gemma3-spm")
    folder = d / "hf"
    folder.mkdir()
    n_vocab = write_spm_tokenizer(folder)
    make_tiny("gemma3_text", folder, tokenizer=False, overrides=dict(
        vocab_size=n_vocab, num_hidden_layers=4, query_pre_attn_scalar=256,
        layer_types=["sliding_attention", "full_attention"] * 2, bos_token_id=2,
        eos_token_id=1, pad_token_id=0))
    out = d / "f16.gguf"
    info = run(export(open_model(folder), Plan(default="fp16"), "gguf", out))
    assert info["runnable_by_llama_cpp"], info.get("not_runnable")
    return folder, out


def test_sentencepiece_style_tokenizer_written_as_llamas(gemma3_spm):
    """Gemma's tokenizer.json (BPE with byte fallback) becomes llama.cpp's `llama` tokenizer:
    tokens in id order, CONTROL specials, BYTE <0xNN>, scores falling with each merged
    token's first merge (the order llama.cpp merges in), no merges, no space prefix."""
    folder, path = gemma3_spm
    r = _reader(path)
    tok = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = tok["model"]["vocab"]
    assert _field(r, "tokenizer.ggml.model") == "llama"
    assert _field(r, "tokenizer.ggml.pre") == "default"
    assert _field(r, "tokenizer.ggml.merges") is None
    tokens = _field(r, "tokenizer.ggml.tokens")
    assert tokens == sorted(vocab, key=vocab.get)
    types = np.array(_field(r, "tokenizer.ggml.token_type"))
    scores = np.array(_field(r, "tokenizer.ggml.scores"))
    assert types[:6].tolist() == [3] * 6                     # <pad> <eos> <bos> <unk> ...
    assert (types[6:262] == 6).all() and tokens[6] == "<0x00>"  # bytes
    assert (types[262:] == 1).all() and (scores[:262] == [-1000.0] * 6 + [0.0] * 256).all()
    first = {}
    for rank, (a, b) in enumerate(tok["model"]["merges"]):
        first.setdefault(a + b, rank)
    merged = [i for i in range(262, len(tokens)) if tokens[i] in first]
    assert len(merged) > 400
    assert [scores[i] for i in merged] == [-float(first[tokens[i]]) for i in merged]
    assert scores[len(merged) + 262:].max() < scores[merged].min()    # single characters
    assert _field(r, "tokenizer.ggml.add_space_prefix") is False
    assert _field(r, "tokenizer.ggml.add_bos_token") is True
    assert _field(r, "tokenizer.ggml.add_eos_token") is False
    assert (_field(r, "tokenizer.ggml.bos_token_id"), _field(r, "tokenizer.ggml.eos_token_id"),
            _field(r, "tokenizer.ggml.unknown_token_id")) == (2, 1, 3)


def test_gemma3_query_scale_and_layer_pattern(gemma3_spm):
    """query_pre_attn_scalar 256 with head_dim 64: llama.cpp scales queries by 64^-1/2, so
    q_norm is stored as (1 + w) * sqrt(64 / 256); k_norm only + 1. layer_types other than
    llama.cpp's every-6th-global are written as the per-layer bool pattern."""
    folder, path = gemma3_spm
    r = _reader(path)
    t = {x.name: np.asarray(x.data) for x in r.tensors}
    src = open_model(folder)
    for b in range(4):
        q = src.read(f"model.layers.{b}.self_attn.q_norm.weight")
        np.testing.assert_allclose(t[f"blk.{b}.attn_q_norm.weight"], (q + 1) * 0.5, rtol=1e-6)
        k = src.read(f"model.layers.{b}.self_attn.k_norm.weight")
        np.testing.assert_array_equal(t[f"blk.{b}.attn_k_norm.weight"], k + np.float32(1))
    src.close()
    assert _field(r, "gemma3.attention.sliding_window_pattern") == [True, False, True, False]
    assert _field(r, "gemma3.attention.sliding_window") == 64
    assert _field(r, "gemma3.rope.freq_base_swa") == 10000.0


def test_sentencepiece_style_detection():
    """Which BPE tokenizer.json files are written as llama.cpp's `llama` tokenizer, and with
    which add_space_prefix: Gemma (Replace), Llama 2 (Prepend + Replace), Metaspace without
    splitting; byte-level BPE (no byte fallback, or a ByteLevel pre-tokenizer) is not."""
    from workbench.export.gguf_tokenizer import _spm_style
    rep = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    pre = {"type": "Prepend", "prepend": "\u2581"}
    split = {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
             "invert": False}

    def tok(norm, pretok, fallback=True):
        return {"model": {"type": "BPE", "byte_fallback": fallback}, "normalizer": norm,
                "pre_tokenizer": pretok}
    assert _spm_style(tok(rep, split)) is False                          # Gemma
    assert _spm_style(tok({"type": "Sequence", "normalizers": [pre, rep]}, None)) is True
    meta = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
            "split": False}
    assert _spm_style(tok(None, meta)) is True
    assert _spm_style(tok(None, dict(meta, prepend_scheme="never"))) is False
    assert _spm_style(tok(None, dict(meta, split=True))) is None
    assert _spm_style(tok(rep, split, fallback=False)) is None
    assert _spm_style(tok(None, {"type": "ByteLevel", "use_regex": True})) is None
    assert _spm_style(tok(None, split)) is None      # nothing turns spaces into U+2581


def test_tokenizer_key_values_are_written_once_and_replayed(tiny_arch, tmp_path, monkeypatch):
    """A file budget writes the header of each plan it tries (layout_bytes): the tokenizer's
    key/values are made once per tokenizer and replayed, byte for byte; an edited tokenizer
    file is read again."""
    import shutil

    from workbench.export import gguf_header, gguf_size, gguf_tokenizer
    folder = tmp_path / "m"
    shutil.copytree(tiny_arch("llama"), folder)
    calls = []
    real = gguf_tokenizer.write_tokenizer
    monkeypatch.setattr(gguf_tokenizer, "write_tokenizer",
                        lambda w, t: calls.append(1) or real(w, t))
    monkeypatch.setattr(gguf_header, "_TOKENIZER_KV", {})
    model = open_model(folder)
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    run(export(model, Plan(default="q8_0"), "gguf", a))
    lay = gguf_size.layout_bytes(model, Plan(default="q8_0"))
    run(export(model, Plan(default="q8_0"), "gguf", b))
    assert len(calls) == 1
    assert a.read_bytes() == b.read_bytes() and lay["file"] == a.stat().st_size
    tj = folder / "tokenizer.json"
    tok = json.loads(tj.read_text())
    tok["added_tokens"] = tok.get("added_tokens", [])      # the same content, rewritten
    tj.write_text(json.dumps(tok) + " ")
    run(export(open_model(folder), Plan(default="q8_0"), "gguf", b))
    assert len(calls) == 2

"""`--format llama-tensor-types`: the plan as llama-quantize's --tensor-type-file."""

from __future__ import annotations

import re

import numpy as np
import pytest

from workbench.core.errors import WorkbenchError
from workbench.export import export
from workbench.formats.llama_names import detect_family, llama_cpp_name
from workbench.formats.loaders import open_model
from workbench.quant.plan import Plan
from workbench.core.progress import run

# what llama-quantize accepts: whitespace-separated NAME=TYPE tokens, types by ggml_type_name
GGML_TYPES = {"f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k",
              "q4_k", "q5_k", "q6_k", "iq4_nl"}


def parse_like_llama_quantize(text: str) -> dict[str, str]:
    """Mimic tools/quantize/quantize.cpp: tokens split on whitespace, 'name=type' each."""
    out = {}
    for tok in text.split():
        name, sep, typ = tok.partition("=")
        assert sep and name and typ, tok
        assert typ.lower() in GGML_TYPES, typ
        out[name.lower()] = typ
    return out


def resolve(patterns: dict[str, str], gguf_name: str) -> str | None:
    """The type llama-quantize would pick for `gguf_name` (regex search, last match wins)."""
    hit = None
    for pat, typ in patterns.items():
        if re.search(pat, gguf_name):
            hit = typ
    return hit


def test_llama_family_names(tiny_llama, tmp_path):
    model = open_model(tiny_llama[0])
    assert detect_family(model) == "llama"
    plan = Plan(default="q4_k", rules=[{"match": "model.embed_tokens.weight", "scheme": "q8_0"},
                                       {"match": "re:v_proj", "scheme": "q6_k"},
                                       {"match": "re:layers\\.1\\.mlp\\.down", "scheme": "keep"},
                                       {"match": "lm_head.weight", "scheme": "fp16"}])
    out = tmp_path / "types.txt"
    info = run(export(model, plan, "llama-tensor-types", out))
    pats = parse_like_llama_quantize(out.read_text())
    assert info["family"] == "Llama/Mistral/Qwen"
    assert resolve(pats, "token_embd.weight") == "q8_0"
    assert resolve(pats, "output.weight") == "f16"
    assert resolve(pats, "blk.0.attn_q.weight") == "q4_K"
    assert resolve(pats, "blk.1.attn_v.weight") == "q6_K"
    assert resolve(pats, "blk.1.ffn_down.weight") == "f32"          # keep of a float32 source
    assert resolve(pats, "blk.0.ffn_gate.weight") == "q4_K"
    # exact names only: no pattern of layer 1 matches layer 10/11, nor a longer name
    assert resolve(pats, "blk.10.attn_v.weight") is None
    assert resolve(pats, "per_layer_token_embd.weight") is None
    # norms and biases are not re-typed by llama-quantize: not in the file
    assert resolve(pats, "blk.0.attn_norm.weight") is None
    assert len(pats) == info["assignments"] == 2 * 7 + 2


@pytest.mark.parametrize("hf,llama", [
    ("model.layers.3.self_attn.o_proj.weight", "blk.3.attn_output.weight"),
    ("model.layers.12.mlp.gate_proj.weight", "blk.12.ffn_gate.weight"),
    ("model.layers.0.post_attention_layernorm.weight", "blk.0.ffn_norm.weight"),
    ("model.norm.weight", "output_norm.weight"),
])
def test_llama_name_map(hf, llama):
    assert llama_cpp_name(hf, "llama") == llama


@pytest.mark.parametrize("hf,llama", [
    ("h.0.attn.c_attn.weight", "blk.0.attn_qkv.weight"),
    ("transformer.h.5.mlp.c_proj.weight", "blk.5.ffn_down.weight"),
    ("transformer.wte.weight", "token_embd.weight"),
    ("wpe.weight", "position_embd.weight"),
    ("ln_f.bias", "output_norm.bias"),
])
def test_gpt2_name_map(hf, llama):
    assert llama_cpp_name(hf, "gpt2") == llama


def test_gpt2_conv1d_rows_are_the_input_dimension(make_safetensors, tmp_path):
    # HF GPT-2 Conv1D weights are (in, out); llama.cpp's converter transposes them, so its row
    # length is the HF first dimension
    rng = np.random.default_rng(0)
    t = {"wte.weight": rng.standard_normal((50, 256)).astype(np.float32),
         "h.0.ln_1.weight": np.ones(256, np.float32),
         "h.0.attn.c_attn.weight": rng.standard_normal((256, 768)).astype(np.float32),
         "h.0.attn.bias": np.ones((1, 1, 8, 8), np.float32),
         "h.0.mlp.c_proj.weight": rng.standard_normal((1024 + 32, 256)).astype(np.float32)}
    model = open_model(make_safetensors(t))
    assert detect_family(model) == "gpt2"
    with pytest.raises(WorkbenchError, match="h.0.mlp.c_proj.weight") as ei:
        run(export(model, Plan(default="q4_k"), "llama-tensor-types", tmp_path / "t.txt",
                   strict=True))
    assert "1056" in str(ei.value)
    # without --strict: llama-quantize's fallback, Q4_K -> Q5_0 (1056 = 33 x 32)
    run(export(model, Plan(default="q4_k"), "llama-tensor-types", tmp_path / "t.txt"))
    pats = parse_like_llama_quantize((tmp_path / "t.txt").read_text())
    assert resolve(pats, "blk.0.ffn_down.weight") == "q5_0"
    info = run(export(model, Plan(default="q4_k", rules=[
        {"match": "h.0.mlp.c_proj.weight", "scheme": "q4_0"}]), "llama-tensor-types",
        tmp_path / "t.txt"))
    pats = parse_like_llama_quantize((tmp_path / "t.txt").read_text())
    assert resolve(pats, "blk.0.attn_qkv.weight") == "q4_K"
    assert resolve(pats, "blk.0.ffn_down.weight") == "q4_0"
    assert "h.0.attn.bias" in info["dropped_by_converter"]


def test_bert_minilm(minilm, tmp_path):
    assert detect_family(minilm) == "bert"
    plan = Plan(default="q8_0", rules=[
        {"match": "re:layer\\.\\d+\\.output\\.dense\\.weight$", "scheme": "q4_k"},
        {"match": "embeddings.word_embeddings.weight", "scheme": "fp16"}])
    out = tmp_path / "minilm.txt"
    info = run(export(minilm, plan, "llama-tensor-types", out))
    pats = parse_like_llama_quantize(out.read_text())
    assert info["family"] == "BERT"
    assert resolve(pats, "blk.0.ffn_down.weight") == "q4_K"
    assert resolve(pats, "blk.5.attn_q.weight") == "q8_0"
    assert resolve(pats, "blk.2.attn_output.weight") == "q8_0"
    assert resolve(pats, "blk.2.ffn_up.weight") == "q8_0"
    assert resolve(pats, "token_embd.weight") == "f16"
    assert "pooler.dense.weight" in info["dropped_by_converter"]
    assert "embeddings.position_embeddings.weight" in info["never_retyped_by_llama_quantize"]
    assert len(pats) == 6 * 6 + 1


def test_bert_unmappable_rows_fall_back(minilm, tmp_path):
    # MiniLM's hidden size 384 is not a multiple of 256: a K-quant cannot take those rows
    with pytest.raises(WorkbenchError, match="encoder.layer.0.attention.self.query.weight") as ei:
        run(export(minilm, Plan(default="q4_k"), "llama-tensor-types", tmp_path / "x.txt",
                   strict=True))
    assert "multiple of 256" in str(ei.value)
    assert not (tmp_path / "x.txt").exists()
    info = run(export(minilm, Plan(default="q4_k", fallback="q8_0"), "llama-tensor-types",
                      tmp_path / "x.txt"))
    pats = parse_like_llama_quantize((tmp_path / "x.txt").read_text())
    assert resolve(pats, "blk.0.attn_q.weight") == "q8_0"       # the plan's own fallback
    assert resolve(pats, "blk.0.ffn_down.weight") == "q4_K"     # 1536-wide rows take Q4_K
    assert info["fallbacks"]["fallbacks"] == {"q4_k->q8_0": 31}


def test_scheme_without_llama_type_is_named(tiny_llama, tmp_path):
    model = open_model(tiny_llama[0])
    with pytest.raises(WorkbenchError, match="no llama.cpp tensor type") as ei:
        run(export(model, Plan(default="nf4-g64"), "llama-tensor-types", tmp_path / "x.txt"))
    assert "nf4-g64" in str(ei.value)


def test_unknown_family_and_unknown_tensor(make_safetensors, tmp_path):
    m = open_model(make_safetensors({"foo.bar.weight": np.ones((4, 32), np.float32)}))
    with pytest.raises(WorkbenchError, match="cannot map"):
        run(export(m, Plan(default="q8_0"), "llama-tensor-types", tmp_path / "x.txt"))
    m = open_model(make_safetensors({
        "model.layers.0.self_attn.q_proj.weight": np.ones((32, 32), np.float32),
        "model.layers.0.mystery.weight": np.ones((32, 32), np.float32)}))
    with pytest.raises(WorkbenchError, match="model.layers.0.mystery.weight"):
        run(export(m, Plan(default="q8_0"), "llama-tensor-types", tmp_path / "x.txt"))


def test_gguf_source_keeps_its_names(tmp_path):
    # a GGUF with llama.cpp names: identity mapping; keep = the GGUF's own type
    import gguf

    from workbench.schemes import get_scheme
    w = gguf.GGUFWriter(str(tmp_path / "l.gguf"), "llama")
    w.add_tensor("blk.0.attn_q.weight", np.ones((32, 64), np.float16))
    w.add_tensor("blk.0.ffn_up.weight",
                 get_scheme("q4_k").quantize(np.ones((32, 256), np.float32)).arrays["blocks"],
                 raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    lm = open_model(tmp_path / "l.gguf")
    out = tmp_path / "t.txt"
    run(export(lm, Plan(default="keep", rules=[{"match": "blk.0.attn_q.weight", "scheme": "q5_1"}]),
               "llama-tensor-types", out))
    pats = parse_like_llama_quantize(out.read_text())
    assert resolve(pats, "blk.0.attn_q.weight") == "q5_1"
    assert resolve(pats, "blk.0.ffn_up.weight") == "q4_K"


def test_gguf_written_from_safetensors_maps_like_its_source(tiny_llama, tmp_path):
    g = tmp_path / "hf-names.gguf"
    run(export(open_model(tiny_llama[0]), Plan(default="q8_0"), "gguf", g))
    out = tmp_path / "t.txt"
    info = run(export(open_model(g), Plan(default="q6_k"), "llama-tensor-types", out))
    assert info["family"] == "Llama/Mistral/Qwen"
    pats = parse_like_llama_quantize(out.read_text())
    assert resolve(pats, "blk.1.ffn_up.weight") == "q6_K"

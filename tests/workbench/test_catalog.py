"""Roles and block indices inferred from tensor names for the common model families."""

from __future__ import annotations

import pytest

from workbench.formats.catalog import ROLES, block_index, group_of, infer_role

CASES = [
    # Llama / Mistral / Qwen (HF names)
    ("model.embed_tokens.weight", 2, "embedding", None),
    ("model.layers.0.self_attn.q_proj.weight", 2, "attn_q", 0),
    ("model.layers.1.self_attn.k_proj.weight", 2, "attn_k", 1),
    ("model.layers.12.self_attn.v_proj.weight", 2, "attn_v", 12),
    ("model.layers.31.self_attn.o_proj.weight", 2, "attn_o", 31),
    ("model.layers.3.self_attn.q_proj.bias", 1, "bias", 3),
    ("model.layers.3.self_attn.k_proj.bias", 1, "bias", 3),
    ("model.layers.4.mlp.gate_proj.weight", 2, "mlp_gate", 4),
    ("model.layers.4.mlp.up_proj.weight", 2, "mlp_up", 4),
    ("model.layers.4.mlp.down_proj.weight", 2, "mlp_down", 4),
    ("model.layers.4.input_layernorm.weight", 1, "norm", 4),
    ("model.layers.4.post_attention_layernorm.weight", 1, "norm", 4),
    ("model.layers.4.self_attn.q_norm.weight", 1, "norm", 4),
    ("model.layers.4.self_attn.rotary_emb.inv_freq", 1, "other", 4),
    ("model.norm.weight", 1, "norm", None),
    ("lm_head.weight", 2, "lm_head", None),
    ("model.layers.2.block_sparse_moe.experts.5.w1.weight", 2, "expert", 2),
    ("model.layers.2.block_sparse_moe.experts.5.w3.weight", 2, "expert", 2),
    ("model.layers.2.block_sparse_moe.experts.5.w2.weight", 2, "expert", 2),
    ("model.layers.0.self_attn.qkv_proj.weight", 2, "attn_qkv", 0),
    ("model.layers.0.mlp.gate_up_proj.weight", 2, "mlp_up", 0),
    # Meta Llama original names
    ("tok_embeddings.weight", 2, "embedding", None),
    ("layers.7.attention.wq.weight", 2, "attn_q", 7),
    ("layers.7.attention.wk.weight", 2, "attn_k", 7),
    ("layers.7.attention.wv.weight", 2, "attn_v", 7),
    ("layers.7.attention.wo.weight", 2, "attn_o", 7),
    ("layers.7.feed_forward.w1.weight", 2, "mlp_gate", 7),
    ("layers.7.feed_forward.w3.weight", 2, "mlp_up", 7),
    ("layers.7.feed_forward.w2.weight", 2, "mlp_down", 7),
    ("layers.7.attention_norm.weight", 1, "norm", 7),
    ("layers.7.ffn_norm.weight", 1, "norm", 7),
    ("norm.weight", 1, "norm", None),
    ("output.weight", 2, "lm_head", None),
    # GPT-2 (with and without the transformer. prefix)
    ("wte.weight", 2, "embedding", None),
    ("wpe.weight", 2, "embedding", None),
    ("h.0.ln_1.weight", 1, "norm", 0),
    ("h.0.ln_1.bias", 1, "bias", 0),
    ("h.0.attn.c_attn.weight", 2, "attn_qkv", 0),
    ("h.0.attn.c_attn.bias", 1, "bias", 0),
    ("h.0.attn.c_proj.weight", 2, "attn_o", 0),
    ("h.11.ln_2.weight", 1, "norm", 11),
    ("h.11.mlp.c_fc.weight", 2, "mlp_up", 11),
    ("h.11.mlp.c_proj.weight", 2, "mlp_down", 11),
    ("transformer.h.5.attn.c_attn.weight", 2, "attn_qkv", 5),
    ("transformer.h.5.mlp.c_proj.weight", 2, "mlp_down", 5),
    ("transformer.ln_f.weight", 1, "norm", None),
    ("ln_f.bias", 1, "bias", None),
    ("h.0.attn.bias", 4, "other", 0),          # GPT-2's causal mask buffer, not a bias
    ("h.0.attn.masked_bias", 0, "other", 0),
    # BERT (the real MiniLM names, with and without bert.)
    ("embeddings.word_embeddings.weight", 2, "embedding", None),
    ("embeddings.position_embeddings.weight", 2, "embedding", None),
    ("embeddings.token_type_embeddings.weight", 2, "embedding", None),
    ("embeddings.LayerNorm.weight", 1, "norm", None),
    ("embeddings.LayerNorm.bias", 1, "bias", None),
    ("embeddings.position_ids", 2, "other", None),
    ("encoder.layer.0.attention.self.query.weight", 2, "attn_q", 0),
    ("encoder.layer.0.attention.self.key.weight", 2, "attn_k", 0),
    ("encoder.layer.0.attention.self.value.weight", 2, "attn_v", 0),
    ("encoder.layer.0.attention.self.query.bias", 1, "bias", 0),
    ("encoder.layer.0.attention.output.dense.weight", 2, "attn_o", 0),
    ("encoder.layer.0.attention.output.LayerNorm.weight", 1, "norm", 0),
    ("encoder.layer.5.intermediate.dense.weight", 2, "mlp_up", 5),
    ("encoder.layer.5.output.dense.weight", 2, "mlp_down", 5),
    ("encoder.layer.5.output.LayerNorm.weight", 1, "norm", 5),
    ("bert.encoder.layer.3.attention.self.query.weight", 2, "attn_q", 3),
    ("bert.embeddings.word_embeddings.weight", 2, "embedding", None),
    ("pooler.dense.weight", 2, "other", None),
    # GGUF
    ("token_embd.weight", 2, "embedding", None),
    ("blk.0.attn_norm.weight", 1, "norm", 0),
    ("blk.0.attn_q.weight", 2, "attn_q", 0),
    ("blk.0.attn_k.weight", 2, "attn_k", 0),
    ("blk.0.attn_v.weight", 2, "attn_v", 0),
    ("blk.0.attn_q.bias", 1, "bias", 0),
    ("blk.0.attn_qkv.weight", 2, "attn_qkv", 0),
    ("blk.0.attn_output.weight", 2, "attn_o", 0),
    ("blk.0.attn_q_norm.weight", 1, "norm", 0),
    ("blk.17.ffn_norm.weight", 1, "norm", 17),
    ("blk.17.ffn_gate.weight", 2, "mlp_gate", 17),
    ("blk.17.ffn_up.weight", 2, "mlp_up", 17),
    ("blk.17.ffn_down.weight", 2, "mlp_down", 17),
    ("output_norm.weight", 1, "norm", None),
    ("output.weight", 2, "lm_head", None),
    ("rope_freqs.weight", 1, "other", None),
    # GPT-NeoX
    ("gpt_neox.layers.2.attention.query_key_value.weight", 2, "attn_qkv", 2),
    ("gpt_neox.layers.2.attention.dense.weight", 2, "attn_o", 2),
    ("gpt_neox.layers.2.mlp.dense_h_to_4h.weight", 2, "mlp_up", 2),
    ("gpt_neox.layers.2.mlp.dense_4h_to_h.weight", 2, "mlp_down", 2),
    ("gpt_neox.embed_in.weight", 2, "embedding", None),
    # conv
    ("model.conv1.weight", 4, "conv", None),
    ("features.3.weight", 4, "conv", None),
]


@pytest.mark.parametrize("name, ndim, role, block", CASES, ids=[c[0] for c in CASES])
def test_role_and_block(name, ndim, role, block):
    assert infer_role(name, ndim) == role
    assert block_index(name) == block
    assert role in ROLES


def test_minilm_catalog(minilm):
    roles = {}
    for info in minilm.tensors.values():
        roles.setdefault(info.role, []).append(info.name)
        if info.name.startswith("encoder.layer."):
            assert info.block == int(info.name.split(".")[2])
            assert info.group == f"layer {info.block}"
        else:
            assert info.block is None
    assert len(minilm) == 104
    assert minilm.total_params == 22_713_728
    for role in ("attn_q", "attn_k", "attn_v", "attn_o", "mlp_up", "mlp_down"):
        assert len(roles[role]) == 6, role
    assert len(roles["norm"]) == 13 and len(roles["bias"]) == 13 + 6 * 6 + 1
    assert len(roles["embedding"]) == 3
    assert minilm.info("embeddings.word_embeddings.weight").group == "embeddings"
    pid = minilm.info("embeddings.position_ids")
    assert (pid.dtype, pid.shape, pid.is_float) == ("I64", (1, 512), False)


def test_groups():
    assert group_of("lm_head.weight", "lm_head") == "head"
    assert group_of("model.norm.weight", "norm") == "head"
    assert group_of("model.embed_tokens.weight", "embedding") == "embeddings"
    assert group_of("blk.3.ffn_up.weight", "mlp_up") == "layer 3"
    assert group_of("foo", "other") == "other"

"""The hyper-parameter key/values of a runnable GGUF, from a Hugging Face folder's config.json
(`write_hparams`): those convert_hf_to_gguf writes for every text model, then each
architecture's own (ArchSpec.extra names them: experts' sizes, Gemma's soft-capping and sliding
window, Phi-3's rope, DeepSeek's MLA and router, BERT's pooling).
"""

from __future__ import annotations

from pathlib import Path

from workbench.core.errors import WorkbenchError
from workbench.export.gguf_arch import CONVERTER_HINT, HFTarget, _config_values, _hp, \
    _n_experts, _rope


def write_hparams(writer, t: HFTarget) -> None:
    """The keys convert_hf_to_gguf writes (TextModel.set_gguf_parameters, then the
    architecture's own)."""
    with _config_values(t.folder / "config.json"):
        _write_hparams(writer, t)


def _write_hparams(writer, t: HFTarget) -> None:
    import gguf
    c, a = t.config, t.arch.gguf_arch
    writer.add_block_count(t.arch.n_blocks)
    if (n := _hp(c, "max_position_embeddings", "n_ctx", "n_positions")) is not None:
        writer.add_context_length(int(n))
    n_embd = _hp(c, "hidden_size", "n_embd")
    if n_embd is not None:
        writer.add_embedding_length(int(n_embd))
    n_ff = _hp(c, "intermediate_size", "n_inner")
    if n_ff is None and a == "GPT2" and n_embd is not None:
        n_ff = 4 * int(n_embd)
    if n_ff is not None:
        writer.add_feed_forward_length(int(n_ff))
    n_head = _hp(c, "num_attention_heads", "n_head")
    if n_head is not None:
        writer.add_head_count(int(n_head))
    n_kv = 1 if t.spec.mla else _hp(c, "num_key_value_heads")   # MLA runs as MQA
    if n_kv is not None:
        writer.add_head_count_kv(int(n_kv))
    rope = _rope(c)
    rtype = str(rope.get("rope_type") or "default").lower()
    if rtype == "linear" and rope.get("factor") is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope["factor"]))
    elif rtype == "yarn" and rope.get("factor") is not None:
        if rope.get("original_max_position_embeddings") is None:
            raise WorkbenchError("yarn rope scaling without original_max_position_embeddings "
                                 "(the context length llama.cpp scales from); nothing was "
                                 "written", path=str(t.folder / "config.json"))
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(float(rope["factor"]))
        writer.add_rope_scaling_orig_ctx_len(int(rope["original_max_position_embeddings"]))
        for key, add in (("extrapolation_factor", writer.add_rope_scaling_yarn_ext_factor),
                         ("beta_fast", writer.add_rope_scaling_yarn_beta_fast),
                         ("beta_slow", writer.add_rope_scaling_yarn_beta_slow)):
            if rope.get(key) is not None:
                add(float(rope[key]))
        af = rope.get("attention_factor", rope.get("attn_factor"))
        if af is not None:
            writer.add_rope_scaling_yarn_attn_factor(float(af))
    elif rtype not in ("default", "llama3") and not (a == "PHI3" and rtype == "longrope"):
        raise WorkbenchError(f"rope type {rtype!r} is not one this exporter writes; "
                             f"{CONVERTER_HINT}", path=str(t.folder / "config.json"))
    if (theta := _hp(rope, "rope_theta") or _hp(c, "rope_theta")) is not None:
        writer.add_rope_freq_base(float(theta))
    rp = c.get("rope_parameters")
    if isinstance(rp, dict) and isinstance(rp.get("sliding_attention"), dict) and \
            rp["sliding_attention"].get("rope_theta") is not None:
        writer.add_rope_freq_base_swa(float(rp["sliding_attention"]["rope_theta"]))
    elif (local := _hp(c, "local_rope_theta", "rope_local_theta", "rope_theta_local",
                       "swa_rope_theta", "rope_local_base_freq")) is not None:
        # older configs (transformers 4: Gemma 3's rope_local_base_freq), as the converter
        writer.add_rope_freq_base_swa(float(local))
    if (eps := _hp(c, "rms_norm_eps")) is not None:
        writer.add_layer_norm_rms_eps(float(eps))
    if (eps := _hp(c, "layer_norm_eps", "layer_norm_epsilon")) is not None:
        writer.add_layer_norm_eps(float(eps))
    if (n_e := _n_experts(c)) is not None:
        writer.add_expert_count(n_e)
    if (n_used := _hp(c, "num_experts_per_tok", "num_experts_per_token")) is not None:
        writer.add_expert_used_count(int(n_used))
    if (g := _hp(c, "n_group")) is not None:
        writer.add_expert_group_count(int(g))
    if (g := _hp(c, "topk_group")) is not None:
        writer.add_expert_group_used_count(int(g))
    if (head_dim := _hp(c, "head_dim")) is not None and not t.spec.mla:
        writer.add_key_length(int(head_dim))
        writer.add_value_length(int(head_dim))
    if t.spec.rope_dim and n_embd and n_head:
        writer.add_vocab_size(int(_hp(c, "vocab_size", default=0)))
        writer.add_rope_dimension_count(int(_hp(c, "head_dim") or int(n_embd) // int(n_head)))
    for name in t.spec.extra:
        _EXTRA_HPARAMS.get(name, lambda w, t: None)(writer, t)


def _hp_expert_ff(writer, t: HFTarget) -> None:
    if (n := _hp(t.config, "moe_intermediate_size")) is not None:
        writer.add_expert_feed_forward_length(int(n))
    if (n := _hp(t.config, "shared_expert_intermediate_size")) is not None:
        writer.add_expert_shared_feed_forward_length(int(n))


def _hp_gemma2(writer, t: HFTarget) -> None:
    c = t.config
    for key, add in (("attn_logit_softcapping", writer.add_attn_logit_softcapping),
                     ("final_logit_softcapping", writer.add_final_logit_softcapping)):
        if c.get(key) is not None:
            add(float(c[key]))
    if c.get("sliding_window") is not None:
        writer.add_sliding_window(int(c["sliding_window"]))


def _hp_gemma3(writer, t: HFTarget) -> None:
    """Gemma 3's keys beyond the common ones: final logit softcapping, the sliding window and
    which layers use it. llama.cpp's gemma3 makes every 6th layer global unless the file
    carries ``attention.sliding_window_pattern`` as one bool per layer (load_swa_pattern reads
    that array first): it is written when config.json's ``layer_types`` (or, in older configs,
    ``sliding_window_pattern``) differ from every-6th, so any pattern runs as in transformers.
    No sliding window is written when no layer slides (llama.cpp then runs none)."""
    c = t.config
    if c.get("final_logit_softcapping"):
        writer.add_final_logit_softcapping(float(c["final_logit_softcapping"]))
    if c.get("attn_logit_softcapping"):
        raise WorkbenchError("Gemma 3 with attention logit softcapping: llama.cpp's gemma3 has "
                             f"none; {CONVERTER_HINT}", path=str(t.folder / "config.json"))
    n = t.arch.n_blocks
    types = c.get("layer_types")
    if not (isinstance(types, list) and len(types) == n):
        pattern = c.get("sliding_window_pattern", c.get("_sliding_window_pattern")) or 6
        types = ["sliding_attention" if (i + 1) % int(pattern) else "full_attention"
                 for i in range(n)]
    unknown = sorted({x for x in types} - {"sliding_attention", "full_attention"})
    if unknown:
        raise WorkbenchError(f"Gemma 3 layer types {unknown} are not sliding or full attention; "
                             f"{CONVERTER_HINT}", path=str(t.folder / "config.json"))
    sliding = [x == "sliding_attention" for x in types]
    if c.get("sliding_window") is None or not any(sliding):
        return
    writer.add_sliding_window(int(c["sliding_window"]))
    if sliding != [(i + 1) % 6 != 0 for i in range(n)]:
        writer.add_sliding_window_pattern(sliding)


def _hp_phi3(writer, t: HFTarget) -> None:
    c = t.config
    rope = _rope(c)
    orig = rope.get("original_max_position_embeddings", c.get("original_max_position_embeddings"))
    if orig is not None:
        writer.add_rope_scaling_orig_ctx_len(int(orig))
    if rope.get("long_factor") or rope.get("short_factor"):
        raise WorkbenchError("Phi-3 long-context rope factors (longrope) are not written by this "
                             f"exporter; {CONVERTER_HINT}", path=str(t.folder / "config.json"))
    n_embd, n_head = int(c["hidden_size"]), int(c["num_attention_heads"])
    partial = float(rope.get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0)))
    writer.add_rope_dimension_count(int(partial * n_embd) // n_head)
    writer.add_sliding_window(int(c.get("sliding_window") or 0))


def _hp_deepseek2(writer, t: HFTarget) -> None:
    import gguf
    c = t.config
    if c.get("rope_interleave") is False:
        raise WorkbenchError("DeepSeek with rope_interleave false: llama.cpp's deepseek2 "
                             f"applies interleaved rope; {CONVERTER_HINT}",
                             path=str(t.folder / "config.json"))
    has_moe = c.get("n_routed_experts") is not None
    lead = c.get("first_k_dense_replace")
    if lead is None:
        lead = 0 if has_moe else int(c["num_hidden_layers"])
    writer.add_leading_dense_block_count(int(lead))
    writer.add_vocab_size(int(c["vocab_size"]))
    if c.get("q_lora_rank") is not None:
        writer.add_q_lora_rank(int(c["q_lora_rank"]))
    kv_lora, rope_dim = int(c.get("kv_lora_rank", 512)), int(c["qk_rope_head_dim"])
    writer.add_kv_lora_rank(kv_lora)
    writer.add_key_length(kv_lora + rope_dim)
    writer.add_value_length(kv_lora)
    writer.add_key_length_mla(int(c["qk_nope_head_dim"]) + rope_dim)
    writer.add_value_length_mla(int(c["v_head_dim"]))
    writer.add_expert_feed_forward_length(int(_hp(c, "moe_intermediate_size",
                                                  "intermediate_size")))
    writer.add_expert_shared_count(int(c.get("n_shared_experts") or 0))
    if c.get("routed_scaling_factor") is not None:
        writer.add_expert_weights_scale(float(c["routed_scaling_factor"]))
    if c.get("norm_topk_prob"):
        writer.add_expert_weights_norm(True)
    # transformers' DeepseekV3 router always scores with a sigmoid (official configs say
    # scoring_func "sigmoid"); llama.cpp defaults to softmax when the key is absent
    func = c.get("scoring_func", "sigmoid")
    if func not in ("sigmoid", "softmax"):
        raise WorkbenchError(f"DeepSeek scoring_func {func!r} is not sigmoid or softmax",
                             path=str(t.folder / "config.json"))
    writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if func == "sigmoid"
                                  else gguf.ExpertGatingFuncType.SOFTMAX)
    writer.add_rope_dimension_count(rope_dim)
    r = _rope(c)
    if r.get("mscale_all_dim") is not None:
        # convert_hf_to_gguf writes 0.1 * mscale_all_dim; llama.cpp divides it back by 0.1
        writer.add_rope_scaling_yarn_log_mul(0.1 * float(r["mscale_all_dim"]))


def _hp_bert(writer, t: HFTarget) -> None:
    writer.add_causal_attention(False)
    pooling = _pooling_type(t.folder)
    if pooling is not None:
        writer.add_pooling_type(pooling)


_EXTRA_HPARAMS = {"expert_ff": _hp_expert_ff, "gemma2": _hp_gemma2, "gemma3": _hp_gemma3,
                  "phi3": _hp_phi3, "deepseek2": _hp_deepseek2, "bert": _hp_bert}


def _pooling_type(folder: Path):
    """sentence-transformers' pooling (modules.json -> 1_Pooling/config.json), as convert does."""
    import gguf
    path = folder / "1_Pooling" / "config.json"
    if not path.is_file():
        return None
    from workbench.core.limits import load_sidecar_json
    cfg = load_sidecar_json(path, "1_Pooling/config.json")   # (errors name it)
    if not isinstance(cfg, dict):
        return None
    if cfg.get("pooling_mode_mean_tokens"):
        return gguf.PoolingType.MEAN
    if cfg.get("pooling_mode_cls_token"):
        return gguf.PoolingType.CLS
    if cfg.get("pooling_mode_lasttoken"):
        return gguf.PoolingType.LAST
    return None

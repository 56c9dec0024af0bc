"""Roles and block indices inferred from tensor names, for the common model families.

Covers Llama/Mistral/Qwen (``model.layers.N.self_attn.q_proj.weight``), GPT-2
(``h.N.attn.c_attn.weight``), BERT (``encoder.layer.N.attention.self.query.weight``) and
GGUF (``blk.N.attn_q.weight``) names.
"""

from __future__ import annotations

import re

ROLES = ("embedding", "attn_q", "attn_k", "attn_v", "attn_qkv", "attn_o", "mlp_up", "mlp_gate",
         "mlp_down", "norm", "bias", "lm_head", "conv", "other")

_BLOCK_RE = re.compile(r"(?:^|\.)(?:layers|layer|h|blk|blocks|block|decoder\.layers)\.(\d+)(?:\.|$)")

# (role, pattern) checked in order against the lower-cased name without a trailing .weight
_ROLE_PATTERNS = [
    ("other", r"(position_ids|_ids$|rotary_emb|inv_freq|\.mask$)"),
    ("norm", r"(norm|ln_\d|ln_f|layernorm|\bln\b)"),
    ("embedding", r"(embed|wte|wpe|token_embd|tok_embeddings|position_embd|word_embeddings"
                  r"|position_embeddings|token_type_embeddings|shared$)"),
    ("lm_head", r"(lm_head|^output$|\.output$(?<!attention\.output)|score$)"),
    ("attn_qkv", r"(qkv|c_attn|query_key_value|wqkv|attn_qkv)"),
    ("attn_q", r"(q_proj|\.query$|attn_q$|\.wq$|attention\.q$)"),
    ("attn_k", r"(k_proj|\.key$|attn_k$|\.wk$|attention\.k$)"),
    ("attn_v", r"(v_proj|\.value$|attn_v$|\.wv$|attention\.v$)"),
    ("attn_o", r"(o_proj|out_proj|attn\.c_proj|attention\.output\.dense|attn_output|\.wo$"
               r"|dense$(?<=attention\.output\.dense)|attention\.dense$)"),
    ("mlp_gate", r"(gate_proj|ffn_gate|\.w1$|gate$)"),
    ("mlp_up", r"(up_proj|ffn_up|mlp\.c_fc|intermediate\.dense|\.w3$|fc1|dense_h_to_4h)"),
    ("mlp_down", r"(down_proj|ffn_down|mlp\.c_proj|output\.dense|\.w2$|fc2|dense_4h_to_h)"),
    ("conv", r"(conv)"),
]
_COMPILED = [(role, re.compile(p)) for role, p in _ROLE_PATTERNS]


def _any_role_prefilter():
    """One pattern that finds a match wherever any role pattern does (a superset: the two
    look-arounds dropped), on RE2 (a DFA: linear, fast on 300,000 names), else Python's re."""
    text = "|".join(f"(?:{p})" for _, p in _ROLE_PATTERNS)
    try:
        import re2
        return re2.compile(text.replace(r"(?<!attention\.output)", "")
                           .replace(r"(?<=attention\.output\.dense)", ""))
    except Exception:  # noqa: BLE001 - RE2 missing or refusing: the exact alternation
        return re.compile(text)


_ANY_ROLE = _any_role_prefilter()
_SUFFIX = re.compile(r"\.(weight|w|kernel)$")


def block_index(name: str) -> int | None:
    m = _BLOCK_RE.search(name)
    return int(m.group(1)) if m else None


def infer_role(name: str, ndim: int) -> str:
    low = name.lower()
    if low.endswith(".bias") or low.endswith("_bias"):
        # GPT-2's attn.bias (a 4-D causal mask) and attn.masked_bias (a scalar) are buffers
        if ndim >= 2 or low.endswith("masked_bias"):
            return "other"
        return "bias"
    stem = _SUFFIX.sub("", low)
    try:
        hit = _ANY_ROLE.search(stem)    # one search rules out every pattern (most names)
    except UnicodeEncodeError:          # a lone surrogate: RE2 takes UTF-8 only
        hit = True
    if not hit:
        return "conv" if ndim >= 3 else "other"
    for role, pat in _COMPILED:
        if pat.search(stem):
            if role == "conv" and ndim < 3 and "conv" not in stem:
                continue
            return role
    if ndim >= 3:
        return "conv"
    return "other"


def group_of(name: str, role: str) -> str:
    """The browser group: 'embeddings', 'layer N', 'head' or 'other'."""
    idx = block_index(name)
    if idx is not None:
        return f"layer {idx}"
    if role == "embedding" or "embed" in name.lower() or name.startswith(("wte", "wpe")):
        return "embeddings"
    if role == "lm_head" or role == "norm":
        return "head"
    return "other"

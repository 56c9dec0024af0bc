"""Roles and block indices inferred from tensor names, for the common model families.

Covers Llama/Mistral/Qwen (``model.layers.N.self_attn.q_proj.weight``), GPT-2
(``h.N.attn.c_attn.weight``), BERT (``encoder.layer.N.attention.self.query.weight``) and
GGUF (``blk.N.attn_q.weight``) names.

Mixture-of-experts tensors (docs/moe.md) have three roles of their own:

* ``router`` — the gate that scores experts: ``mlp.gate.weight`` (Qwen-MoE, DeepSeek),
  ``block_sparse_moe.gate.weight`` (Mixtral), ``mlp.router.weight``, Qwen2-MoE's
  ``shared_expert_gate``, DeepSeek-V3's ``e_score_correction_bias``; GGUF ``ffn_gate_inp``,
  ``ffn_gate_inp_shexp``, ``exp_probs_b``. Kept in float by default (workbench.quant.plan).
* ``expert`` — a routed expert's projection: Hugging Face per-expert tensors
  (``mlp.experts.N.{gate,up,down}_proj.weight``, Mixtral ``block_sparse_moe.experts.N.w1/w2/w3``)
  with their expert index N, and merged 3-D tensors holding every expert of a layer
  (GGUF ``blk.N.ffn_{gate,up,down}_exps.weight``, transformers' fused ``mlp.experts.gate_up_proj``
  / ``mlp.experts.down_proj``), numpy shape (n_expert, rows, cols), expert index None.
* ``shared_expert`` — the always-active expert(s): ``mlp.shared_expert(s).*_proj``, GGUF
  ``ffn_{gate,up,down}_shexp``.

:func:`projection` says which projection (gate / up / down / gate_up) an expert tensor is and
:func:`expert_group` names the set of tensors llama.cpp stores as one merged tensor.
"""

from __future__ import annotations

import re

ROLES = ("embedding", "attn_q", "attn_k", "attn_v", "attn_qkv", "attn_o", "mlp_up", "mlp_gate",
         "mlp_down", "norm", "bias", "lm_head", "conv", "router", "expert", "shared_expert",
         "other")
MOE_ROLES = ("router", "expert", "shared_expert")

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

# mixture-of-experts names, checked on the lower-cased full name before the patterns above
_ROUTER_RE = re.compile(
    r"(?:^|\.)(?:mlp|block_sparse_moe|moe|feed_forward)\.(?:gate|router)\.(?:weight|bias)$"
    r"|(?:^|\.)(?:mlp|moe|feed_forward)\.router\.(?:weight|bias)$"
    r"|shared_experts?_gate\.(?:weight|bias)$|e_score_correction_bias$"
    r"|(?:^|\.)ffn_gate_inp(?:_shexp)?\.(?:weight|bias)$|(?:^|\.)exp_probs_b(?:\.bias)?$")
_EXPERT_RE = re.compile(r"\.experts\.(\d+)\.")
_MERGED_RE = re.compile(r"\.experts\.(gate_up_proj|gate_proj|up_proj|down_proj)(?:\.weight)?$"
                        r"|(?:^|\.)ffn_(gate_up|gate|up|down)_exps\.weight$"
                        r"|\.switch_mlp\.(gate_proj|up_proj|down_proj)\.weight$")   # mlx-lm
_SHARED_RE = re.compile(r"\.shared_experts?\.|(?:^|\.)ffn_(?:gate|up|down)_shexp\.weight$")
_PROJ_RE = [("gate_up", re.compile(r"gate_up_proj|ffn_gate_up_exps")),
            ("gate", re.compile(r"gate_proj|\.w1\.weight$|ffn_gate_(?:exps|shexp)")),
            ("up", re.compile(r"up_proj|\.w3\.weight$|ffn_up_(?:exps|shexp)")),
            ("down", re.compile(r"down_proj|\.w2\.weight$|ffn_down_(?:exps|shexp)"))]


def moe_role(name: str) -> str | None:
    """'router', 'expert' or 'shared_expert' for a mixture-of-experts tensor name, else None."""
    low = name.lower()
    if "gate" in low or "router" in low or "exp_probs" in low or "e_score" in low:
        if _ROUTER_RE.search(low):
            return "router"
    if "exp" not in low and "switch_mlp" not in low:
        return None
    if _SHARED_RE.search(low):
        return "shared_expert"
    if _EXPERT_RE.search(low) or _MERGED_RE.search(low):
        return "expert"
    return None


def is_router(name: str) -> bool:
    """moe_role(name) == 'router', without the expert checks (the plan asks it of every tensor)."""
    low = name.lower()
    return ("gate" in low or "router" in low or "exp_probs" in low or "e_score" in low) \
        and _ROUTER_RE.search(low) is not None


def expert_index(name: str) -> int | None:
    """The expert number N of a Hugging Face per-expert tensor (``.experts.N.``); None for
    merged 3-D tensors (every expert) and non-expert tensors."""
    m = _EXPERT_RE.search(name.lower())
    return int(m.group(1)) if m else None


# A name's role and projection depend on its digits in only a few places: after "fc" (fc1,
# fc2), after ".w" (.w1/.w2/.w3), before "h" (dense_4h_to_h), and `ln_\d` / `\bln\b`, which
# take any digit. So they are worked out once per template: the name with ASCII letters
# lower-cased (the patterns see the lower-cased name) and every ASCII digit made "0" (one
# C-level translate of its UTF-8 bytes); a name whose template holds "fc0", ".w0" or "0h" uses the earlier,
# finer template instead (whole dot-separated numbers, block and expert indices, made "0").
# A 100,000-tensor MoE catalog has a few dozen templates; 300,000 names such as "t123" a few.
_INDEX_RE = re.compile(r"(?<=\.)\d+(?=\.|$)")
_TEMPLATE = bytes(c + 32 if 65 <= c <= 90 else 0x30 if 48 <= c <= 57 else c for c in range(256))
_MEMO: dict[tuple, str | None] = {}
_MEMO_MAX = 1 << 16


def _template(name: str):
    """The memo key of a name's role and projection: bytes (UTF-8, ASCII letters lower-cased,
    ASCII digits '0'), or the finer str template (a str never equals a bytes key)."""
    t = name.encode("utf-8", "surrogatepass").translate(_TEMPLATE)
    if b"fc0" in t or b".w0" in t or b"0h" in t:
        return _INDEX_RE.sub("0", name)
    return t


def _memo(kind: str, name: str, ndim: int, fn):
    key = (kind, _template(name), ndim)
    try:
        return _MEMO[key]
    except KeyError:
        v = fn()
        if len(_MEMO) < _MEMO_MAX:
            _MEMO[key] = v
        return v


def projection(name: str) -> str | None:
    """'gate', 'up', 'down' or 'gate_up' for an expert or shared-expert tensor, else None."""
    return _memo("proj", name, 0, lambda: _projection(name))


def _projection(name: str) -> str | None:
    if moe_role(name) not in ("expert", "shared_expert"):
        return None
    low = name.lower()
    for proj, pat in _PROJ_RE:
        if pat.search(low):
            return proj
    return None


def is_merged_experts(name: str, ndim: int) -> bool:
    """A 3-D tensor holding every expert of a layer: (n_expert, rows, cols)."""
    return ndim == 3 and moe_role(name) == "expert"


def expert_group(name: str) -> str | None:
    """The key shared by one projection's experts of one layer — the tensors llama.cpp stores
    as one merged tensor — e.g. 'layer 5 experts down'; a merged tensor is its own group.
    None for everything else."""
    if moe_role(name) != "expert":
        return None
    idx = block_index(name)
    proj = projection(name) or "?"
    return f"layer {idx if idx is not None else '?'} experts {proj}"


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


_FACTS: dict[tuple, tuple] = {}


def grouping(name: str, ndim: int) -> tuple[str, str, str | None]:
    """(role, group, expert group) of a tensor — what `infer_role`, `group_of` and
    `expert_group` give — with what does not depend on the block number worked out once per
    name template (the name with its dot-separated numbers as 0; as the role memo): a
    100,000-tensor catalog is grouped in one regex per name."""
    template = _INDEX_RE.sub("0", name)
    facts = _FACTS.get((template, ndim))
    if facts is None:
        role = infer_role(name, ndim)
        has_block = _BLOCK_RE.search(template) is not None
        expert = moe_role(name) == "expert"
        proj = projection(name) if expert else None
        facts = (role, has_block, group_of(name, role) if not has_block else None, expert,
                 proj or "?")
        if len(_FACTS) < _MEMO_MAX:
            _FACTS[(template, ndim)] = facts
    role, has_block, group, expert, proj = facts
    if has_block:
        idx = block_index(name)
        group = f"layer {idx}"
    else:
        idx = None
    return role, group, (f"layer {idx if idx is not None else '?'} experts {proj}"
                         if expert else None)


def block_index(name: str) -> int | None:
    m = _BLOCK_RE.search(name)
    return int(m.group(1)) if m else None


_ROLE_MEMO: dict[tuple, str] = {}


def infer_role(name: str, ndim: int) -> str:
    key = (_template(name), ndim)
    role = _ROLE_MEMO.get(key)
    if role is None:
        role = _infer_role(name, ndim)
        if len(_ROLE_MEMO) < _MEMO_MAX:
            _ROLE_MEMO[key] = role
    return role


def infer_roles(items) -> list[str]:
    """infer_role of many (name, ndim) pairs: the memo looked up inline (a call per name cost
    more than the look-up when 300,000 tensors are listed)."""
    memo, table, out = _ROLE_MEMO, _TEMPLATE, []
    for name, ndim in items:
        t = name.encode("utf-8", "surrogatepass").translate(table)
        role = memo.get((t, ndim))
        if role is None or b"fc0" in t or b".w0" in t or b"0h" in t:
            role = infer_role(name, ndim)
        out.append(role)
    return out


def _infer_role(name: str, ndim: int) -> str:
    low = name.lower()
    moe = moe_role(name)
    if moe is not None and not (moe != "router" and (low.endswith(".bias"))):
        return moe
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

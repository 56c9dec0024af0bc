"""What a model's tensors say about its network, from their names and shapes alone: the
layers, the embedding and head, the q/k/v and MLP rows, the experts and routers (one pass,
cached on the model). workbench.formats.config_check compares a config with these facts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_LAYER = re.compile(r"^(?P<pre>(?:.*\.)?(?:layers|layer|h|blk|blocks))\.(?P<i>\d{1,12})\."
                    r"(?P<rest>.+)$")
_PER_EXPERT = re.compile(r"^(?:mlp|block_sparse_moe)\.experts\.(?P<x>\d{1,12})\."
                         r"(?P<w>gate_proj|up_proj|down_proj|w1|w2|w3)\.weight$")
_FUSED = re.compile(r"^(?:mlp|block_sparse_moe)\.experts\.(?P<w>gate_up_proj|down_proj|gate_proj|"
                    r"up_proj|w1|w2|w3)(?:\.weight)?$")
_GGUF_EXPS = re.compile(r"^ffn_(?:gate|up|down|gate_up)_exps\.weight$")
_EMBED = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "token_embd.weight",
          "tok_embeddings.weight")
_HEAD = ("lm_head.weight", "output.weight")
_Q = {"self_attn.q_proj.weight", "attention.self.query.weight", "attn_q.weight"}
_K = {"self_attn.k_proj.weight", "attention.self.key.weight", "attn_k.weight"}
_V = {"self_attn.v_proj.weight", "attention.self.value.weight", "attn_v.weight"}
_QKV = {"self_attn.qkv_proj.weight", "attn_qkv.weight"}
_UP = {"mlp.up_proj.weight", "mlp.gate_proj.weight", "intermediate.dense.weight",
       "ffn_up.weight", "ffn_gate.weight"}
_ROUTER = {"mlp.gate.weight", "block_sparse_moe.gate.weight", "ffn_gate_inp.weight"}


@dataclass
class Facts:
    """What the tensors say, from their names and shapes (one pass; cached on the model)."""
    prefix: str | None = None          # the blocks' container ("model.layers", "blk", ...)
    n_layers: int = 0                  # highest block index + 1 under `prefix`
    last_layer: str | None = None      # a tensor of the highest block
    embed: tuple | None = None         # (name, rows, cols) of the token embedding
    head: tuple | None = None          # (name, rows, cols) of the output head
    positions: tuple | None = None     # (name, rows) of a learnt position table
    type_vocab: tuple | None = None    # (name, rows) of BERT's token types
    q: list = field(default_factory=list)     # (name, rows)
    k: list = field(default_factory=list)
    v: list = field(default_factory=list)
    qkv: list = field(default_factory=list)
    c_attn: list = field(default_factory=list)   # GPT-2 (in, 3 x out)
    mla_q: list = field(default_factory=list)    # DeepSeek q_b_proj / q_proj rows
    mla_kv: list = field(default_factory=list)   # DeepSeek kv_b_proj rows
    mla_kv_a: list = field(default_factory=list)  # kv_a_proj_with_mqa rows (kv_lora + rope)
    mla_q_a: list = field(default_factory=list)   # q_a_proj rows (q_lora_rank)
    up: list = field(default_factory=list)        # dense MLP input projections (name, rows)
    gate_up: list = field(default_factory=list)   # Phi-3's fused gate/up (name, rows)
    c_fc: list = field(default_factory=list)      # GPT-2's MLP input (name, columns)
    expert_up: list = field(default_factory=list)  # one expert's up/gate rows (name, rows)
    experts: dict = field(default_factory=dict)   # layer -> {expert indices} (per-expert)
    fused: dict = field(default_factory=dict)     # layer -> [(name, n_expert)] (3-D tensors)
    routers: list = field(default_factory=list)   # (name, rows, cols)
    per_expert_name: dict = field(default_factory=dict)   # layer -> one per-expert tensor
    mtp: set = field(default_factory=set)   # layers with multi-token-prediction tensors


def _shape(info) -> tuple:
    return tuple(int(s) for s in info.shape)


# what only a DeepSeek multi-token-prediction layer holds (past num_hidden_layers)
_MTP = ("eh_proj.", "enorm.", "hnorm.", "shared_head.")
# role of a block tensor by the rest of its name (after "<blocks>.<i>.")
_ROLE = {**{r: "q" for r in _Q}, **{r: "k" for r in _K}, **{r: "v" for r in _V},
         **{r: "qkv" for r in _QKV}, **{r: "up" for r in _UP}, **{r: "router" for r in _ROUTER},
         "attn.c_attn.weight": "c_attn", "self_attn.q_b_proj.weight": "mla_q",
         "self_attn.kv_b_proj.weight": "mla_kv", "mlp.c_fc.weight": "c_fc",
         "self_attn.kv_a_proj_with_mqa.weight": "mla_kv_a", "self_attn.q_a_proj.weight": "mla_q_a",
         "mlp.gate_up_proj.weight": "gate_up"}


def facts(model) -> Facts:
    """The Facts of `model` (one pass over the names; only the tensors with a role are looked
    at further), cached on the model object."""
    cached = model.__dict__.get("_qw_config_facts")
    if cached is not None:
        return cached
    f = Facts()
    per_prefix: dict[str, int] = {}
    layered = []
    match = _LAYER.match
    for name, info in model.tensors.items():
        m = match(name)
        if m is not None:
            pre, i, rest = m.groups()
            per_prefix[pre] = per_prefix.get(pre, 0) + 1
            layered.append((pre, i, rest, name, info))
            continue
        shape = info.shape
        if len(shape) == 2:
            tail = ".".join(name.rsplit(".", 2)[-2:])
            if f.embed is None and tail in _EMBED:
                f.embed = (name, int(shape[0]), int(shape[1]))
            elif f.head is None and (name in _HEAD or tail in _HEAD):
                f.head = (name, int(shape[0]), int(shape[1]))
            elif f.positions is None and tail in ("wpe.weight", "position_embeddings.weight"):
                f.positions = (name, int(shape[0]))
            elif f.type_vocab is None and tail == "token_type_embeddings.weight":
                f.type_vocab = (name, int(shape[0]))
    if per_prefix:
        f.prefix = max(per_prefix, key=lambda p: (per_prefix[p], -len(p)))
    top = -1
    role_of = _ROLE.get
    for pre, i, rest, name, info in layered:
        if pre != f.prefix:
            continue
        role = role_of(rest)
        i = int(i)
        if i > top:
            top, f.last_layer = i, name
        if role is None and "experts." not in rest and "_exps." not in rest:
            if rest.startswith(_MTP):
                f.mtp.add(i)
            continue
        shape = _shape(info)
        rows = shape[0] if shape else 0
        if role in ("q", "k", "v", "qkv", "mla_q", "mla_kv", "mla_kv_a", "mla_q_a"):
            getattr(f, role).append((name, rows))
        elif role in ("c_attn", "c_fc"):
            if len(shape) == 2:
                getattr(f, role).append((name, shape[1]))    # GPT-2's Conv1D: (in, out)
        elif role in ("up", "gate_up"):
            if len(shape) == 2:
                getattr(f, role).append((name, rows))
        elif role == "router":
            if len(shape) == 2:
                f.routers.append((name, shape[0], shape[1]))
        elif (pm := _PER_EXPERT.match(rest)) is not None:
            f.experts.setdefault(i, set()).add(int(pm.group("x")))
            f.per_expert_name.setdefault(i, name)
            if pm.group("w") in ("up_proj", "gate_proj", "w1", "w3") and len(shape) == 2:
                f.expert_up.append((name, rows))
        elif len(shape) == 3 and (_FUSED.match(rest) or _GGUF_EXPS.match(rest)):
            f.fused.setdefault(i, []).append((name, shape[0]))
    f.n_layers = top + 1
    model.__dict__["_qw_config_facts"] = f
    return f

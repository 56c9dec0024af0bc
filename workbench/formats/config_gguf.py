"""A GGUF's own hyper-parameters (``<arch>.block_count``, ``expert_count`` ...) against its
tensors, before a GGUF→GGUF export copies them: the checks of workbench.formats.config_check
under the GGUF's key names. llama.cpp's per-layer arrays (``attention.head_count``,
``attention.head_count_kv``, ``feed_forward_length``: one value per block) are read as llama.cpp
reads them: one integer per block (else refused, naming the key), a uniform array as its single
value, and each layer's q/k/v and MLP rows checked against that layer's values.
"""

from __future__ import annotations

import re

from workbench.core.errors import WorkbenchError
from workbench.formats.config_check import MAX_COUNT, _Checker
from workbench.formats.config_facts import Facts, facts

_GGUF_KEYS = {   # config key -> the GGUF key (after "<arch>.")
    "num_hidden_layers": "block_count", "hidden_size": "embedding_length",
    "num_attention_heads": "attention.head_count",
    "num_key_value_heads": "attention.head_count_kv", "head_dim": "attention.key_length",
    "vocab_size": "vocab_size", "num_local_experts": "expert_count",
    "num_experts_per_tok": "expert_used_count", "intermediate_size": "feed_forward_length",
    "moe_intermediate_size": "expert_feed_forward_length",
}


def check_gguf_metadata(model) -> None:
    """A GGUF's hyper-parameters (``<arch>.block_count``, ``expert_count`` ...) against its
    tensors, before a GGUF→GGUF export copies them."""
    md = model.metadata or {}
    arch = md.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        return
    cfg, per_layer = {}, {}
    for ck, gk in _GGUF_KEYS.items():
        v = md.get(f"{arch}.{gk}")
        if isinstance(v, bool) or v is None:
            continue
        if hasattr(v, "dtype") and getattr(v, "ndim", 1) == 0 and v.dtype.kind in "iu":
            v = int(v)                      # a numpy scalar from the reader
        if isinstance(v, list) and gk in _PER_LAYER_KEYS:
            v = per_layer_value(v, f"{arch}.{gk}", md.get(f"{arch}.block_count"), model.path)
            if isinstance(v, list):
                per_layer[ck] = v
                continue
        if not isinstance(v, int):
            continue
        cfg[ck] = v
    if md.get(f"{arch}.attention.key_length_mla") is not None or \
            md.get(f"{arch}.attention.value_length", cfg.get("head_dim")) != cfg.get("head_dim"):
        cfg.pop("head_dim", None)           # MLA / different k and v sizes: not q/k/v rows
        cfg.pop("num_attention_heads", None)
        cfg.pop("num_key_value_heads", None)
    # without attention.key_length the head size is llama.cpp's default, n_embd / n_head,
    # which _Checker derives the same way
    if md.get(f"{arch}.expert_count") is None:
        cfg.pop("num_experts_per_tok", None)
    if md.get(f"{arch}.expert_count") == 0 and not facts(model).fused:
        cfg.pop("num_local_experts", None)      # llama.cpp writes 0 for a dense model
    labels = {ck: f"{arch}.{gk}" for ck, gk in _GGUF_KEYS.items()}
    ch = _Checker(cfg, model.path, lambda k: labels.get(k, k), what="the GGUF's metadata")
    ch.types()
    if per_layer:       # the layers' own values: the per-layer checks below
        attn = {"num_attention_heads", "num_key_value_heads"}
        for k in (attn if attn & set(per_layer) else set()) | set(per_layer):
            cfg.pop(k, None)
    ch.tensors(facts(model))
    if per_layer:
        _check_per_layer(ch, facts(model), {**md_ints(md, arch), **cfg}, per_layer, labels)


#: GGUF keys llama.cpp reads as one value or one per layer (llama_model_loader::get_key_or_arr)
_PER_LAYER_KEYS = ("attention.head_count", "attention.head_count_kv", "feed_forward_length")
_BLK = re.compile(r"^blk\.(\d{1,12})\.")


def md_ints(md: dict, arch: str) -> dict:
    """The scalar integers among a GGUF's hyper-parameters, as config keys."""
    out = {}
    for ck, gk in _GGUF_KEYS.items():
        v = md.get(f"{arch}.{gk}")
        if isinstance(v, int) and not isinstance(v, bool):
            out[ck] = v
    return out


def per_layer_value(v: list, key: str, blocks, path):
    """A per-layer array as llama.cpp reads it: one integer per block (else refused naming
    the key); the single value where every layer has the same."""
    if not v or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise WorkbenchError(f"{key} is an array that is not of integers", path=path)
    if not all(0 <= x <= MAX_COUNT for x in v):
        raise WorkbenchError(f"{key} holds a value outside [0, {MAX_COUNT:,}]", path=path)
    if isinstance(blocks, int) and len(v) != blocks:
        raise WorkbenchError(f"{key} has {len(v)} values for {blocks} layers (block_count): "
                             "llama.cpp refuses it too", path=path)
    return int(v[0]) if len(set(v)) == 1 and v[0] > 0 else list(v)


def _check_per_layer(ch: _Checker, f: Facts, cfg: dict, per_layer: dict, labels: dict) -> None:
    """q/k/v rows and MLP rows of each layer against that layer's head counts and width."""
    def value(k, i):
        v = per_layer.get(k, cfg.get(k))
        return v[i] if isinstance(v, list) and i < len(v) else (None if isinstance(v, list)
                                                               else v)

    def layer(name):
        m = _BLK.match(name)
        return int(m.group(1)) if m else None

    hidden = cfg.get("hidden_size")
    for rows_list, k in ((f.q, "num_attention_heads"), (f.k, "num_key_value_heads"),
                         (f.v, "num_key_value_heads")):
        for name, rows in rows_list:
            i = layer(name)
            if i is None:
                continue
            n, heads = value(k, i), value("num_attention_heads", i)
            if n is None and k == "num_key_value_heads":
                n = heads
            hd = cfg.get("head_dim") or (hidden // heads if hidden and heads else None)
            if n is None or hd is None:
                continue
            if rows != n * hd:
                ch.fail(f"{labels[k]} of layer {i} is {n} (× head size {hd} = {n * hd:,} "
                        f"rows), but {name} has {rows:,} rows")
    for name, rows in f.up:
        i = layer(name)
        ff = value("intermediate_size", i) if i is not None else None
        if ff is not None and rows != ff:
            ch.fail(f"{labels['intermediate_size']} of layer {i} is {ff}, but {name} has "
                    f"{rows:,} rows")

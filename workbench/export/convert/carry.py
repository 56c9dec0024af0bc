"""Every tensor of a GGUF carried into the Hugging Face model, or a refusal naming it.

transformers' GGUF config leaves out what llama.cpp reads from tensors rather than keys:

* optional biases. llama.cpp's llama (and qwen3, gemma) graphs add ``blk.N.attn_{q,k,v,output}
  .bias`` and ``blk.N.ffn_{gate,up,down}.bias`` wherever the file has them, each on its own.
  The config's ``attention_bias`` / ``mlp_bias`` (where the model type has them) are set when
  the GGUF holds any of their biases; the biases the flag adds to the network that the GGUF
  lacks are zero (what llama.cpp adds for them), served by the FloatView
  (:meth:`~workbench.export.convert.source.FloatView.add_zeros`);
* Llama 3's ``rope_freqs`` (per-frequency rope factors): written as the config's llama3
  ``rope_parameters``, fitted to the factors and checked to give them back; factors that no
  llama3 scaling gives are refused.

A tensor that still finds no place (HFNames: the runner's mapping) is refused, naming it.
"""

from __future__ import annotations

import math
import re

import numpy as np

from workbench.core.errors import WorkbenchError

FLAGS = {"attention_bias": ("attn_q", "attn_k", "attn_v", "attn_output"),
         "mlp_bias": ("ffn_gate", "ffn_up", "ffn_down")}
_BIAS = re.compile(r"blk\.(\d+)\.(\w+)\.bias$")
ROPE_FREQS = "rope_freqs.weight"
#: config keys llama.cpp may store one value per layer (llama_model_loader::get_key_or_arr)
PER_LAYER = {"num_key_value_heads": "attention.head_count_kv",
             "num_attention_heads": "attention.head_count",
             "intermediate_size": "feed_forward_length"}


def per_layer_scalars(parsed: dict, fields: dict, arch: str, path: str) -> None:
    """transformers' parsed GGUF config with llama.cpp's per-layer arrays (one value per
    block: ``{arch}.attention.head_count_kv`` ...; `fields`: the GGUF's key/values, as the
    project's reader holds them) as the single value transformers' config takes, where every
    layer has the same; else refused, naming the key (transformers' configs of these
    architectures have one value for all layers). The arrays are read from the file itself:
    transformers makes a one-item array a single value, whatever the block count."""
    from workbench.formats.config_gguf import per_layer_value
    blocks = fields.get(f"{arch}.block_count")
    blocks = blocks.contents() if blocks is not None else None
    for ck, gk in PER_LAYER.items():
        f = fields.get(f"{arch}.{gk}")
        if f is None or int(f.types[0]) != 9:
            continue
        key = f"{arch}.{gk}"
        one = per_layer_value(f.contents(), key, blocks, path)
        if isinstance(one, list):
            if len(set(one)) == 1:
                raise WorkbenchError(f"{key} is {one[0]} in every layer: transformers' "
                                     f"{parsed.get('model_type', arch)} needs at least 1",
                                     path=path)
            shown = ", ".join(str(x) for x in one[:8]) + (", ..." if len(one) > 8 else "")
            raise WorkbenchError(f"{key} differs between layers ({shown}): transformers' "
                                 f"{parsed.get('model_type', arch)} has one value for every "
                                 "layer, so it cannot be converted", path=path)
        parsed[ck] = one


def carry(cfg: dict, view) -> dict:
    """Set in `cfg` (the config.json dict) what the GGUF of `view` holds as tensors beyond
    transformers' GGUF config, and add to `view` the zero biases the flags imply. Returns
    {tensor: config key} of the tensors carried by the config alone (rope_freqs)."""
    model = view.model
    names = set(model.tensors)
    layers = sorted({int(m.group(1)) for n in names if (m := _BIAS.match(n))})
    for flag, kinds in FLAGS.items():
        have = [n for n in names if (m := _BIAS.match(n)) and m.group(2) in kinds]
        if not have or flag not in cfg:
            continue        # no place for them: the mapping refuses, naming the first
        cfg[flag] = True
        for i in layers + [i for i in range(_blocks(cfg)) if i not in layers]:
            for k in kinds:
                w, b = f"blk.{i}.{k}.weight", f"blk.{i}.{k}.bias"
                if b not in names and w in names:
                    view.add_zeros(b, model.info(w).matrix_shape[0])
    carried = {}
    if ROPE_FREQS in names:
        carried[ROPE_FREQS] = _carry_rope_freqs(cfg, view)
    return carried


def _blocks(cfg: dict) -> int:
    n = cfg.get("num_hidden_layers")
    return n if isinstance(n, int) and 0 < n < 1 << 16 else 0


def _rope(cfg: dict) -> dict:
    r = cfg.get("rope_parameters")
    return r if isinstance(r, dict) else {}


def llama3_factors(base: float, dim: int, p: dict) -> np.ndarray:
    """The factors llama.cpp divides each rope frequency by for llama3 scaling `p`
    (transformers' formula, in float64)."""
    freqs = 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    wl = 2 * math.pi / freqs
    old, low, high = (float(p["original_max_position_embeddings"]), float(p["low_freq_factor"]),
                      float(p["high_freq_factor"]))
    s = (old / wl - low) / (high - low)
    inv = np.where(wl > old / low, 1.0 / p["factor"], 1.0)
    mid = (wl >= old / high) & (wl <= old / low)
    inv = np.where(mid, (1 - s) / p["factor"] + s, inv)
    return 1.0 / inv


def _carry_rope_freqs(cfg: dict, view) -> str:
    """Llama 3's rope factors as the config's llama3 rope_parameters (see fit_llama3)."""
    model = view.model
    info = model.info(ROPE_FREQS)
    heads = cfg.get("num_attention_heads") or 1
    dim = cfg.get("head_dim") or (cfg.get("hidden_size") or 0) // heads
    base = _rope(cfg).get("rope_theta", cfg.get("rope_theta"))
    if "rope_parameters" not in cfg or not isinstance(base, (int, float)) or not dim \
            or info.numel != dim // 2:
        raise WorkbenchError(f"a {info.numel}-value rope_freqs that transformers' "
                             f"{cfg.get('model_type')} config cannot take (head size {dim}): "
                             "not converted", path=model.path, tensor=ROPE_FREQS)
    f = np.asarray(view.read(ROPE_FREQS), np.float64).reshape(-1)
    p = fit_llama3(f, float(base), int(dim))
    if p is None:
        raise WorkbenchError("rope factors that no llama3 rope scaling gives (transformers "
                             "computes the rotary frequencies from config.json): not converted",
                             path=model.path, tensor=ROPE_FREQS)
    if p:
        cfg["rope_parameters"] = {**_rope(cfg), "rope_type": "llama3", **p}
    return "rope_parameters"


def fit_llama3(f: np.ndarray, base: float, dim: int) -> dict | None:
    """llama3 rope parameters (factor, low/high_freq_factor, original_max_position_embeddings)
    that give the factors `f` back (relative 1e-5), {} for all ones (the default rope), None
    where none do. The smooth part is s = c0 + c1 / wavelength: a line through its points
    (or, with fewer than two, any line that keeps the ones and the full factors on their sides);
    low_freq_factor is taken as 1 where the line allows (Llama 3's value)."""
    if not np.all(np.isfinite(f)) or np.any(f <= 0):
        return None
    if np.allclose(f, 1.0, rtol=1e-6, atol=0):
        return {}
    factor = float(f.max())
    x = (1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)) / (2 * math.pi)
    ones = np.isclose(f, 1.0, rtol=1e-6, atol=0)
    full = np.isclose(f, factor, rtol=1e-6, atol=0)
    mid = ~ones & ~full
    s = (1.0 / f - 1.0 / factor) / (1.0 - 1.0 / factor)
    xf = x[full].max() if full.any() else None       # s < 0 there
    xo = x[ones].min() if ones.any() else None       # s > 1 there
    if mid.sum() >= 2:
        c1, c0 = np.polyfit(x[mid], s[mid], 1)
    else:
        if mid.any():
            xm, sm = float(x[mid][0]), float(s[mid][0])
        elif xf is not None and xo is not None:
            xm, sm = (xf + xo) / 2, 0.5
        else:
            return None
        bounds = [sm / (xm - xf) if xf is not None and xm > xf else 0.0,
                  (1 - sm) / (xo - xm) if xo is not None and xo > xm else 0.0]
        c1 = 2 * max(bounds) or 1.0 / xm
        c0 = sm - c1 * xm
    if not c1 > 0:
        return None
    span = -1.0 / c0 if c0 < 0 else 1.0      # high - low with low = 1 where c0 < 0
    low = 1.0 if c0 < 0 else -c0 * span
    p = {"factor": factor, "low_freq_factor": low, "high_freq_factor": low + span,
         "original_max_position_embeddings": c1 * span}
    if not (low > 0 and p["original_max_position_embeddings"] > 0):
        return None
    def fits(q: dict) -> bool:
        return bool(np.allclose(llama3_factors(base, dim, q), f, rtol=1e-5, atol=0))

    if not fits(p):
        return None
    # round values (float32 factors) where the rounded value still gives the factors back:
    # 4.0 rather than 4.0000009, an integer context length (8192)
    for k, digits in (("original_max_position_embeddings", 0), ("high_freq_factor", 3),
                      ("low_freq_factor", 3), ("factor", 4)):
        q = {**p, k: round(p[k]) if digits == 0 else round(p[k], digits)}
        if q[k] > 0 and fits(q):
            p = q
    return p

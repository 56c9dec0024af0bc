"""The tensor layout changes llama.cpp's converter makes (`transform`): Llama/Mistral q/k rows
permuted to its rope layout, Gemma's norms stored as 1 + w and its queries scaled to llama.cpp's
attention scale, GPT-2's Conv1D weights transposed.
"""

from __future__ import annotations

import re

import numpy as np

from workbench.export.gguf_arch import HFTarget, _hp
from workbench.formats.llama_names import CONV1D


# Llama/Mistral q/k projections (weights and biases) convert_hf_to_gguf permutes for the rope
_ROPE_PERMUTED = re.compile(r"self_attn\.(q|k)_proj\.(weight|bias)$")


def _norm_plus_one(t: HFTarget, hf_name: str) -> bool:
    return t.spec.norm_plus_one and hf_name.endswith("norm.weight")


# the tensor that carries a Gemma query scale llama.cpp cannot be told (see _query_scale)
_QUERY_SCALED = {"GEMMA3": re.compile(r"self_attn\.q_norm\.weight$"),
                 "GEMMA2": re.compile(r"self_attn\.q_proj\.(weight|bias)$")}
# llama.cpp's "27B" Gemma (by block count) scales queries by 1/sqrt(n_embd / n_head)
_GEMMA_27B_BLOCKS = {"GEMMA2": 46, "GEMMA3": 62}


def _query_scale(t: HFTarget) -> float | None:
    """The factor folded into Gemma's queries so that llama.cpp's attention scale equals
    transformers' (None: they already agree). transformers scales q.k by
    query_pre_attn_scalar^-1/2; llama.cpp's gemma2/gemma3 fix it at head_dim^-1/2 (n_embd /
    n_head for the block counts it takes for 27B) and read no key for it. A config whose
    query_pre_attn_scalar differs (e.g. a generated one) would otherwise run a different
    network at every length: the queries are multiplied by sqrt(llama's / transformers'),
    in Gemma 3's q_norm weight (applied before the rope, which is linear) or Gemma 2's q_proj
    (it has no q_norm); exact up to rounding."""
    a = t.arch.gguf_arch
    if a not in _QUERY_SCALED:
        return None
    c = t.config
    qpas = float(_hp(c, "query_pre_attn_scalar", default=256))
    n_embd, n_head = int(c["hidden_size"]), int(c["num_attention_heads"])
    head_dim = int(_hp(c, "head_dim") or n_embd // n_head)
    ours = n_embd // n_head if t.arch.n_blocks == _GEMMA_27B_BLOCKS[a] else head_dim
    if qpas <= 0 or float(ours) == qpas:
        return None
    return float(np.sqrt(ours / qpas))


def _query_scaled(t: HFTarget, hf_name: str) -> bool:
    rx = _QUERY_SCALED.get(t.arch.gguf_arch)
    return rx is not None and bool(rx.search(hf_name)) and _query_scale(t) is not None


def transform(t: HFTarget, hf_name: str, w: np.ndarray) -> np.ndarray | None:
    """The layout llama.cpp expects for this tensor (None: unchanged).

    * Llama/Mistral q_proj/k_proj rows (weights and biases) are permuted from Hugging Face's rotate-half rope layout
      to llama.cpp's interleaved one (convert_hf_to_gguf ``LlamaModel.permute``).
    * Gemma RMSNorm weights w are stored as 1 + w (Hugging Face's Gemma norms multiply by
      1 + w; llama.cpp's by the stored weight), in float32.
    * Gemma queries scaled when query_pre_attn_scalar is not llama.cpp's (_query_scale).
    * GPT-2 Conv1D weights are stored (in, out) and transposed."""
    a = t.arch.gguf_arch
    if a == "GPT2" and CONV1D.search(hf_name) and w.ndim == 2:
        return np.ascontiguousarray(w.T)
    if _norm_plus_one(t, hf_name):
        w = np.asarray(w, np.float32) + np.float32(1.0)
        return w * np.float32(_query_scale(t)) if _query_scaled(t, hf_name) else w
    if _query_scaled(t, hf_name):
        return (np.asarray(w, np.float32) * np.float32(_query_scale(t))).astype(w.dtype)
    if t.spec.permute_qk and _ROPE_PERMUTED.search(hf_name):
        n_head = int(_hp(t.config, "num_attention_heads"))
        if ".k_proj." in hf_name:
            n_head = int(_hp(t.config, "num_key_value_heads", default=n_head))
        rows = w.shape[0]
        return np.ascontiguousarray(
            w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))
    return None


def transformed_shape(t: HFTarget, hf_name: str, shape: tuple) -> tuple:
    if t.arch.gguf_arch == "GPT2" and CONV1D.search(hf_name) and len(shape) == 2:
        return (shape[1], shape[0])
    return shape


def needs_transform(t: HFTarget, hf_name: str) -> bool:
    a = t.arch.gguf_arch
    return (a == "GPT2" and bool(CONV1D.search(hf_name))) or _norm_plus_one(t, hf_name) or (
        t.spec.permute_qk and bool(_ROPE_PERMUTED.search(hf_name))) or _query_scaled(t, hf_name)

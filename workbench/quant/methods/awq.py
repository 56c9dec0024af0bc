"""AWQ (Lin et al. 2023): per-input-channel scales s = s_x^α (s_x = E|x_j|) that protect the
channels with large activations, searched over α on a 20-point grid in [0, 1) to minimise the
layer output error ‖X Wᵀ − X (Q(W·diag(s))·diag(s)⁻¹)ᵀ‖² on a sample of inputs X, then (integer
schemes) a clip search: per block the range shrink ratio (1.0 .. 0.55, 10 steps) with the least
output error of that block's partial product.

What is stored, precisely: a weight-only format cannot hold diag(s)⁻¹ apart from the weights,
so the tensor stored is Q(W·diag(s)) (meta ``awq_scale`` = s) and the 1/s must be folded into
the op producing the layer's input — exact only there:
  BERT: attention.output.dense ← value (rows/s). BERT is post-LN: a LayerNorm's output is both
        the next q/k/v (or intermediate) input and the residual, so dividing γ/β by s would change
        the residual stream — q/k/v, intermediate and output.dense (after GELU) get no fold.
  Llama-style: q/k/v ← input_layernorm; gate/up ← post_attention_layernorm;
        down_proj ← up_proj (rows/s); o_proj ← v_proj when v has as many rows as o has columns.
``fold_target(name)`` names it; a tensor without one gets the clip search only (s = 1).
``Method.effective_weight(qt, scheme)`` is Q(W·diag(s))·diag(s)⁻¹, the weight the folded model
computes with.
"""

from __future__ import annotations

import re

import numpy as np

from workbench.schemes.base import QuantizedTensor
from workbench.schemes.ggml.common import GGMLScheme
from workbench.quant.methods import intq
from workbench.quant.methods.base import Method

ALPHAS = np.arange(20) / 20.0
CLIP_RATIOS = 1.0 - np.arange(10) / 20.0
MAX_ROWS = 512   # input rows used by the searches

_FOLDS = [
    (r"^(.*encoder\.layer\.\d+\.attention\.)output\.dense\.weight$", "bert-o"),
    (r"^(.*layers\.\d+\.)self_attn\.(q|k|v)_proj\.weight$", "llama-qkv"),
    (r"^(.*layers\.\d+\.)self_attn\.o_proj\.weight$", "llama-o"),
    (r"^(.*layers\.\d+\.)mlp\.(gate|up)_proj\.weight$", "llama-gateup"),
    (r"^(.*layers\.\d+\.)mlp\.down_proj\.weight$", "llama-down"),
]


def fold_target(name: str) -> str | None:
    """The tensor (prefix, without .weight) that absorbs 1/s for `name`, or None."""
    for pat, kind in _FOLDS:
        m = re.match(pat, name)
        if not m:
            continue
        return {"bert-o": m.group(1) + "self.value",
                "llama-qkv": m.group(1) + "input_layernorm",
                "llama-o": m.group(1) + "self_attn.v_proj",
                "llama-gateup": m.group(1) + "post_attention_layernorm",
                "llama-down": m.group(1) + "mlp.up_proj"}[kind]
    return None


def _rtn(scheme, w):
    from workbench.quant.evaluate import quantize
    return quantize(np.ascontiguousarray(w, np.float32), scheme.name)


def _out_err(X, W, Wq) -> float:
    D = X @ (W - Wq).T
    return float(np.einsum("ij,ij->", D, D, dtype=np.float64))


def search_scale(Ws, X, mean_abs, scheme):
    """(s, alpha): the scale minimising the summed output error of the consumers Ws."""
    X = np.asarray(X, np.float32)[:MAX_ROWS]
    sx = np.maximum(np.asarray(mean_abs, np.float64), 1e-8)
    best = (np.inf, None, 0.0)
    for a in ALPHAS:
        s = sx ** a
        s = s / np.sqrt(s.max() * s.min())
        s = s.astype(np.float32)
        err = 0.0
        for W in Ws:
            qt = _rtn(scheme, W * s[None, :])
            err += _out_err(X, W, scheme.dequantize(qt).reshape(W.shape) / s[None, :])
        if err < best[0]:
            best = (err, s, a)
    return best[1], best[2]


def clip_search(scheme, Ws, Xs):
    """Integer schemes: per block, the range-shrink ratio with the least output error of the
    block's partial product (inputs Xs = X·diag(s)⁻¹, weights Ws = W·diag(s)); symmetric
    schemes try their own divisor-searched scale first (ties keep it)."""
    rows, cols = Ws.shape
    G = intq.group_len(scheme, cols)
    blocks = intq.as_blocks(Ws, scheme.gran)
    per_tensor = blocks.shape[0] == 1 and rows > 1
    if per_tensor:
        return None
    if scheme.asym:
        lo, hi = scheme._range_asym(blocks)
    else:
        lo, hi = None, scheme._range_sym(blocks)
    ng = cols // G
    best_err = np.full(blocks.shape[0], np.inf)
    best_scale = best_zero = None
    cands = [(lo, hi, r) for r in CLIP_RATIOS]
    if lo is None:                       # symmetric: the scheme's own searched scale first
        cands.insert(0, None)
    for cand in cands:
        if cand is None:
            scale, zero = scheme.choose_qparams(blocks)
        else:
            r = np.float32(cand[2])
            scale, zero = intq.qparams_from_range(scheme, None if lo is None else lo * r, hi * r)
        diff = (intq.fake(scheme, blocks, scale, zero) - blocks).reshape(rows, ng, G)
        err = np.empty((rows, ng))
        for g in range(ng):
            D = Xs[:, g * G:(g + 1) * G] @ diff[:, g, :].T
            err[:, g] = np.einsum("ij,ij->j", D, D, dtype=np.float64)
        err = err.reshape(-1)
        better = err < best_err
        if best_scale is None:
            best_scale, best_zero = scale.copy(), None if zero is None else zero.copy()
        best_err = np.where(better, err, best_err)
        best_scale = np.where(better, scale, best_scale)
        if zero is not None:
            best_zero = np.where(better, zero, best_zero)
    return best_scale.astype(scheme.scale_dtype), best_zero


def ggml_clip_search(scheme, Ws, Xs):
    """GGML block formats: AWQ's clip search as weight clamping (its ``auto_clip``): per
    (row, block), the weights clamped to r·max|w| (r in CLIP_RATIOS) before the format's own
    quantizer, keeping the encoded block with the least output error of the block's partial
    product. r = 1 is RTN's block. Returns the QuantizedTensor (None when the tensor's rows do
    not split into whole blocks)."""
    rows, cols = Ws.shape
    B = getattr(scheme, "block_size", None)
    if not B or cols % B:
        return None
    nb = cols // B
    blocks = Ws.reshape(rows, nb, B)
    amax = np.abs(blocks).max(axis=2, keepdims=True)
    best_err = np.full((rows, nb), np.inf)
    best = template = None
    for r in CLIP_RATIOS:
        lim = amax * np.float32(r)
        wc = np.clip(blocks, -lim, lim).reshape(rows, cols)
        qt = _rtn(scheme, wc)
        arr = np.ascontiguousarray(qt.arrays["blocks"])
        raw = arr.view(np.uint8).reshape(rows, nb, -1)
        diff = (scheme.dequantize(qt).reshape(rows, cols) - Ws).reshape(rows, nb, B)
        err = np.empty((rows, nb))
        for g in range(nb):
            D = Xs[:, g * B:(g + 1) * B] @ diff[:, g, :].T
            err[:, g] = np.einsum("ij,ij->j", D, D, dtype=np.float64)
        if best is None:
            best, template = raw.copy(), (arr.dtype, arr.shape, qt)
            best_err = err
            continue
        better = err < best_err
        best[better] = raw[better]
        best_err = np.where(better, err, best_err)
    dtype, shape, qt0 = template
    blocks_out = np.ascontiguousarray(best.reshape(rows, -1)).view(dtype).reshape(shape)
    return QuantizedTensor(qt0.scheme, qt0.shape, {"blocks": blocks_out}, {})


class AWQ(Method):
    name = "awq"
    needs = ("X", "mean_abs")
    description = "AWQ: activation-aware input-channel scales (folded into the previous op) + clip search"

    def _quantize(self, w, scheme, stats, *, tensor=None, fold: bool | None = None,
                  scale=None, **opts):
        """`fold`: whether the 1/s can be folded (default: fold_target(tensor) exists);
        `scale`: a scale already searched for all consumers of the same input."""
        if fold is None:
            fold = tensor is not None and fold_target(tensor) is not None
        X = np.asarray(stats.X, np.float32)[:MAX_ROWS]
        meta = {"method": self.name}
        s = None
        if fold:
            s = scale if scale is not None else search_scale([w], X, stats.mean_abs, scheme)[0]
            s = np.asarray(s, np.float32)
            if np.all(s == 1):
                s = None
        ws = w if s is None else np.ascontiguousarray(w * s[None, :])
        xs = X if s is None else X / s[None, :]
        qt = None
        if intq.is_int(scheme):
            got = clip_search(scheme, ws, xs)
            if got is not None:
                sc, z = got
                wb = intq.as_blocks(ws, scheme.gran)
                qt = intq.build(scheme, w.shape, intq.codes_for(scheme, wb, sc, z), sc, z, meta)
        elif isinstance(scheme, GGMLScheme):
            got = ggml_clip_search(scheme, ws, xs)
            if got is not None:
                qt = QuantizedTensor(got.scheme, got.shape, got.arrays, meta)
        if qt is None:
            q = _rtn(scheme, ws)
            qt = QuantizedTensor(q.scheme, q.shape, q.arrays, meta)
        if s is not None:
            qt.meta["awq_scale"] = s
        return qt

"""Importance-weighted quantization for the MLX schemes (the ``imatrix`` method): per group,
the stored scale and bias (affine) or scale byte (mxfp4 / nvfp4 / mxfp8) that minimise
Σ_j d_j (w_j − ŵ_j)², d_j = E[x_j²] of the input channel, with ŵ the value mx.dequantize
gives (the stored parameters, rounded to their dtype, and mlx's arithmetic). The bytes are
those of the scheme's layout, so the size is the scheme's.

Affine candidates: mlx's own parameters (so the weighted error is never above its rounding),
the range [lo, hi] shrunk from either end by a grid of fractions (codes = nearest of the
shrunk range, clipped), each also refitted by weighted least squares of w on its codes
(scale and bias); the candidate whose *dequantized* group has the least weighted error wins.
Microscaling: the scale byte mlx picks and its neighbours (E8M0: ±1, ±2 exponents; E4M3: ±1..4
codes), codes the nearest values; the least weighted error wins.

The search runs in the numba kernels of kernels/mlx_weighted.py (per group, no temporaries,
rows in parallel), which give exactly the bytes of the numpy reference here (`affine_ref`,
`fp_ref`; tests/kernels/test_mlx_weighted_kernels.py); the reference runs only where numba is
not installed, with a warning.
"""

from __future__ import annotations

import functools
import importlib.util
import warnings

import numpy as np

from workbench.schemes.base import QuantizedTensor
from workbench.schemes.mlx import reference as ref

F = np.float32
#: the fractions of the range taken off the low and the high end (affine candidates)
SHRINK = np.array([0.0, 0.02, 0.05, 0.08, 0.12, 0.16, 0.2], F)
FP_STEPS = {"mxfp4": (-2, -1, 1, 2), "mxfp8": (-2, -1, 1, 2), "nvfp4": (-4, -3, -2, -1, 1, 2)}


def _deq_affine(codes, s, b, bits, group, dt):
    """mx.dequantize of per-group stored (float32 values of) s, b and uint8 codes (G, n)."""
    sq = ref.round_to(s[:, None] * codes.astype(F), dt)
    return ref.round_to(sq + b[:, None], dt)


def _werr(w, deq, imp):
    d = (w - deq).astype(np.float64)
    return (d * d * imp).sum(axis=1)


def affine_ref(scheme, w, imp):
    """numpy reference: (codes (rows, cols) uint8, scales, biases: float32 values of the stored
    dtype) of the weighted search of `w` (already in the scheme's dtype)."""
    rows, cols = w.shape
    bits, g, dt = scheme.bits, scheme.group, scheme.scale_dtype
    nb = (1 << bits) - 1
    x = w.reshape(-1, g)
    q = np.broadcast_to(imp.reshape(1, -1, g), (rows, cols // g, g)).reshape(-1, g)
    # mlx's own parameters first (ties keep it)
    s0, b0 = ref.affine_params(w, bits, g)
    s0, b0 = s0.reshape(-1), b0.reshape(-1)
    c0 = np.clip(np.rint((x - b0[:, None]) / s0[:, None]), 0, nb)
    bs, bb = ref.round_to(s0, dt), ref.round_to(b0, dt)
    best_c = c0.astype(np.uint8)
    best_e = _werr(x, _deq_affine(best_c, bs, bb, bits, g, dt), q)
    lo, hi = x.min(axis=1), x.max(axis=1)
    span = hi - lo
    for a in SHRINK:
        for c in SHRINK:
            l2 = lo + a * span
            h2 = hi - c * span
            s = np.maximum((h2 - l2) / F(nb), ref.EPS).astype(F)
            codes = np.clip(np.rint((x - l2[:, None]) / s[:, None]), 0, nb)
            for fit in (False, True):
                if fit:                      # weighted least squares of w on the codes
                    sw = q.sum(1)
                    mq = (q * codes).sum(1) / sw
                    mw = (q * x).sum(1) / sw
                    var = (q * (codes - mq[:, None]) ** 2).sum(1)
                    cov = (q * (codes - mq[:, None]) * (x - mw[:, None])).sum(1)
                    ok = var > 0
                    s_f = np.where(ok, cov / np.where(ok, var, 1), s).astype(F)
                    b_f = np.where(ok, mw - s_f * mq, l2).astype(F)
                else:
                    s_f, b_f = s, l2.astype(F)
                ss, sb = ref.round_to(s_f, dt), ref.round_to(b_f, dt)
                with np.errstate(divide="ignore", invalid="ignore"):
                    cc = np.where(ss[:, None] != 0, np.rint((x - sb[:, None]) / np.where(
                        ss != 0, ss, F(1))[:, None]), 0)
                cc = np.clip(cc, 0, nb).astype(np.uint8)
                e = _werr(x, _deq_affine(cc, ss, sb, bits, g, dt), q)
                better = np.isfinite(e) & (e < best_e)
                best_e = np.where(better, e, best_e)
                best_c[better], bs[better], bb[better] = cc[better], ss[better], sb[better]
    return best_c.reshape(rows, cols), bs.reshape(rows, -1), bb.reshape(rows, -1)


def fp_ref(scheme, w, imp):
    """numpy reference: (codes (rows, cols) uint8, scale bytes) of the microscaling search."""
    rows, cols = w.shape
    mode, g = scheme.mode, scheme.group
    w = ref.round_to(w, scheme.dtype) if scheme.dtype != "F32" else w
    q = np.broadcast_to(imp.reshape(1, -1), (rows, cols))
    s0 = ref.fp_scales(w, mode, g)
    best_s = s0.copy()
    best_c = ref.fp_codes(w, s0, mode, g, scheme.dtype)

    def err(codes, s):
        deq = ref.dequantize_fp(codes, s, mode, g)
        return _werr(w.reshape(-1, g), deq.reshape(-1, g), q.reshape(-1, g)).reshape(rows, -1)
    best_e = err(best_c, best_s)
    top = 254 if mode != "nvfp4" else 126
    for k in FP_STEPS[mode]:
        s = np.clip(s0.astype(np.int32) + k, 0, top).astype(np.uint8)
        c = ref.fp_codes(w, s, mode, g, scheme.dtype)
        e = err(c, s)
        better = np.isfinite(e) & (e < best_e)
        best_e = np.where(better, e, best_e)
        best_s = np.where(better, s, best_s)
        cb = np.repeat(better, g, axis=1)
        best_c = np.where(cb, c, best_c)
    return best_c, best_s


#: the kernels' number of a float dtype (kernels/mlx_weighted.py)
DT = {"F32": 0, "F16": 1, "BF16": 2}
#: the microscaling modes' numbers (kernels.spec.MLX_MODES)
FP_NUMBER = {"mxfp4": 1, "nvfp4": 2, "mxfp8": 3}


@functools.lru_cache(maxsize=1)
def kernels():
    """kernels.mlx_weighted, None (with a warning, once) where numba is not installed."""
    if importlib.util.find_spec("numba") is None:
        warnings.warn("numba is not installed: the MLX importance-weighted search runs in its "
                      "numpy reference (the same bytes, many times slower)", stacklevel=3)
        return None
    from kernels import mlx_weighted
    return mlx_weighted


def _early(imp) -> bool:
    """Whether the kernels may give up a candidate's error sum once it cannot win: every
    importance >= 0 (so every partial sum only grows; kernels/mlx_weighted.py)."""
    return bool(np.all(np.asarray(imp) >= 0))


def _affine_kernel(k, scheme, x, imp):
    """`affine_ref`'s result from the kernel."""
    from kernels.tables import f16_table
    rows, cols = x.shape
    x = np.ascontiguousarray(x, F)
    s0, b0 = ref.affine_params(x, scheme.bits, scheme.group)
    codes = np.empty((rows, cols), np.uint8)
    bs = np.empty(s0.shape, F)
    bb = np.empty(s0.shape, F)
    k.affine_search(x, np.ascontiguousarray(imp, F), np.ascontiguousarray(s0, F),
                    np.ascontiguousarray(b0, F), scheme.bits, scheme.group,
                    DT[scheme.scale_dtype], f16_table(), SHRINK, _early(imp), codes, bs, bb)
    return codes, bs, bb


def _fp_kernel(k, scheme, w, imp):
    """`fp_ref`'s result from the kernel."""
    from kernels.tables import f16_table
    rows, cols = w.shape
    mode, g = scheme.mode, scheme.group
    w = np.ascontiguousarray(ref.round_to(w, scheme.dtype) if scheme.dtype != "F32" else w, F)
    s0 = ref.fp_scales(w, mode, g)
    table = ref.FP8_E4M3_TABLE if mode == "mxfp8" else ref.E2M1_VALUES
    codes = np.empty((rows, cols), np.uint8)
    s = np.empty(s0.shape, np.uint8)
    k.fp_search(w, np.ascontiguousarray(imp, F), s0, FP_NUMBER[mode], g, DT[scheme.dtype],
                f16_table(), np.ascontiguousarray(
                    ref.fp_scale_values(np.arange(256, dtype=np.uint8), mode), F),
                np.ascontiguousarray(table, F), np.array(FP_STEPS[mode], np.int64),
                254 if mode != "nvfp4" else 126, _early(imp), codes, s)
    return codes, s


def weighted_quantize(scheme, w: np.ndarray, imp: np.ndarray, method: str) -> QuantizedTensor:
    """QuantizedTensor of 2-D float32 `w` under MLX `scheme`, weighted by `imp` (cols,)."""
    rows, cols = w.shape
    k = kernels()
    if scheme.mode == "affine":
        x = ref.round_to(w, scheme.dtype) if scheme.dtype != "F32" else w
        codes, s, b = (affine_ref(scheme, x, imp) if k is None else
                       _affine_kernel(k, scheme, x, imp))
        arrays = {"weight": ref.pack_words(codes, scheme.bits),
                  "scales": ref.store(s, scheme.scale_dtype),
                  "biases": ref.store(b, scheme.scale_dtype)}
    else:
        codes, s = fp_ref(scheme, w, imp) if k is None else _fp_kernel(k, scheme, w, imp)
        arrays = {"weight": ref.pack_words(codes, scheme.bits), "scales": s}
    return QuantizedTensor(scheme.name, (rows, cols), arrays, {"method": method})

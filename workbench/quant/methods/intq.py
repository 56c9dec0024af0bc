"""Integer-scheme helpers shared by the methods: storage from chosen qparams, the block view of
an importance vector, and the importance-weighted scale (and zero-point) search.

The stored layout is exactly IntAffine's (workbench/schemes/integer.py): packed codes
(q + 2**(B-1) symmetric with q in [-2**(B-1), 2**(B-1)-1], q asymmetric), one scale per block (float16 for groups, float32
per channel/tensor) and for -asym one uint8 zero point per block.
"""

from __future__ import annotations

import numpy as np

from workbench.schemes.base import QuantizedTensor
from workbench.schemes.granularity import PerAxis, PerGroup, PerTensor, as_blocks
from workbench.schemes.integer import IntAffine, _safe_inv
from workbench.schemes.packing import pack_bits

F = np.float32
#: range-shrink ratios tried by the weighted search (1.0 = the scheme's own min/max range)
RATIOS = np.linspace(1.0, 0.40, 31)
#: asymmetric search: the low and high ends shrink independently over this coarser grid
ASYM_RATIOS = np.linspace(1.0, 0.55, 10)


def is_int(scheme) -> bool:
    return isinstance(scheme, IntAffine)


def group_len(scheme, cols: int) -> int:
    """Columns per block along a row (per-tensor: the whole row, blocks span rows)."""
    if isinstance(scheme.gran, PerGroup):
        return scheme.gran.size
    return cols


def block_importance(scheme, imp: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Per-weight importance (per input column `imp`) in the scheme's block view."""
    full = np.broadcast_to(np.asarray(imp, F).reshape(1, cols), (rows, cols))
    return as_blocks(np.ascontiguousarray(full), scheme.gran)


def codes_for(scheme: IntAffine, blocks: np.ndarray, scale: np.ndarray, zero) -> np.ndarray:
    """Signed/unsigned integer codes of blocks under stored qparams (the scheme's rounding)."""
    return scheme._codes(np.asarray(blocks, F), scale, zero)


def fake(scheme: IntAffine, blocks, scale, zero) -> np.ndarray:
    return scheme._fake(np.asarray(blocks, F), scale, zero)


def build(scheme: IntAffine, shape, codes_blocks: np.ndarray, scale: np.ndarray, zero,
          meta: dict | None = None) -> QuantizedTensor:
    """QuantizedTensor from codes (already clipped, in the block view) and stored qparams."""
    arrays = {"codes": pack_bits((np.asarray(codes_blocks) + scheme.offset).astype(np.uint8)
                                 .reshape(-1), scheme.bits),
              "scales": np.asarray(scale).astype(scheme.scale_dtype).reshape(-1)}
    if scheme.asym:
        arrays["zeros"] = np.asarray(zero).astype(np.uint8).reshape(-1)
    return QuantizedTensor(scheme.name, tuple(int(s) for s in shape), arrays, dict(meta or {}))


def qparams_from_range(scheme: IntAffine, lo, hi):
    """Stored (scale, zero) for a symmetric |range| `hi` (lo None: scale hi / (2**(B-1) - 1), a
    float16 scale above 65504 held at 65504, so a block the scheme itself can store is never
    refused here) or an asymmetric [lo, hi]."""
    if lo is None:
        s = np.asarray(hi, F) / F(scheme.qmax)
        if scheme.scale_dtype == np.float16:
            s = np.minimum(s, F(65504.0))
        return scheme._store_scale(s), None
    lo = np.minimum(np.asarray(lo, F), 0)
    hi = np.maximum(np.asarray(hi, F), 0)
    scale = scheme._store_scale((hi - lo) / F(scheme.qmax))
    zero = np.clip(np.rint(-lo * _safe_inv(scale.astype(F))), 0, scheme.qmax).astype(np.uint8)
    return scale, zero


def weighted_qparams(scheme: IntAffine, blocks: np.ndarray, imp: np.ndarray,
                     out_err=None):
    """Per block, the stored (scale, zero) minimising sum_j imp_j (w_j - Q(w_j))^2.

    Candidates: the scheme's own range (so never worse than its RTN in this measure) shrunk by
    RATIOS (symmetric) or by ASYM_RATIOS at each end (asymmetric), each also refitted by
    weighted least squares for its codes (symmetric: s = sum imp w q / sum imp q^2); symmetric
    schemes try their own (divisor-searched) RTN scale first."""
    blocks = np.asarray(blocks, F)
    imp = np.asarray(imp, F)
    nb = blocks.shape[0]
    best_err = np.full(nb, np.inf)
    best_scale = None
    best_zero = None
    lo0, hi0 = (None, None)
    if scheme.asym:
        lo0, hi0 = scheme._range_asym(blocks)
    else:
        hi0 = scheme._range_sym(blocks)

    def consider(scale, zero):
        nonlocal best_err, best_scale, best_zero
        deq = fake(scheme, blocks, scale, zero)
        err = np.einsum("ij,ij->i", imp, (deq - blocks) ** 2, dtype=np.float64)
        better = err < best_err
        if best_scale is None:
            best_scale, best_zero = scale.copy(), (None if zero is None else zero.copy())
        best_err = np.where(better, err, best_err)
        best_scale = np.where(better, scale, best_scale)
        if zero is not None:
            best_zero = np.where(better, zero, best_zero)

    if scheme.asym:
        for r1 in ASYM_RATIOS:
            for r2 in ASYM_RATIOS:
                consider(*qparams_from_range(scheme, lo0 * F(r1), hi0 * F(r2)))
    else:
        consider(scheme.choose_qparams(blocks)[0], None)
        for r in RATIOS:
            scale, _ = qparams_from_range(scheme, None, hi0 * F(r))
            consider(scale, None)
            q = codes_for(scheme, blocks, scale, None)
            num = np.einsum("ij,ij->i", imp * q, blocks, dtype=np.float64)
            den = np.einsum("ij,ij->i", imp * q, q, dtype=np.float64)
            ok = den > 0
            s2 = np.where(ok, num / np.where(ok, den, 1), scale.astype(np.float64))
            consider(scheme._store_scale(np.abs(s2).astype(F)), None)
    if out_err is not None:
        out_err[:] = best_err
    return best_scale.astype(scheme.scale_dtype), best_zero


#: weighted symmetric search: amax / (P + k/4) for k = 0..12 (P = 2**(B-1) - 1; int4 7 ... 10):
#: the scheme's own divisors (P ... P + 1) and clipping ones, which the importance weighting
#: decides (the plain block error alone picked clipping that hurt a causal LM; docs/methods.md)
WIDE_DIVISOR_STEPS = 12


def weighted_sym_scale(scheme: IntAffine, blocks: np.ndarray, imp: np.ndarray) -> np.ndarray:
    """Per block, the symmetric scale amax / d (d = P + k/4, k = 0..WIDE_DIVISOR_STEPS; with
    @mse also the scheme's clipping ratios) with the least importance-weighted squared error
    sum_j imp_j (w_j - Q(w_j))^2 (imp: one weight per column of the blocks, e.g. GPTQ's
    diag(H)); ties keep the earlier candidate."""
    blocks = np.asarray(blocks, F)
    imp = np.asarray(imp, np.float64).reshape(1, -1)
    amax = scheme._range_sym(blocks)
    best_err = np.full(blocks.shape[0], np.inf)
    best = None
    cands = [amax / F(scheme.qmax + k / 4) for k in range(WIDE_DIVISOR_STEPS + 1)]
    cands += scheme.sym_candidates(amax)[len(scheme.divisors):]       # @mse's ratios
    for i, cand in enumerate(cands):
        scale, over = scheme._store_scale_soft(cand)
        if i == 0 and over.any():
            scheme._refuse(amax[over])
        d = (fake(scheme, blocks, scale, None) - blocks).astype(np.float64)
        err = (d * d * imp).sum(axis=1)
        err[over] = np.inf
        if best is None:
            best = scale.copy()
        better = err < best_err
        best_err[better] = err[better]
        best[better] = scale[better]
    return best

"""Integer-scheme helpers shared by the methods: storage from chosen qparams, the block view of
an importance vector, and the importance-weighted scale (and zero-point) search.

The stored layout is exactly IntAffine's (workbench/schemes/integer.py): packed codes
(q + 2**(B-1) symmetric with q in [-2**(B-1), 2**(B-1)-1], q asymmetric), one scale per block (float16 for groups, float32
per channel/tensor) and for -asym one uint8 zero point per block.
"""

from __future__ import annotations

import numpy as np

from workbench.schemes.base import QuantizedTensor
from workbench.schemes.granularity import PerGroup, as_blocks
from workbench.schemes.integer import IntAffine, _safe_inv
from workbench.schemes.packing import pack_bits

F = np.float32
#: range-shrink ratios tried by the weighted search (1.0 = the scheme's own min/max range)
RATIOS = np.linspace(1.0, 0.40, 31)
#: asymmetric search: the low and high ends shrink independently over this coarser grid
ASYM_RATIOS = np.linspace(1.0, 0.55, 10)
#: blocks scored per kernel call by the weighted search (its (candidates, blocks) float64
#: arrays: 100 x 8192 x 8 bytes, 6.6 MB each)
SEARCH_BLOCKS = 8192


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


def _seq_sum(p: np.ndarray) -> np.ndarray:
    """Per row of float64 `p`: the sum in element order (the kernel's order)."""
    if not p.shape[1]:
        return np.zeros(p.shape[0])
    return np.cumsum(p, axis=1)[:, -1]


def candidate_errors_ref(scheme: IntAffine, blocks, imp, scales, zeros, lsq: bool = False):
    """numpy reference of kernels.weighted_search.candidate_errors: (err, num, den), each
    (blocks, K) float64, of K candidate stored `scales` (blocks, K) and `zeros` (blocks, K, or
    None: symmetric) on `blocks` weighted by `imp` (both (blocks, g) float32). err[:, k] =
    sum_j imp_j (deq_j - x_j)^2 under the scheme's own rounding; with `lsq`, num[:, k] =
    sum_j (imp_j q_j) x_j and den[:, k] = sum_j (imp_j q_j) q_j for the symmetric refit."""
    blocks = np.asarray(blocks, F)
    imp = np.asarray(imp, F)
    scales = np.asarray(scales)
    err = np.zeros(scales.shape)
    num = np.zeros_like(err)
    den = np.zeros_like(err)
    for k in range(scales.shape[1]):
        zero = None if zeros is None else np.asarray(zeros)[:, k]
        q = scheme._codes(blocks, scales[:, k], zero)
        d = fake(scheme, blocks, scales[:, k], zero) - blocks
        err[:, k] = _seq_sum(imp.astype(np.float64) * (d * d).astype(np.float64))
        if lsq:
            wq = (imp * q).astype(np.float64)
            num[:, k] = _seq_sum(wq * blocks.astype(np.float64))
            den[:, k] = _seq_sum(wq * q.astype(np.float64))
    return err, num, den


def _candidate_errors(scheme, blocks, imp, scales, zeros, lsq=False):
    """The kernel (kernels/weighted_search.py) where it can run, else the numpy reference."""
    try:
        from kernels.weighted_search import candidate_errors
    except ImportError:
        return candidate_errors_ref(scheme, blocks, imp, scales, zeros, lsq)
    st = np.asarray(scales).astype(F)
    zt = np.zeros_like(st) if zeros is None else np.asarray(zeros).astype(F)
    return candidate_errors(blocks, imp, st, zt, scheme.qmin, scheme.qmax, lsq)


def weighted_qparams(scheme: IntAffine, blocks: np.ndarray, imp: np.ndarray,
                     out_err=None):
    """Per block, the stored (scale, zero) minimising sum_j imp_j (w_j - Q(w_j))^2.

    Candidates: the scheme's own range (so never worse than its RTN in this measure) shrunk by
    RATIOS (symmetric) or by ASYM_RATIOS at each end (asymmetric), each also refitted by
    weighted least squares for its codes (symmetric: s = sum imp w q / sum imp q^2); symmetric
    schemes try their own (divisor-searched) RTN scale first. Per block the first candidate
    with the least error wins (in the order: own scale, then per ratio the shrunk scale and
    its refit; asymmetric: low ratio outer, high ratio inner). All candidates of a block are
    scored by one kernel call (`_candidate_errors`), SEARCH_BLOCKS blocks at a time."""
    blocks = np.asarray(blocks, F)
    imp = np.asarray(imp, F)
    nb = blocks.shape[0]
    if nb > SEARCH_BLOCKS:        # every step is per block: chunks bound the (blocks, K) arrays
        errs = np.empty(nb) if out_err is None else out_err
        parts = [weighted_qparams(scheme, blocks[i:i + SEARCH_BLOCKS],
                                  imp[i:i + SEARCH_BLOCKS], errs[i:i + SEARCH_BLOCKS])
                 for i in range(0, nb, SEARCH_BLOCKS)]
        return (np.concatenate([p[0] for p in parts]),
                np.concatenate([p[1] for p in parts]) if scheme.asym else None)
    if scheme.asym:
        lo0, hi0 = scheme._range_asym(blocks)
        r = ASYM_RATIOS.astype(F)
        n = len(r)
        lo = np.broadcast_to(lo0[:, None, None] * r[None, :, None], (nb, n, n))
        hi = np.broadcast_to(hi0[:, None, None] * r[None, None, :], (nb, n, n))
        scales, zeros = qparams_from_range(scheme, lo.reshape(nb, -1), hi.reshape(nb, -1))
        err = _candidate_errors(scheme, blocks, imp, scales, zeros)[0]
    else:
        hi0 = scheme._range_sym(blocks)
        own = scheme.choose_qparams(blocks)[0]
        shrunk, _ = qparams_from_range(scheme, None, hi0[:, None] * RATIOS.astype(F)[None, :])
        first = np.concatenate([own[:, None].astype(shrunk.dtype), shrunk], axis=1)
        err1, num, den = _candidate_errors(scheme, blocks, imp, first, None, lsq=True)
        ok = den[:, 1:] > 0
        s2 = np.where(ok, num[:, 1:] / np.where(ok, den[:, 1:], 1), shrunk.astype(np.float64))
        refit = scheme._store_scale(np.abs(s2).astype(F))
        err2 = _candidate_errors(scheme, blocks, imp, refit, None)[0]
        # the order the candidates are tried in: own, then (shrunk r, its refit) per ratio
        K = len(RATIOS)
        err = np.empty((nb, 1 + 2 * K))
        err[:, 0] = err1[:, 0]
        err[:, 1::2] = err1[:, 1:]
        err[:, 2::2] = err2
        scales = np.empty((nb, 1 + 2 * K), refit.dtype)
        scales[:, 0] = first[:, 0]
        scales[:, 1::2] = shrunk
        scales[:, 2::2] = refit
        zeros = None
    err = np.where(np.isnan(err), np.inf, err)
    pick = np.argmin(err, axis=1) if nb else np.zeros(0, np.int64)
    rows = np.arange(nb)
    if out_err is not None:
        out_err[:] = err[rows, pick]
    best_zero = None if zeros is None else zeros[rows, pick]
    return scales[rows, pick].astype(scheme.scale_dtype), best_zero


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

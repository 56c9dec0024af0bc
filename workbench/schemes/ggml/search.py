"""Scale searches for the K-quants and IQ4_NL, vectorized over many (sub-)blocks at once.

What makes K-quants good is not the layout but how the per-sub-block scales (and mins) are
chosen: instead of mapping the block's range onto the codes, a small set of candidate
scales around the range-based one is tried, the codes are rounded for each, the best scale
*for those codes* is solved by weighted least squares, and the candidate with the least
weighted error wins. The weights emphasise large weights (|w|, w^2 or rms + |w|).

All functions take x as float32 (B, n): B independent (sub-)blocks of n weights, already
normalized (see common.pow2_normalize), and return per-block parameters plus the codes.
"""

from __future__ import annotations

import numpy as np

from workbench.schemes.ggml.common import GROUP_EPS

F = np.float32


def _wsum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise sum of a*b (float32)."""
    return np.einsum("ij,ij->i", a, b)


def _seqsum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise sum of a*b in index order (float32), the order a numba kernel can reproduce
    bit for bit."""
    acc = a[:, 0] * b[:, 0]
    for j in range(1, a.shape[1]):
        acc = acc + a[:, j] * b[:, j]
    return acc


def affine_search(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float,
                  nstep: int, use_abs: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes L in [0, nmax] with x ~ scale * L - offset, offset >= 0, per row.

    Candidates: iscale = (nmax + rmin + rdelta*k) / (max - min), k = 0..nstep (plus the plain
    range mapping). For each candidate's codes the (scale, min) pair minimising
    sum w * (scale*L + min - x)^2 is solved in closed form (min clamped to <= 0); the error
    measure that picks the winner is weighted squared error, or weighted absolute error
    with use_abs. Returns (scale >= 0, offset >= 0, L uint8).
    """
    lo = np.minimum(x.min(axis=1), F(0))
    hi = x.max(axis=1)
    rng = hi - lo
    flat = rng <= 0
    rng = np.where(flat, F(1), rng)
    xs = x - lo[:, None]
    sw = w.sum(axis=1)
    sx = _wsum(w, x)

    def codes(iscale):
        return np.clip(np.rint(iscale[:, None] * xs), 0, nmax)

    def error(scale, mn, L):
        diff = scale[:, None] * L + mn[:, None] - x
        return _wsum(w, np.abs(diff)) if use_abs else _wsum(w, diff * diff)

    iscale = F(nmax) / rng
    best_scale = F(1) / iscale
    best_min = lo.copy()
    best_L = codes(iscale)
    best_err = error(best_scale, best_min, best_L)
    for k in range(nstep + 1):
        iscale = F(rmin + rdelta * k + nmax) / rng
        L = codes(iscale)
        wl = w * L
        sl = wl.sum(axis=1)
        sl2 = _wsum(wl, L)
        sxl = _wsum(wl, x)
        D = sw * sl2 - sl * sl
        ok = D > 0
        Ds = np.where(ok, D, F(1))
        scale = (sw * sxl - sx * sl) / Ds
        mn = (sl2 * sx - sl * sxl) / Ds
        pos = mn > 0
        if pos.any():
            scale = np.where(pos, sxl / np.where(sl2 > 0, sl2, F(1)), scale)
            mn = np.where(pos, F(0), mn)
        err = error(scale, mn, L)
        better = ok & (err < best_err)
        best_err = np.where(better, err, best_err)
        best_scale = np.where(better, scale, best_scale)
        best_min = np.where(better, mn, best_min)
        np.copyto(best_L, L, where=better[:, None])
    best_scale = np.where(flat, F(0), best_scale).astype(F)
    best_min = np.where(flat, lo, best_min)
    best_L[flat] = 0
    return best_scale, (-best_min).astype(F), best_L.astype(np.uint8)


def symmetric_search(x: np.ndarray, w: np.ndarray, nmax: int, steps: range | list,
                     refine: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Signed codes L in [-nmax, nmax-1] with x ~ scale * L, per row.

    The weight of largest magnitude maps to -nmax (the code range is one longer on the
    negative side), so scale has the opposite sign of that weight. Candidates
    iscale = -(nmax + 0.1*k) / max for k in `steps`; each candidate's codes get their
    least-squares scale sum(w x L)/sum(w L^2), the one with the largest explained energy
    (sum(w x L)^2 / sum(w L^2)) wins. `refine` extra rounds re-round the codes with the best
    scale and refit. Returns (scale float32, L int8).
    """
    idx = np.abs(x).argmax(axis=1)
    mx = x[np.arange(x.shape[0]), idx]
    zero = np.abs(mx) < GROUP_EPS
    mx = np.where(zero, F(1), mx)

    def codes(iscale):
        return np.clip(np.rint(iscale[:, None] * x), -nmax, nmax - 1)

    best_scale = np.zeros(x.shape[0], F)
    best_score = np.full(x.shape[0], -np.inf, F)
    best_L = np.zeros_like(x)

    def consider(L):
        nonlocal best_scale, best_score
        wl = w * L
        sxl = _seqsum(wl, x)
        sl2 = _seqsum(wl, L)
        ok = sl2 > 0
        s2 = np.where(ok, sl2, F(1))
        scale = sxl / s2
        score = np.where(ok, scale * sxl, F(-np.inf))
        better = score > best_score
        best_score = np.where(better, score, best_score)
        best_scale = np.where(better, scale, best_scale)
        np.copyto(best_L, L, where=better[:, None])

    for k in steps:
        consider(codes(F(-(nmax + 0.1 * k)) / mx))
    for _ in range(refine):
        consider(codes(np.where(best_scale != 0, F(1) / np.where(best_scale != 0, best_scale, F(1)),
                                F(0))))
    # rows whose every candidate had sum(w L^2) == 0: plain range mapping
    none = ~np.isfinite(best_score)
    if none.any():
        best_scale = np.where(none, -mx / F(nmax), best_scale)
        best_L[none] = codes(F(-nmax) / mx)[none]
    best_scale = np.where(zero, F(0), best_scale).astype(F)
    best_L[zero] = 0
    return best_scale, best_L.astype(np.int8)


def codebook_search(x: np.ndarray, w: np.ndarray, values: np.ndarray, ntry: int,
                    nearest) -> np.ndarray:
    """Scale d (per row) for a sorted non-uniform codebook `values`: x ~ d * values[L].

    The weight of largest magnitude is mapped near values[0] (the end of the codebook with
    the largest magnitude) for 2*ntry+1 candidate scales, the codes are the nearest codebook
    entries (`nearest`: a common.NearestIndex for `values`), and each candidate's
    least-squares scale is scored by explained energy.
    """
    v = values.astype(F)
    idx = np.abs(x).argmax(axis=1)
    mx = x[np.arange(x.shape[0]), idx]
    zero = np.abs(mx) < GROUP_EPS
    mx = np.where(zero, F(1), mx)
    best_d = np.zeros(x.shape[0], F)
    best_score = np.full(x.shape[0], -np.inf, F)
    cands = [-v[0] / mx] + [F(t + v[0]) / mx for t in range(-ntry, ntry + 1)]
    for iscale in cands:
        q = v[nearest(iscale[:, None] * x)]
        wq = w * q
        sqx = _seqsum(wq, x)         # index order: what kernels/iq4nl_quant.py reproduces
        sq2 = _seqsum(wq, q)
        ok = sq2 > 0
        d = sqx / np.where(ok, sq2, F(1))
        score = np.where(ok, d * sqx, F(-np.inf))
        better = score > best_score
        best_score = np.where(better, score, best_score)
        best_d = np.where(better, d, best_d)
    none = ~np.isfinite(best_score)
    best_d = np.where(none, mx / -v[0], best_d)
    return np.where(zero, F(0), best_d).astype(F)

"""numba kernels for per-tensor statistics over raw storage rows (two fused passes).

Pass 1 (`row_moments`): per row min / max / absmax over finite values, sum and sum of squares
(float64) and NaN / Inf counts. Pass 2 (`hist_central`): histogram over [lo, hi], central
moments m2, m3, m4 around the mean and the outlier count |w - mean| > k*std. Rows are split
across threads; bfloat16 is decoded in the kernel from its uint16 bits (kind=1), other
storage dtypes are cast (kind=0). The numpy reference is workbench.stats.reference_stats.
"""

from __future__ import annotations

import numba as nb
import numpy as np


@nb.njit(cache=True, inline="always")
def _load(raw, i, j, kind, u32):
    if kind == 1:
        u32[0] = np.uint32(raw[i, j]) << np.uint32(16)
        return np.float64(u32.view(np.float32)[0])
    return np.float64(raw[i, j])


@nb.njit(parallel=True, cache=True)
def row_moments(raw, kind, rmin, rmax, rabs, rsum, rsq, rnan, rinf):
    rows, cols = raw.shape
    for i in nb.prange(rows):
        u32 = np.zeros(1, np.uint32)
        mn = np.inf
        mx = -np.inf
        s = 0.0
        q = 0.0
        n_nan = 0
        n_inf = 0
        for j in range(cols):
            v = _load(raw, i, j, kind, u32)
            if v != v:
                n_nan += 1
                continue
            if v == np.inf or v == -np.inf:
                n_inf += 1
                continue
            if v < mn:
                mn = v
            if v > mx:
                mx = v
            s += v
            q += v * v
        rmin[i] = mn
        rmax[i] = mx
        rabs[i] = max(abs(mn), abs(mx)) if mn <= mx else -np.inf
        rsum[i] = s
        rsq[i] = q
        rnan[i] = n_nan
        rinf[i] = n_inf


@nb.njit(parallel=True, cache=True)
def hist_central(raw, kind, lo, hi, mean, thresh, hist, moments, outliers):
    """hist: (T, bins) int64; moments: (T, 3) float64; outliers: (T,) int64."""
    rows, cols = raw.shape
    nthreads, bins = hist.shape
    width = hi - lo
    scale = bins / width if width > 0 else 0.0
    per = (rows + nthreads - 1) // nthreads
    for t in nb.prange(nthreads):
        u32 = np.zeros(1, np.uint32)
        m2 = 0.0
        m3 = 0.0
        m4 = 0.0
        out = 0
        for i in range(t * per, min(rows, (t + 1) * per)):
            for j in range(cols):
                v = _load(raw, i, j, kind, u32)
                if v != v or v == np.inf or v == -np.inf:
                    continue
                b = int((v - lo) * scale)
                if b >= bins:
                    b = bins - 1
                elif b < 0:
                    b = 0
                hist[t, b] += 1
                d = v - mean
                d2 = d * d
                m2 += d2
                m3 += d2 * d
                m4 += d2 * d2
                if abs(d) > thresh:
                    out += 1
        moments[t, 0] = m2
        moments[t, 1] = m3
        moments[t, 2] = m4
        outliers[t] = out

"""numba kernels for per-tensor statistics over raw storage rows (two fused passes).

Pass 1 (`row_moments`): per row min / max / absmax over finite values, sum and sum of squares
(float64) and NaN / Inf counts. Pass 2 (`hist_central`): histogram over [lo, hi], central
moments m2, m3, m4 around the mean and the outlier count |w - mean| > thresh.
Each row is first decoded into a float32 buffer (bfloat16 from its uint16 bits when
kind == 1, a cast otherwise), then reduced by a branch-light loop the compiler vectorizes;
rows that hold NaN/Inf take a careful second loop. Sums may be reassociated (vectorized),
so they match the numpy reference (workbench.stats.reference_stats) to float64 rounding;
histogram bins are computed in float64 exactly as the reference does.
"""

from __future__ import annotations

from . import _numba_prelude  # noqa: F401  (before numba: cheaper start)
import numba as nb
import numpy as np

_FM = {"reassoc", "nsz", "arcp", "contract"}  # no 'nnan'/'ninf': NaN tests stay valid


@nb.njit(cache=True, fastmath=_FM)
def _decode_row(raw, i, kind, buf, bits):
    cols = raw.shape[1]
    if kind == 1:
        for j in range(cols):
            bits[j] = np.uint32(raw[i, j]) << np.uint32(16)
    else:
        for j in range(cols):
            buf[j] = np.float32(raw[i, j])


@nb.njit(parallel=True, cache=True, fastmath=_FM)
def row_moments(raw, kind, rmin, rmax, rabs, rsum, rsq, rnan, rinf):
    rows, cols = raw.shape
    for i in nb.prange(rows):
        bits = np.empty(cols, np.uint32)
        buf = bits.view(np.float32)
        _decode_row(raw, np.int64(i), kind, buf, bits)
        s = 0.0
        q = 0.0
        mn = np.float32(np.inf)
        mx = np.float32(-np.inf)
        for j in range(cols):
            v = buf[j]
            s += v
            q += np.float64(v) * v
            mn = min(mn, v)
            mx = max(mx, v)
        n_nan = 0
        n_inf = 0
        if not (np.isfinite(s) and np.isfinite(q)):
            # a NaN or Inf in this row: count them and redo the reductions without them
            s = 0.0
            q = 0.0
            mn = np.float32(np.inf)
            mx = np.float32(-np.inf)
            for j in range(cols):
                v = buf[j]
                if v != v:
                    n_nan += 1
                elif v == np.inf or v == -np.inf:
                    n_inf += 1
                else:
                    s += v
                    q += np.float64(v) * v
                    mn = min(mn, v)
                    mx = max(mx, v)
        rmin[i] = mn
        rmax[i] = mx
        rabs[i] = max(abs(mn), abs(mx)) if mn <= mx else -np.inf
        rsum[i] = s
        rsq[i] = q
        rnan[i] = n_nan
        rinf[i] = n_inf


@nb.njit(parallel=True, cache=True, fastmath=_FM)
def hist_central(raw, kind, lo, hi, mean, thresh, bad_rows, hist, moments, outliers):
    """hist: (T, bins) int64; moments: (T, 3) float64; outliers: (T,) int64.

    bad_rows[i] is true for rows that hold NaN/Inf (from pass 1); only those take the
    branchy loop. Otherwise a vectorizable loop computes the bin of every value into a
    buffer and the central moments, then a scalar loop scatters the bins.
    """
    rows, cols = raw.shape
    nthreads, bins = hist.shape
    width = hi - lo
    scale = bins / width if width > 0 else 0.0
    per = (rows + nthreads - 1) // nthreads
    for t in nb.prange(nthreads):
        bits = np.empty(cols, np.uint32)
        buf = bits.view(np.float32)
        idx = np.empty(cols, np.int32)
        local = np.zeros(bins, np.int64)
        m2 = 0.0
        m3 = 0.0
        m4 = 0.0
        out = 0
        for i in range(t * per, min(rows, (t + 1) * per)):
            _decode_row(raw, i, kind, buf, bits)
            r2 = 0.0
            r3 = 0.0
            r4 = 0.0
            if bad_rows[i]:
                for j in range(cols):
                    v = buf[j]
                    if not np.isfinite(v):
                        idx[j] = -1
                        continue
                    idx[j] = min(max(np.int32((np.float64(v) - lo) * scale), 0), bins - 1)
                    d = np.float64(v) - mean
                    d2 = d * d
                    r2 += d2
                    r3 += d2 * d
                    r4 += d2 * d2
                    out += abs(d) > thresh
                for j in range(cols):
                    if idx[j] >= 0:
                        local[idx[j]] += 1
            else:
                for j in range(cols):
                    v = np.float64(buf[j])
                    idx[j] = min(max(np.int32((v - lo) * scale), 0), bins - 1)
                    d = v - mean
                    d2 = d * d
                    r2 += d2
                    r3 += d2 * d
                    r4 += d2 * d2
                    out += abs(d) > thresh
                for j in range(cols):
                    local[idx[j]] += 1
            m2 += r2
            m3 += r3
            m4 += r4
        hist[t, :] = local
        moments[t, 0] = m2
        moments[t, 1] = m3
        moments[t, 2] = m4
        outliers[t] = out


@nb.njit(parallel=True, cache=True, fastmath=_FM)
def code_counts(raw, lut, rmin, rmax, counts):
    """One pass for 16-bit storage (bf16/f16 bit patterns as uint16).

    counts: (T, 65536) int64 per-thread occurrence counts of every bit pattern (from which
    every global statistic follows exactly); rmin/rmax: per-row min/max of the finite
    values decoded through `lut` (65536 float32).
    """
    rows, cols = raw.shape
    nthreads = counts.shape[0]
    per = (rows + nthreads - 1) // nthreads
    for t in nb.prange(nthreads):
        local = counts[t]
        for i in range(t * per, min(rows, (t + 1) * per)):
            mn = np.float32(np.inf)
            mx = np.float32(-np.inf)
            for j in range(cols):
                c = raw[i, j]
                local[c] += 1
                v = lut[c]
                mn = min(mn, v)
                mx = max(mx, v)
            if not (np.isfinite(mn) and np.isfinite(mx)):
                # NaN/Inf in the row (or a NaN-poisoned min/max): exclude them explicitly
                mn = np.float32(np.inf)
                mx = np.float32(-np.inf)
                for j in range(cols):
                    v = lut[raw[i, j]]
                    if np.isfinite(v):
                        if v < mn:
                            mn = v
                        if v > mx:
                            mx = v
            rmin[i] = mn
            rmax[i] = mx


@nb.njit(parallel=True, cache=True, fastmath=_FM)
def _weighted_sq_err_rows(f, a, b, out):
    rows, cols = a.shape
    for i in nb.prange(rows):
        s = 0.0
        for j in range(cols):
            d = np.float64(a[i, j]) - np.float64(b[i, j])
            s += np.float64(f[i, j]) * d * d
        out[i] = s


def weighted_sq_err(f, a, b) -> float:
    """sum_ij f_ij (a_ij - b_ij)^2 in float64 over three arrays of one shape (float32; `f`
    may be a memory-mapped array), in one pass without temporaries: the fisher measure's
    error of a dequantized tensor `b` against its weights `a`. Per-row sums, added in row
    order (the same result whatever the thread count)."""
    a2 = a.reshape(a.shape[0], -1) if a.ndim > 1 else a.reshape(1, -1)
    b2 = b.reshape(a2.shape)
    f2 = f.reshape(a2.shape)
    out = np.empty(a2.shape[0], np.float64)
    from .host import readonly
    _weighted_sq_err_rows(readonly(f2), readonly(a2), readonly(b2), out)
    return float(out.sum())


@nb.njit(parallel=True, cache=True)
def _cast_sq_err_rows(f, a, ab, kind, out, bad):
    """Per row: sum f (cast(a) - a)^2 in float64, cast = float16 (kind 0) or bfloat16 (1), the
    rounding done on the bits `ab` (a viewed as uint32: round to nearest even, as numpy's
    astype and f32_to_bf16); bad[i] = 1 where row i holds a non-finite weight or one the cast
    overflows."""
    rows, cols = a.shape
    for i in nb.prange(rows):
        buf = np.empty(cols, np.uint32)
        fb = buf.view(np.float32)
        flag = 0
        for j in range(cols):
            x = a[i, j]
            u = ab[i, j] & np.uint32(0x7FFFFFFF)
            if u >= np.uint32(0x7F800000):
                flag = 1
            if kind == 0:
                if u >= np.uint32(0x477FF000):           # rounds past 65504 (or not finite)
                    flag = 1
                    buf[j] = np.uint32(0)
                elif u >= np.uint32(0x38800000):         # float16 normal: 10 mantissa bits
                    buf[j] = (ab[i, j] + np.uint32(0xFFF) + ((u >> np.uint32(13)) & np.uint32(1))
                              ) & np.uint32(0xFFFFE000)
                else:                                    # subnormal: a multiple of 2**-24
                    buf[j] = np.uint32(0)
                    fb[j] = np.float32(np.rint(np.float64(x) * 16777216.0) / 16777216.0)
            else:
                r = (ab[i, j] + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) \
                    & np.uint32(0xFFFF0000)
                if (r & np.uint32(0x7F800000)) == np.uint32(0x7F800000):
                    flag = 1
                buf[j] = r
        s = 0.0
        if flag == 0:
            for j in range(cols):
                d = np.float64(fb[j]) - np.float64(a[i, j])
                s += np.float64(f[i, j]) * d * d
        out[i] = s
        bad[i] = flag


def cast_sq_err(f, a, kind: str) -> float | None:
    """sum_ij f_ij (cast(a_ij) - a_ij)^2 in float64 for the float16 ("fp16") or bfloat16
    ("bf16") cast of float32 weights `a`, without the cast array (the fisher measure's error
    of the float schemes, `weighted_sq_err` of the cast and back). None when a weight is not
    finite or overflows the type: the caller takes the scheme's own path (and its refusal)."""
    a2 = np.ascontiguousarray(a.reshape(a.shape[0], -1) if a.ndim > 1 else a.reshape(1, -1),
                              np.float32)
    f2 = f.reshape(a2.shape)
    out = np.empty(a2.shape[0], np.float64)
    bad = np.zeros(a2.shape[0], np.uint8)
    from .host import readonly
    _cast_sq_err_rows(readonly(f2), readonly(a2), readonly(a2.view(np.uint32)),
                      0 if kind == "fp16" else 1, out, bad)
    return None if bad.any() else float(out.sum())

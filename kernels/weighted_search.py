"""numba kernel for the importance-weighted scale search of the integer schemes.

`candidate_errors` scores K candidate (scale, zero) pairs per block in one pass over each
block, with no temporaries: for block b and candidate k, the codes are
``clip(rint(x * (1/s)) + z, qmin, qmax)`` (``x / s`` where the float32 inverse overflows,
0 where s is 0), the dequantized value ``(q - z) * s`` (float32 throughout, as the numpy
reference computes it), and

    err[k, b] = sum_j imp_j (deq_j - x_j)^2        (float64 products of float32 squares)

and, for the least-squares refit of a symmetric scale,

    num[k, b] = sum_j (imp_j q_j) x_j,   den[k, b] = sum_j (imp_j q_j) q_j

Each sum runs in element order (one float64 accumulator per block and candidate, the
candidates innermost so that the loop vectorizes): the order of the numpy reference
(workbench.quant.methods.intq.candidate_errors_ref, a cumulative sum), which this kernel
equals bit for bit. No fastmath: the float32 operations must round as numpy's do. Blocks run
in parallel; each block's sums are its own, so results do not depend on the thread count.
"""

from __future__ import annotations

from . import _numba_prelude  # noqa: F401  (before numba: cheaper start)
import numba as nb
import numpy as np

from .host import readonly


@nb.njit(cache=True)
def _block(x, w, iv, s, z, lo, hi, lsq, e, n, d):
    """Sums of one block over every candidate k (iv, s, z: (K,) float32), each in element
    order: the loop over candidates is innermost, so it vectorizes (one accumulator per
    candidate)."""
    K = iv.shape[0]
    for k in range(K):
        e[k] = 0.0
        n[k] = 0.0
        d[k] = 0.0
    for j in range(x.shape[0]):
        xj = x[j]
        wj = w[j]
        wd = np.float64(wj)
        if lsq:
            for k in range(K):
                q = np.rint(xj * iv[k])
                if q < lo:
                    q = lo
                elif q > hi:
                    q = hi
                r = q * s[k] - xj
                e[k] += wd * np.float64(r * r)
                wq = np.float64(wj * q)
                n[k] += wq * np.float64(xj)
                d[k] += wq * np.float64(q)
        else:
            for k in range(K):
                q = np.rint(xj * iv[k]) + z[k]
                if q < lo:
                    q = lo
                elif q > hi:
                    q = hi
                r = (q - z[k]) * s[k] - xj
                e[k] += wd * np.float64(r * r)


@nb.njit(cache=True)
def _divided(x, w, s, z, lo, hi, lsq):
    """One candidate whose float32 inverse overflows: the codes of x / s (as the reference)."""
    e = 0.0
    n = 0.0
    dd = 0.0
    for j in range(x.shape[0]):
        q = np.rint(x[j] / s) + z
        if q < lo:
            q = lo
        elif q > hi:
            q = hi
        r = (q - z) * s - x[j]
        e += np.float64(w[j]) * np.float64(r * r)
        if lsq:
            wq = np.float64(w[j] * q)
            n += wq * np.float64(x[j])
            dd += wq * np.float64(q)
    return e, n, dd


@nb.njit(parallel=True, cache=True)
def _candidate_errors(blocks, imp, scales, zeros, fqmin, fqmax, lsq, err, num, den):
    nbk = blocks.shape[0]
    K = scales.shape[1]
    for b in nb.prange(nbk):
        iv = np.empty(K, np.float32)
        for k in range(K):
            s = scales[b, k]
            iv[k] = np.float32(0.0) if s == np.float32(0.0) else np.float32(1.0) / s
        _block(blocks[b], imp[b], iv, scales[b], zeros[b], fqmin, fqmax, lsq,
               err[b], num[b], den[b])
        for k in range(K):
            if np.isinf(iv[k]):
                err[b, k], num[b, k], den[b, k] = _divided(
                    blocks[b], imp[b], scales[b, k], zeros[b, k], fqmin, fqmax, lsq)


def candidate_errors(blocks, imp, scales, zeros, qmin: int, qmax: int, lsq: bool = False):
    """(err, num, den), each (blocks, K) float64, of candidate `scales` (blocks, K; float32
    values, already as stored) and `zeros` (blocks, K; float32, all 0 for a symmetric scheme:
    `lsq` ignores them) on `blocks` (blocks, g) float32 weighted by `imp` (blocks, g) float32.
    num and den are zeros unless `lsq`. See the module's docstring."""
    blocks = readonly(np.ascontiguousarray(blocks, np.float32))
    imp = readonly(np.ascontiguousarray(imp, np.float32))
    st = readonly(np.ascontiguousarray(scales, np.float32))
    zt = readonly(np.ascontiguousarray(zeros, np.float32))
    nbk, K = st.shape
    err = np.zeros((nbk, K))
    num = np.zeros((nbk, K))
    den = np.zeros((nbk, K))
    if K and nbk:
        _candidate_errors(blocks, imp, st, zt, np.float32(qmin), np.float32(qmax),
                          bool(lsq), err, num, den)
    return err, num, den

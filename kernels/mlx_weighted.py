"""numba CPU kernels of the MLX schemes' importance-weighted search (the ``imatrix`` method of
workbench.quant.methods.mlx_weighted), bit for bit its numpy reference: the same candidates in
the same order, the same float32 arithmetic, the same float64 weighted error summed in
numpy's order, so the same winner per group and the same bytes. Imports nothing from
``workbench``.

Per group of G weights x (already in the model's dtype) with importances d (one per column):

* affine (``affine_search``): first mlx's own (scale, bias) (given per group, unrounded), then
  for every (a, c) of the shrink fractions (low end outer) the range
  ``[lo + a·span, hi − c·span]``: codes ``clip(rint((x − l)/s), 0, 2^B − 1)`` with
  ``s = max((h − l)/(2^B − 1), 1e-7)``, the candidate (s, l), then its weighted least squares
  refit (s, b) on those codes; each candidate's stored (scale, bias) are rounded to the scales'
  dtype, its codes are ``clip(rint((x − b̂)/ŝ))`` (0 where ŝ is 0), its values mx.dequantize's
  ``round(round(ŝ·q) + b̂)``; the first candidate of least finite error wins.
* microscaling (``fp_search``): the scale byte mlx picks (given), then the byte moved by each
  step (clipped to 0..top): codes the nearest E2M1 / E4M3 values of ``w / scale`` (rounded to
  the weight's dtype first), values ``value[code] · scale``.

The weighted error is Σ_j d_j (x_j − ŵ_j)², each difference a float32, its square and product
float64, summed as numpy sums a row of G ≤ 128: eight running sums over the elements j ≡ 0..7
(mod 8), then ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)) (numpy's pairwise sum below
its block of 128); the float32 least-squares sums likewise. Rounding to the dtype (dt 0
float32: none; 1 float16: numpy's conversion, NaN payloads included; 2 bfloat16: nearest
even, a NaN kept quiet) matches workbench.schemes.mlx.reference.round_to bit for bit. Rows run
in parallel (prange); each group's result depends on that group alone.
"""

from __future__ import annotations

from . import _numba_prelude  # noqa: F401  (before numba: cheaper start)
import numpy as np
from numba import njit, prange

from .cpu_common import _J, _P, _f32_to_f16_bits
from .cpu_mlx import fp_code

F0 = np.float32(0.0)
EPS = np.float32(1e-7)


@njit(inline="always", **_J)
def _f16_bits(x):
    """float16 bits of float32 x as numpy converts it: nearest even, overflow to Inf, and a NaN
    keeping the top 10 bits of its payload (0x7C01 where they are all zero)."""
    if x != x:
        u = np.int64(np.float32(x).view(np.uint32))
        h = 0x7C00 + ((u & 0x7FFFFF) >> 13)
        if h == 0x7C00:
            h += 1
        return ((u >> 31) << 15) | h
    return _f32_to_f16_bits(x)


@njit(inline="always", **_J)
def _bf16_round(x):
    """float32 x rounded to bfloat16 (nearest even; a NaN kept, quiet), as float32."""
    u = np.int64(np.float32(x).view(np.uint32))
    if x != x:
        h = ((u >> 16) | 0x40) & 0xFFFF
    else:
        h = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
    return np.uint32(h << 16).view(np.float32)


@njit(inline="always", **_J)
def round_to(x, dt, f16tab):
    """float32 x rounded to dtype dt (0 float32, 1 float16, 2 bfloat16), as float32."""
    if dt == 1:
        return f16tab[_f16_bits(x)]
    if dt == 2:
        return _bf16_round(x)
    return x


@njit(**_P)
def round_array(x, dt, f16tab, out):
    """out = round_to(x) elementwise (1-D): the kernels' rounding, for the tests."""
    for i in prange(x.shape[0]):
        out[i] = round_to(x[i], dt, f16tab)


@njit(inline="always", **_J)
def _sum8_close(r):
    return ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))


@njit(inline="always", **_J)
def _beaten(acc, best):
    """Whether partial sums `acc` already end at or above `best` (or at NaN): they only grow
    (every term >= 0), so the candidate cannot win; its sum is given up."""
    return not _sum8_close(acc) < best


@njit(inline="always", **_J)
def _clip_code(v, nbf):
    """numpy's clip(v, 0, nb) (a NaN stays NaN)."""
    if v != v:
        return v
    if v < F0:
        return F0
    if v > nbf:
        return nbf
    return v


@njit(inline="always", **_J)
def _to_u8(v):
    """A clipped code as uint8 (a NaN, never part of a winning candidate, as 0)."""
    if v != v:
        return np.uint8(0)
    return np.uint8(v)


@njit(inline="always", **_J)
def _mlx_error(x, q, o, gs, cc, ss, sb, dt, f16tab, acc):
    """The weighted error of codes cc under the stored (ss, sb) (numpy's summation order)."""
    for t in range(8):
        acc[t] = 0.0
    for j in range(gs):
        v = round_to(round_to(ss * np.float32(cc[j]), dt, f16tab) + sb, dt, f16tab)
        d = np.float64(np.float32(x[o + j] - v))
        acc[j & 7] += d * d * np.float64(q[o + j])
    return _sum8_close(acc)


@njit(inline="always", **_J)
def _affine_candidate(x, q, o, gs, ss, sb, nbf, dt, f16tab, tab, small, acc, cc, best, early):
    """Codes cc = clip(rint((x − sb)/ss), 0, nb) (0 where ss is 0) and their weighted error
    Σ_j d_j (x_j − ŵ_j)² (numpy's summation order; module doc). `early` (every d_j >= 0):
    the sum is given up, returning a partial sum >= `best` (or NaN), once it cannot end below
    `best` (every partial sum only grows), when such a candidate could not win anyway."""
    if ss != F0:
        for j in range(gs):
            cc[j] = _to_u8(_clip_code(np.float32(np.rint(
                np.float32(np.float32(x[o + j] - sb) / ss))), nbf))
    else:
        for j in range(gs):
            cc[j] = 0
    if small:
        for k in range(tab.shape[0]):
            tab[k] = round_to(round_to(ss * np.float32(k), dt, f16tab) + sb, dt, f16tab)
    for t in range(8):
        acc[t] = 0.0
    for k0 in range(0, gs, 8):
        for t in range(8):
            j = k0 + t
            c = cc[j]
            if small:
                v = tab[c]
            else:
                v = round_to(round_to(ss * np.float32(c), dt, f16tab) + sb, dt, f16tab)
            d = np.float64(np.float32(x[o + j] - v))
            acc[t] += d * d * np.float64(q[o + j])
        if early and _beaten(acc, best):
            break
    return _sum8_close(acc)


@njit(**_P)
def affine_search(x, imp, s0, b0, bits, gs, dt, f16tab, shrink, early, codes, bs, bb):
    """The weighted search of every group of float32 x (rows, cols) (module doc): codes
    (rows, cols) uint8, bs / bb (rows, cols/gs) the winners' stored scale and bias (float32
    values of dtype dt). imp (cols,) float32; s0 / b0 (rows, cols/gs) float32: mlx's own
    unrounded parameters (workbench.schemes.mlx.reference.affine_params); shrink: the
    fractions; early: every importance is >= 0 (a losing candidate's sum may stop early)."""
    rows, cols = x.shape
    ng = cols // gs
    nb = (1 << bits) - 1
    nbf = np.float32(nb)
    nq = nb + 1
    small = nq < gs
    ns = shrink.shape[0]
    # per group of columns (the same for every row): Σ d and its 8 partial sums' order
    sw = np.empty(ng, np.float32)
    r8 = np.empty(8, np.float32)
    for g in range(ng):
        for t in range(8):
            r8[t] = F0
        for j in range(gs):
            r8[j & 7] += imp[g * gs + j]
        sw[g] = _sum8_close(r8)
    for r in prange(rows):
        xr = x[r]
        cf = np.empty(gs, np.float32)
        cc = np.empty(gs, np.uint8)
        best_c = codes[r]
        tab = np.empty(nq if small else 1, np.float32)
        acc = np.empty(8, np.float64)
        a32 = np.empty(8, np.float32)
        b32 = np.empty(8, np.float32)
        for g in range(ng):
            o = g * gs
            s = s0[r, g]
            b = b0[r, g]
            for j in range(gs):
                v = _clip_code(np.float32(np.rint(np.float32(np.float32(xr[o + j] - b) / s))),
                               nbf)
                cc[j] = _to_u8(v)
            ss = round_to(s, dt, f16tab)
            sb = round_to(b, dt, f16tab)
            best = _mlx_error(xr, imp, o, gs, cc, ss, sb, dt, f16tab, acc)
            for j in range(gs):
                best_c[o + j] = cc[j]
            bs[r, g] = ss
            bb[r, g] = sb
            lo = xr[o]
            hi = xr[o]
            for j in range(1, gs):
                v = xr[o + j]
                if v < lo:
                    lo = v
                if v > hi:
                    hi = v
            span = np.float32(hi - lo)
            # Σ d·x / Σ d: the same for every candidate
            for t in range(8):
                a32[t] = F0
            for j in range(gs):
                a32[j & 7] += np.float32(imp[o + j] * xr[o + j])
            mw = np.float32(_sum8_close(a32) / sw[g])
            for ia in range(ns):
                l2 = np.float32(lo + np.float32(shrink[ia] * span))
                for ic in range(ns):
                    h2 = np.float32(hi - np.float32(shrink[ic] * span))
                    t0 = np.float32(np.float32(h2 - l2) / nbf)
                    s = t0 if (t0 != t0 or t0 >= EPS) else EPS
                    for j in range(gs):
                        cf[j] = _clip_code(np.float32(np.rint(
                            np.float32(np.float32(xr[o + j] - l2) / s))), nbf)
                    for fit in range(2):
                        sf = s
                        bf = l2
                        if fit == 1:             # weighted least squares of x on the codes
                            for t in range(8):
                                a32[t] = F0
                            for j in range(gs):
                                a32[j & 7] += np.float32(imp[o + j] * cf[j])
                            mq = np.float32(_sum8_close(a32) / sw[g])
                            for t in range(8):
                                a32[t] = F0
                                b32[t] = F0
                            for j in range(gs):
                                dq = np.float32(cf[j] - mq)
                                a32[j & 7] += np.float32(imp[o + j] * np.float32(dq * dq))
                                b32[j & 7] += np.float32(np.float32(imp[o + j] * dq)
                                                         * np.float32(xr[o + j] - mw))
                            var = _sum8_close(a32)
                            cov = _sum8_close(b32)
                            if var > F0:
                                sf = np.float32(cov / var)
                                bf = np.float32(mw - np.float32(sf * mq))
                        ss = round_to(sf, dt, f16tab)
                        sb = round_to(bf, dt, f16tab)
                        e = _affine_candidate(xr, imp, o, gs, ss, sb, nbf, dt, f16tab, tab,
                                              small, acc, cc, best, early)
                        if np.isfinite(e) and e < best:
                            best = e
                            for j in range(gs):
                                best_c[o + j] = cc[j]
                            bs[r, g] = ss
                            bb[r, g] = sb


@njit(inline="always", **_J)
def _fp_candidate(w, q, o, gs, sv, mode, dt, f16tab, lut, acc, cc, best, early):
    """cc = the E2M1 (mode 1, 2) or E4M3 (mode 3) codes of w / sv (rounded to dtype dt) and
    their weighted error, given up as `_affine_candidate`'s when `early`."""
    for t in range(8):
        acc[t] = 0.0
    for k0 in range(0, gs, 8):
        for t in range(8):
            j = k0 + t
            y = np.float32(w[o + j] / sv) if sv > F0 else F0
            c = np.uint8(fp_code(round_to(y, dt, f16tab), mode))
            cc[j] = c
            d = np.float64(np.float32(w[o + j] - np.float32(lut[c] * sv)))
            acc[t] += d * d * np.float64(q[o + j])
        if early and _beaten(acc, best):
            break
    return _sum8_close(acc)


@njit(**_P)
def fp_search(w, imp, s0, mode, gs, dt, f16tab, scale_vals, lut, steps, top, early, codes,
              s_out):
    """The weighted scale-byte search of mxfp4 / nvfp4 / mxfp8 (modes 1, 2, 3) over float32 w
    (rows, cols) already in dtype dt: codes (rows, cols) uint8 (an E2M1 code or an E4M3 byte
    each), s_out (rows, cols/gs) the winning scale bytes. s0: mlx's own bytes
    (reference.fp_scales); scale_vals: each byte's float32 scale; lut: each code's value;
    steps: the byte moves tried after s0, each clipped to 0..top; early: as affine_search's."""
    rows, cols = w.shape
    ng = cols // gs
    for r in prange(rows):
        wr = w[r]
        cc = np.empty(gs, np.uint8)
        acc = np.empty(8, np.float64)
        best_c = codes[r]
        for g in range(ng):
            o = g * gs
            sb0 = np.int64(s0[r, g])
            best = _fp_candidate(wr, imp, o, gs, scale_vals[sb0], mode, dt, f16tab, lut, acc, cc,
                                 np.inf, False)
            for j in range(gs):
                best_c[o + j] = cc[j]
            s_out[r, g] = np.uint8(sb0)
            for k in range(steps.shape[0]):
                sb = min(max(sb0 + steps[k], 0), top)
                sv = scale_vals[sb]
                e = _fp_candidate(wr, imp, o, gs, sv, mode, dt, f16tab, lut, acc, cc, best, early)
                if np.isfinite(e) and e < best:
                    best = e
                    for j in range(gs):
                        best_c[o + j] = cc[j]
                    s_out[r, g] = np.uint8(sb)

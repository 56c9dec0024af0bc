"""numba quantize kernel for IQ3_XXS and IQ3_S (llama.cpp's 3-bit lattice types), bit-identical
to the numpy reference ``workbench.schemes.ggml.iq3`` (its docstring has the search), plain and
importance-weighted: every sum float32 in index order from 0, no FMA contraction.

One super-block (256 weights) at a time per row chunk: power-of-two normalization, weights,
signs, per 32-weight sub-block the 31 trial scales plus one refinement (grid point or the best
of its neighbours for each group of 4), the least-squares super-scale, the float16 d, the
4-bit sub-block scales and a last choice of the groups at the final scales.

``iq3_encode`` flags per row: 1 the float16 d overflows, 2 NaN/Inf in the row (the reference
decides / refuses). Imports nothing from ``workbench``.
"""

from __future__ import annotations

from . import _numba_prelude  # noqa: F401  (before numba: cheaper start)

import math

import numpy as np
from numba import njit, prange

from . import iq3_grids, tables
from .cpu_common import _f32_to_f16_bits, _row_flag

_J = dict(cache=True, nogil=True)
_P = dict(cache=True, nogil=True, parallel=True)

F32 = np.float32
EPS_SUB = np.float32(1e-8)
EPS_SUPER = np.float32(1e-15)


@njit(**_J)
def _level(v, top):
    """clamp(rint(v), 0, top) of a float32 with NaN -> 0 (numpy: nan_to_num then clip)."""
    r = np.rint(v)
    if r != r:
        return 0
    if r <= 0:
        return 0
    if r >= top:
        return top
    return np.int64(r)


@njit(**_J)
def _assign(xv, w, o, iscale, scale, kmap, nbr, vals, gout):
    """Grid indices of the 8 groups of sub-block xv[o:o+32] into gout[0:8]."""
    for g in range(8):
        u = 0
        for i in range(4):
            lv = _level(F32(0.5) * (iscale * xv[o + 4 * g + i] - F32(1.0)), 7)
            u |= lv << (3 * i)
        gi = kmap[u]
        if gi < 0:
            best = np.inf
            for k in range(nbr.shape[1]):
                c = nbr[u, k]
                if c < 0:
                    break
                d2 = F32(0.0)
                for i in range(4):
                    diff = scale * vals[c, i] - xv[o + 4 * g + i]
                    d2 = d2 + w[o + 4 * g + i] * diff * diff
                if d2 < best:               # NaN never wins (numpy: NaN -> inf)
                    best = d2
                    gi = c
            if gi < 0:
                gi = nbr[u, 0]
        gout[g] = gi


@njit(**_J)
def _sums(xv, w, o, g, vals):
    a = F32(0.0)
    b = F32(0.0)
    for j in range(32):
        q = vals[g[j // 4], j % 4]
        wq = w[o + j] * q
        a = a + wq * xv[o + j]
        b = b + wq * q
    return a, b


@njit(**_J)
def _levels16(d, s):
    idd = F32(1.0) / d if d > 0 else F32(0.0)
    return _level(F32(0.5) * (idd * s - F32(1.0)), 15)


@njit(**_J)
def _enc_super(x, qrow, o, weighted, is_xxs, kmap, nbr, vals, f16, xv, w, neg, gi, gtmp,
               s, a, b, out, p):
    """The super-block x[o:o+256] -> out[p:p+bpb]; returns its flags."""
    amax = F32(0.0)
    for j in range(256):
        v = abs(x[o + j])
        if v > amax:
            amax = v
    e = 0
    if not (amax < EPS_SUPER):
        e = math.frexp(np.float64(amax))[1]
    for j in range(256):
        xv[j] = F32(0.0) if amax < EPS_SUPER else F32(math.ldexp(np.float64(x[o + j]), -e))
    # weights: (qw) * sqrt(2 sum x^2 / 256 + x^2)
    sig = xv[0] * xv[0]
    for j in range(1, 256):
        sig = sig + xv[j] * xv[j]
    sig = sig * F32(2.0 / 256)
    for j in range(256):
        r = np.sqrt(sig + xv[j] * xv[j])
        w[j] = qrow[o + j] * r if weighted else r
    # signs and magnitudes
    for j in range(256):
        neg[j] = xv[j] < 0
        xs = xv[j]
        xv[j] = abs(xs)
    if is_xxs:
        for k in range(32):
            cnt = 0
            for i in range(8):
                cnt += neg[8 * k + i]
            if cnt % 2 == 1:
                im = 0
                mn = F32(0.0)
                for i in range(8):
                    j = 8 * k + i
                    xs = -xv[j] if neg[j] else xv[j]
                    t = w[j] * xs * xs
                    if i == 0 or t < mn:
                        mn = t
                        im = i
                j = 8 * k + im
                neg[j] = not neg[j]
                xv[j] = -xv[j]
    # sub-blocks
    smax = F32(0.0)
    for ib in range(8):
        ob = 32 * ib
        mx = xv[ob]
        for j in range(1, 32):
            if xv[ob + j] > mx:
                mx = xv[ob + j]
        tiny = mx < EPS_SUB
        mxs = F32(1.0) if tiny else mx
        scale = mxs / F32(15.0)
        best = F32(0.0)
        ab = F32(0.0)
        bb = F32(0.0)
        for g in range(8):
            gi[ib * 8 + g] = 0
        for t in range(-15, 17):
            isc = (F32(15.0) + F32(t) * F32(0.2)) / mxs if t <= 15 else F32(1.0) / mxs
            _assign(xv, w, ob, isc, F32(1.0) / isc, kmap, nbr, vals, gtmp)
            aa, bt = _sums(xv, w, ob, gtmp, vals)
            if bt > 0 and aa > 0 and aa * aa > best * bt:
                sc = aa / bt
                scale = sc
                best = sc * aa
                ab = aa
                bb = bt
                for g in range(8):
                    gi[ib * 8 + g] = gtmp[g]
        if scale > 0:
            _assign(xv, w, ob, F32(1.0) / scale, scale, kmap, nbr, vals, gtmp)
            aa, bt = _sums(xv, w, ob, gtmp, vals)
            if bt > 0 and aa > 0 and aa * aa > best * bt:
                scale = aa / bt
                ab = aa
                bb = bt
                for g in range(8):
                    gi[ib * 8 + g] = gtmp[g]
        if tiny:
            for g in range(8):
                gi[ib * 8 + g] = 0
            scale = F32(0.0)
            ab = F32(0.0)
            bb = F32(0.0)
        s[ib] = scale
        a[ib] = ab
        b[ib] = bb
        if ib == 0 or scale > smax:
            smax = scale
    zero = not (smax > 0)
    dn = F32(0.0)
    if not zero:
        dn = smax / F32(31.0)
        for _ in range(2):
            num = F32(0.0)
            den = F32(0.0)
            for ib in range(8):
                k = F32(2 * _levels16(dn, s[ib]) + 1)
                num = num + k * a[ib]
                den = den + (k * k) * b[ib]
            if num > 0 and den > 0:
                dn = num / den
    h = _f32_to_f16_bits(F32(math.ldexp(np.float64(dn), e)))
    out[p] = np.uint8(h & 255)
    out[p + 1] = np.uint8(h >> 8)
    if (h & 0x7C00) == 0x7C00:
        return 1
    dhn = F32(math.ldexp(np.float64(f16[h]), -e))
    for ib in range(8):
        lv = _levels16(dhn, s[ib])
        sf = dhn * F32(2 * lv + 1)
        if sf > 0:
            _assign(xv, w, 32 * ib, F32(1.0) / sf, sf, kmap, nbr, vals, gtmp)
            a2, b2 = _sums(xv, w, 32 * ib, gtmp, vals)
            if sf * (sf * b2 - F32(2.0) * a2) < sf * (sf * b[ib] - F32(2.0) * a[ib]):
                for g in range(8):
                    gi[ib * 8 + g] = gtmp[g]
        if zero:
            lv = 0
            for g in range(8):
                gi[ib * 8 + g] = 0
        # pack the sub-block
        if is_xxs:
            u = np.uint32(lv) << np.uint32(28)
            for k in range(4):
                sb = 0
                for i in range(7):
                    if neg[32 * ib + 8 * k + i] and not zero:
                        sb |= 1 << i
                u |= np.uint32(sb) << np.uint32(7 * k)
            for g in range(8):
                out[p + 2 + 8 * ib + g] = np.uint8(gi[ib * 8 + g])
            q = p + 66 + 4 * ib
            out[q] = np.uint8(u & np.uint32(255))
            out[q + 1] = np.uint8((u >> np.uint32(8)) & np.uint32(255))
            out[q + 2] = np.uint8((u >> np.uint32(16)) & np.uint32(255))
            out[q + 3] = np.uint8(u >> np.uint32(24))
        else:
            hb = 0
            for g in range(8):
                v = gi[ib * 8 + g]
                out[p + 2 + 8 * ib + g] = np.uint8(v & 255)
                hb |= ((v >> 8) & 1) << g
            out[p + 66 + ib] = np.uint8(hb)
            for k in range(4):
                sb = 0
                for i in range(8):
                    if neg[32 * ib + 8 * k + i] and not zero:
                        sb |= 1 << i
                out[p + 74 + 4 * ib + k] = np.uint8(sb)
            if ib % 2 == 0:
                out[p + 106 + ib // 2] = np.uint8(lv)
            else:
                out[p + 106 + ib // 2] |= np.uint8(lv << 4)
    return 0


@njit(**_P)
def iq3_encode(wt, qw, weighted, is_xxs, bpb, kmap, nbr, vals, f16, blocks, flags):
    """IQ3_XXS (is_xxs) / IQ3_S blocks of wt (rows, cols % 256 == 0) into blocks (rows,
    cols/256*bpb); with `weighted`, qw (rows or 1, cols) is the importance (finite, >= 0)."""
    rows, cols = wt.shape
    nb = cols // 256
    nch = min(rows, 256)
    for ch in prange(nch):
        xv = np.empty(256, np.float32)
        w = np.empty(256, np.float32)
        neg = np.empty(256, np.bool_)
        gi = np.empty(64, np.int64)
        gtmp = np.empty(8, np.int64)
        s = np.empty(8, np.float32)
        a = np.empty(8, np.float32)
        b = np.empty(8, np.float32)
        for r in range(ch * rows // nch, (ch + 1) * rows // nch):
            row = wt[r]
            qrow = qw[r if qw.shape[0] > 1 else 0]
            out = blocks[r]
            f = _row_flag(row)
            if f == 0:
                for bi in range(nb):
                    f |= _enc_super(row, qrow, bi * 256, weighted, is_xxs, kmap, nbr, vals,
                                    f16, xv, w, neg, gi, gtmp, s, a, b, out, bi * bpb)
            flags[r] = f


def encode_blocks(ggml_name: str, w2d: np.ndarray, blocks: np.ndarray, flags: np.ndarray,
                  qw: np.ndarray | None = None) -> None:
    """Fill blocks (rows, cols/256*bpb uint8) and flags (rows uint8) from float32 w2d;
    qw: optional importance (rows or 1, cols), finite and >= 0."""
    from .host import readonly
    which = "xxs" if ggml_name == "IQ3_XXS" else "s"
    kmap, nbr = iq3_grids.neighbours(which)
    grid = iq3_grids.IQ3XXS_GRID if which == "xxs" else iq3_grids.IQ3S_GRID
    vals = grid.astype(np.float32) / np.float32(4) if which == "xxs" else grid.astype(np.float32)
    weighted = qw is not None
    q = (np.ascontiguousarray(qw, np.float32).reshape(-1, w2d.shape[1]) if weighted
         else np.ones((1, w2d.shape[1]), np.float32))
    iq3_encode(readonly(w2d), readonly(q), weighted, which == "xxs",
               98 if which == "xxs" else 110, kmap, nbr, readonly(vals), tables.f16_table(),
               blocks, flags)

"""numba quantize kernel for IQ1_S and IQ1_M (llama.cpp's 1-bit lattice types), bit-identical
to the numpy reference ``workbench.schemes.ggml.iq1`` (its docstring has the search), plain and
importance-weighted: every sum float32 in index order, no FMA contraction.

One super-block (256 weights) at a time per row chunk: power-of-two normalization, weights,
per sub-block (IQ1_S 32 weights, one shift unit; IQ1_M 16 weights, two units of 8) ggml's
exhaustive split on the sorted weights, the grid points (or the best neighbour), the
least-squares scale; then the float16 d among a few candidates with each sub-block's best
3-bit l, the groups chosen again at the final scales for both shift signs, l once more.

``iq1_encode`` flags per row: 1 the float16 d overflows, 2 NaN/Inf in the row (the reference
decides / refuses). Imports nothing from ``workbench``.
"""

from __future__ import annotations

from . import _numba_prelude  # noqa: F401  (before numba: cheaper start)

import math

import numpy as np
from numba import njit, prange

from . import iq1_grids, tables
from .cpu_common import _f32_to_f16_bits, _row_flag
from .iq_lattice import lattice

_J = dict(cache=True, nogil=True)
_P = dict(cache=True, nogil=True, parallel=True)

F32 = np.float32
EPS_SUB = np.float32(1e-8)
EPS_SUPER = np.float32(1e-15)
DELTA = iq1_grids.DELTA
#: ggml's 1.125 first (the numpy reference's D_FACTORS)
D_FACTORS = np.array([1.125 * (1 + 0.04 * c) for c in (0, -1, 1, -2, 2, -3, -4)], np.float32)


@njit(**_J)
def _finite(v):
    return v - v == 0


@njit(**_J)
def _pick(x, wt, o, lvl, lo, dl, scale, kmap, nbr, grid):
    """Grid index of the group x[o:o+8] with levels lvl[lo:lo+8] (0..2) and shift dl: the
    rounded point when on the grid, else its neighbour of least sum wt (scale v - x)^2."""
    u = 0
    for i in range(8):
        u |= lvl[lo + i] << (2 * i)
    gi = kmap[u]
    if gi >= 0:
        return gi
    row = -gi - 1
    best = np.inf
    gi = -1
    for k in range(nbr.shape[1]):
        c = nbr[row, k]
        if c < 0:
            break
        d2 = F32(0.0)
        for i in range(8):
            diff = scale * (grid[c, i] + dl) - x[o + i]
            d2 = d2 + wt[o + i] * diff * diff
        if d2 < best:
            best = d2
            gi = c
    if gi < 0:
        gi = nbr[row, 0]
    return gi


@njit(**_J)
def _best_levels(dn, a, b, nsb, lout):
    tot = F32(0.0)
    for ib in range(nsb):
        e_min = F32(np.inf)
        lm = 0
        for lv in range(8):
            db = dn * F32(2 * lv + 1)
            e = db * db * b[ib] - F32(2.0) * db * a[ib]
            if e < e_min:
                e_min = e
                lm = lv
        lout[ib] = lm
        tot = tot + e_min
    return tot


@njit(**_J)
def _ab(x, wt, gi, sg, o, S, U, grid, a, b, ib):
    """a[ib], b[ib] = sum wt x v, sum wt v v over the sub-block at o (index order)."""
    aa = F32(0.0)
    bb = F32(0.0)
    for j in range(S):
        g = (o + j) // 8
        dl = -DELTA if sg[(o + j) // U] == 1 else DELTA
        v = grid[gi[g], j % 8] + dl
        qv = wt[o + j] * v
        aa = aa + qv * x[o + j]
        bb = bb + qv * v
    a[ib] = aa
    b[ib] = bb


@njit(**_J)
def _unit_err(x, q, gi, dl, o, U, sf, grid):
    t = F32(0.0)
    for j in range(U):
        diff = sf * (grid[gi[(o + j) // 8], j % 8] + dl) - x[o + j]
        t = t + q[o + j] * diff * diff
    return t


@njit(**_J)
def _split(xv, w, o, S, units, order, px, pw, hx, h2, lv, sg, vals, sqs):
    """ggml's exhaustive split of the sub-block at o (module docstring) -> its scale; levels into
    lv[o:o+S], shift signs into sg[o/U ...]."""
    U = S // units
    mx = F32(0.0)
    for j in range(S):
        if abs(xv[o + j]) > mx:
            mx = abs(xv[o + j])
    # stable insertion sort of the indices by value
    for j in range(S):
        order[j] = j
    for j in range(1, S):
        c = order[j]
        k = j - 1
        while k >= 0 and xv[o + order[k]] > xv[o + c]:
            order[k + 1] = order[k]
            k -= 1
        order[k + 1] = c
    for h in range(units):
        px[h, 0] = F32(0.0)
        pw[h, 0] = F32(0.0)
    for j in range(S):
        i = order[j]
        hh = i // U
        for h in range(units):
            px[h, j + 1] = px[h, j]
            pw[h, j + 1] = pw[h, j]
        px[hh, j + 1] = px[hh, j] + w[o + i] * xv[o + i]
        pw[hh, j + 1] = pw[hh, j] + w[o + i]
    best = -np.inf
    b1 = -1
    b2 = -1
    bk = 0
    scale = F32(0.0)
    ncomb = 1 << units
    for i1 in range(S + 1):
        for i2 in range(i1, S + 1):
            for h in range(units):
                a1 = px[h, i1]
                a2 = px[h, i2]
                a3 = px[h, S] - a2
                c1 = pw[h, i1]
                c2 = pw[h, i2]
                c3 = pw[h, S] - c2
                for s in range(2):
                    hx[h, s] = a1 * vals[s, 0] + (a2 - a1) * vals[s, 1] + a3 * vals[s, 2]
                    h2[h, s] = c1 * sqs[s, 0] + (c2 - c1) * sqs[s, 1] + c3 * sqs[s, 2]
            for k in range(ncomb):
                s = (k >> (units - 1)) & 1
                tx = hx[0, s]
                t2 = h2[0, s]
                for h in range(1, units):
                    s = (k >> (units - 1 - h)) & 1
                    tx = tx + hx[h, s]
                    t2 = t2 + h2[h, s]
                if t2 > 0:
                    sc = tx * tx / t2
                    if sc > best:
                        best = sc
                        b1 = i1
                        b2 = i2
                        bk = k
                        scale = tx / t2
    dead = b1 < 0 or not (mx >= EPS_SUB) or not _finite(scale)
    flip = scale < 0
    for j in range(S):
        i = order[j]
        lvj = 0 if j < b1 else (1 if j < b2 else 2)
        lv[o + i] = 1 if dead else (2 - lvj if flip else lvj)
    for h in range(units):
        s = (bk >> (units - 1 - h)) & 1
        sg[o // U + h] = 0 if dead else (1 - s if flip else s)
    if dead:
        return F32(0.0)
    return -scale if flip else scale


@njit(**_J)
def _enc_super(x, qrow, o, weighted, is_m, kmap, nbr, grid, f16, dfac, xv, w, q, lv, gi,
               sg, gnew, order, px, pw, hx, h2, scale, a, b, lvl, ltmp, vals, sqs, out, p):
    S = 16 if is_m else 32
    units = 2 if is_m else 1
    U = S // units
    nsb = 256 // S
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
    sig = xv[0] * xv[0]
    for j in range(1, 256):
        sig = sig + xv[j] * xv[j]
    sig = sig * F32(2.0 / 256)
    for j in range(256):
        r = np.sqrt(sig + xv[j] * xv[j])
        w[j] = qrow[o + j] * r if weighted else r
        q[j] = qrow[o + j] if weighted else F32(1.0)
    # per sub-block: split, grid points, least-squares scale
    smax = F32(0.0)
    for ib in range(nsb):
        ob = ib * S
        sc = _split(xv, w, ob, S, units, order, px, pw, hx, h2, lv, sg, vals, sqs)
        for g in range(S // 8):
            go = ob + 8 * g
            dl = -DELTA if sg[go // U] == 1 else DELTA
            gi[go // 8] = _pick(xv, w, go, lv, go, dl, sc, kmap, nbr, grid)
        _ab(xv, w, gi, sg, ob, S, U, grid, a, b, ib)
        if sc > 0 and a[ib] > 0 and b[ib] > 0:
            r = a[ib] / b[ib]
            if _finite(r):
                sc = r
        scale[ib] = sc
        if ib == 0 or sc > smax:
            smax = sc
    zero = not (smax > 0)
    if zero:
        smax = F32(1.0)
    for ib in range(nsb):
        _ab(xv, q, gi, sg, ib * S, S, U, grid, a, b, ib)
    # d among the candidates, each sub-block its best l
    h0 = _f32_to_f16_bits(F32(math.ldexp(np.float64(smax / F32(15.0) * dfac[0]), e)))
    best_h = h0
    best_t = F32(np.inf)
    for ib in range(nsb):
        lvl[ib] = 0
    for c in range(dfac.shape[0] + 1):
        if c < dfac.shape[0]:
            dn = smax / F32(15.0) * dfac[c]
        else:
            num = F32(0.0)
            den = F32(0.0)
            for ib in range(nsb):
                k = F32(2 * lvl[ib] + 1)
                num = num + k * a[ib]
                den = den + (k * k) * b[ib]
            if not (num > 0 and den > 0):
                continue
            dn = num / den
        h = _f32_to_f16_bits(F32(math.ldexp(np.float64(dn), e)))
        if (h & 0x7C00) == 0x7C00:
            continue
        dhn = F32(math.ldexp(np.float64(f16[h]), -e))
        if not _finite(dhn):
            continue
        tot = _best_levels(dhn, a, b, nsb, ltmp)
        if tot < best_t:
            best_t = tot
            best_h = h
            for ib in range(nsb):
                lvl[ib] = ltmp[ib]
    if zero:
        best_h = 0
    if (best_h & 0x7C00) == 0x7C00:
        out[p] = np.uint8(best_h & 255)
        out[p + 1] = np.uint8(best_h >> 8)
        return 1
    dhn = F32(math.ldexp(np.float64(f16[best_h]), -e))
    # the groups again at the final scales, both shift signs
    if not zero:
        for ib in range(nsb):
            sf = dhn * F32(2 * lvl[ib] + 1)
            if not (sf > 0):
                continue
            isf = F32(1.0) / sf
            for u in range(units):
                ou = ib * S + u * U
                iu = ou // U
                dl0 = -DELTA if sg[iu] == 1 else DELTA
                e_best = _unit_err(xv, q, gi, dl0, ou, U, sf, grid)
                for flip in range(2):
                    s_new = sg[iu] ^ flip
                    dl = -DELTA if s_new == 1 else DELTA
                    for j in range(U):
                        r = np.rint(xv[ou + j] * isf - dl)
                        if r != r:
                            r = F32(0.0)
                        rr = 0 if r <= -1 else (2 if r >= 1 else 1)
                        order[j] = rr
                    for g in range(U // 8):
                        gnew[ou // 8 + g] = _pick(xv, q, ou + 8 * g, order, 8 * g, dl, sf,
                                                  kmap, nbr, grid)
                    t = F32(0.0)
                    for j in range(U):
                        diff = sf * (grid[gnew[(ou + j) // 8], j % 8] + dl) - xv[ou + j]
                        t = t + q[ou + j] * diff * diff
                    if t < e_best:
                        e_best = t
                        sg[iu] = s_new
                        for g in range(U // 8):
                            gi[ou // 8 + g] = gnew[ou // 8 + g]
        for ib in range(nsb):
            _ab(xv, q, gi, sg, ib * S, S, U, grid, a, b, ib)
        _best_levels(dhn, a, b, nsb, lvl)
    else:
        for j in range(32):
            gi[j] = 0
        for j in range(16):
            sg[j] = 0
        for ib in range(nsb):
            lvl[ib] = 0
    # pack
    if not is_m:
        out[p] = np.uint8(best_h & 255)
        out[p + 1] = np.uint8(best_h >> 8)
        for ib in range(8):
            hq = (lvl[ib] << 12) | (sg[ib] << 15)
            for k in range(4):
                g = gi[4 * ib + k]
                out[p + 2 + 4 * ib + k] = np.uint8(g & 255)
                hq |= (g >> 8) << (3 * k)
            out[p + 34 + 2 * ib] = np.uint8(hq & 255)
            out[p + 35 + 2 * ib] = np.uint8(hq >> 8)
    else:
        for j in range(32):
            out[p + j] = np.uint8(gi[j] & 255)
        for ib in range(16):
            out[p + 32 + ib] = np.uint8((gi[2 * ib] >> 8) | (sg[2 * ib] << 3)
                                        | ((gi[2 * ib + 1] >> 8) << 4) | (sg[2 * ib + 1] << 7))
        for i in range(4):
            s16 = ((best_h >> (4 * i)) & 15) << 12
            for k in range(4):
                s16 |= lvl[4 * i + k] << (3 * k)
            out[p + 48 + 2 * i] = np.uint8(s16 & 255)
            out[p + 49 + 2 * i] = np.uint8(s16 >> 8)
    return 0


@njit(**_P)
def iq1_encode(wt, qw, weighted, is_m, bpb, kmap, nbr, grid, f16, dfac, vals, sqs, blocks,
               flags):
    """IQ1_M (is_m) / IQ1_S blocks of wt (rows, cols % 256 == 0) into blocks (rows,
    cols/256*bpb); with `weighted`, qw (rows or 1, cols) is the importance (finite, >= 0)."""
    rows, cols = wt.shape
    nb = cols // 256
    nch = min(rows, 256)
    for ch in prange(nch):
        xv = np.empty(256, np.float32)
        w = np.empty(256, np.float32)
        q = np.empty(256, np.float32)
        lv = np.empty(256, np.int64)
        gi = np.empty(32, np.int64)
        gnew = np.empty(32, np.int64)
        sg = np.empty(32, np.int64)
        order = np.empty(32, np.int64)
        px = np.empty((2, 33), np.float32)
        pw = np.empty((2, 33), np.float32)
        hx = np.empty((2, 2), np.float32)
        h2 = np.empty((2, 2), np.float32)
        scale = np.empty(16, np.float32)
        a = np.empty(16, np.float32)
        b = np.empty(16, np.float32)
        lvl = np.empty(16, np.int64)
        ltmp = np.empty(16, np.int64)
        for r in range(ch * rows // nch, (ch + 1) * rows // nch):
            row = wt[r]
            qrow = qw[r if qw.shape[0] > 1 else 0]
            out = blocks[r]
            f = _row_flag(row)
            if f == 0:
                for bi in range(nb):
                    f |= _enc_super(row, qrow, bi * 256, weighted, is_m, kmap, nbr, grid, f16,
                                    dfac, xv, w, q, lv, gi, sg, gnew, order, px, pw, hx,
                                    h2, scale, a, b, lvl, ltmp, vals, sqs, out, bi * bpb)
            flags[r] = f


def _tables():
    lat = lattice("iq1")
    vals = np.zeros((2, 3), np.float32)
    sqs = np.zeros((2, 3), np.float32)
    for s, dl in enumerate((DELTA, -DELTA)):
        v = (np.float32(-1) + dl, dl, np.float32(1) + dl)
        vals[s] = v
        sqs[s] = [np.float32(t * t) for t in v]
    return lat.kmap, lat.neighbours, iq1_grids.GRID.astype(np.float32), vals, sqs


def encode_blocks(ggml_name: str, w2d: np.ndarray, blocks: np.ndarray, flags: np.ndarray,
                  qw: np.ndarray | None = None) -> None:
    """Fill blocks (rows, cols/256*bpb uint8) and flags (rows uint8) from float32 w2d;
    qw: optional importance (rows or 1, cols), finite and >= 0."""
    from .host import readonly
    kmap, nbr, grid, vals, sqs = _tables()
    is_m = ggml_name == "IQ1_M"
    weighted = qw is not None
    q = (np.ascontiguousarray(qw, np.float32).reshape(-1, w2d.shape[1]) if weighted
         else np.ones((1, w2d.shape[1]), np.float32))
    iq1_encode(readonly(w2d), readonly(q), weighted, is_m, 56 if is_m else 50, readonly(kmap),
               readonly(nbr), readonly(grid), tables.f16_table(), readonly(D_FACTORS),
               readonly(vals), readonly(sqs), blocks, flags)

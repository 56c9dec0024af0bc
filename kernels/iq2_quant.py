"""numba quantize kernel of llama.cpp's 2-bit lattice i-quants (IQ2_XXS, IQ2_XS, IQ2_S),
bit-identical to the numpy reference ``workbench.schemes.ggml.iq2`` (ggml's search in float32,
operation for operation, then the workbench's choice of d and the 4-bit sub-block scales).

One super-block at a time (rows in parallel): ggml's search weights, the signs, ggml's
make_qp_quants, the 13 trial scales with the neighbour search off the grid
(kernels/iq_lattice.py tables), then the d candidates and the 4-bit scales of least
importance-weighted error. Flags per row: 1 the float16 d overflows, 2 NaN/Inf in the row.
Imports nothing from ``workbench``.
"""

from __future__ import annotations

from . import _numba_prelude  # noqa: F401  (before numba: cheaper start)

import numpy as np
from numba import njit, prange

from .cpu_common import _f32_to_f16_bits, _row_flag
from .host import readonly
from .iq_lattice import KSIGNS, lattice

_J = dict(cache=True, nogil=True)
_P = dict(cache=True, nogil=True, parallel=True)
F0 = np.float32(0.0)
F1 = np.float32(1.0)
EPS = np.float32(1e-15)
KMAXQ = 3
#: the reference's D_FACTORS (workbench/schemes/ggml/iq2.py), in the same order
D_FACTORS = np.array([1.0 + 0.02 * c for c in (0, -1, 1, -2, 2, -3, -4)], np.float32)
#: IQ2_S's (ggml stores max scale / 31 * 0.9875): 0.9875 times those, in float32
D_FACTORS_S = (np.float32(0.9875) * D_FACTORS).astype(np.float32)
EPS_S = np.float32(1e-8)


@njit(inline="always", **_J)
def _ni(v):
    r = np.rint(v)
    if r != r:
        return 0
    if r > np.float32(2 ** 30):
        return 2 ** 30
    if r < np.float32(-2 ** 30):
        return -2 ** 30
    return int(r)


@njit(**_J)
def _make_qp(x, w, nmax, L):
    """ggml's make_qp_quants(32, nmax, x, L, w) -> scale; L (uint8 semantics) scratch."""
    mx = F0
    for i in range(32):
        if not (mx > x[i]):
            mx = x[i]
    if mx < EPS:
        return F0
    fn = np.float32(nmax)
    iscale = fn / mx
    scale = F1 / iscale
    best = F0
    for i in range(32):
        diff = x[i] - scale * np.float32(_ni(iscale * x[i]) & 255)
        best = best + w[i] * diff * diff
    for is_ in range(-4, 5):
        if is_ == 0:
            continue
        isc = (np.float32(0.1) * np.float32(is_) + fn) / mx
        sc = F1 / isc
        mse = F0
        for i in range(32):
            diff = x[i] - sc * np.float32(min(nmax, _ni(isc * x[i])))
            mse = mse + w[i] * diff * diff
        if mse < best:
            best = mse
            iscale = isc
    sumlx = F0
    suml2 = F0
    for i in range(32):
        l = min(nmax, _ni(iscale * x[i]))
        lf = np.float32(l)
        sumlx = sumlx + w[i] * x[i] * lf
        suml2 = suml2 + w[i] * lf * lf
        L[i] = l & 255
    for _ in range(5):
        changed = 0
        for i in range(32):
            lf = np.float32(L[i])
            slx = sumlx - w[i] * x[i] * lf
            sl2 = suml2 - w[i] * lf * lf
            if slx > 0 and sl2 > 0:
                nl = min(nmax, _ni(x[i] * sl2 / slx))
                if nl != L[i]:
                    nf = np.float32(nl)
                    slx = slx + w[i] * x[i] * nf
                    sl2 = sl2 + w[i] * nf * nf
                    if slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = nl & 255
                        sumlx = slx
                        suml2 = sl2
                        changed += 1
        if changed == 0:
            break
    return sumlx / suml2 if suml2 > 0 else F0


@njit(**_J)
def _codes(xv, waux, iscale, scale, points, kmap, nbrs, lv, g, on, ng):
    """Levels (lv[8 ng]) and grid indices (g[ng]) at iscale; off the grid (on[k] = False)
    the best neighbour at scale (ggml's iq2_find_best_neighbour)."""
    for k in range(ng):
        u = 0
        for i in range(8):
            l = _ni(np.float32(0.5) * (iscale * xv[8 * k + i] - F1))
            l = max(0, min(KMAXQ - 1, l))
            lv[8 * k + i] = l
            u |= l << (2 * i)
        gi = kmap[u]
        on[k] = gi >= 0
        if gi < 0:
            row = -gi - 1
            best = np.float32(np.inf)
            gi = nbrs[row, 0]
            for j in range(nbrs.shape[1]):
                c = nbrs[row, j]
                if c < 0:
                    break
                d2 = F0
                for i in range(8):
                    diff = scale * np.float32(points[c, i]) - xv[8 * k + i]
                    d2 = d2 + waux[8 * k + i] * diff * diff
                if d2 < best:
                    best = d2
                    gi = c
            for i in range(8):
                lv[8 * k + i] = (np.int64(points[gi, i]) - 1) // 2
        g[k] = gi


@njit(inline="always", **_J)
def _qsums(w, xv, lv, n):
    sqx = F0
    sq2 = F0
    for i in range(n):
        q = np.float32(2 * lv[i] + 1)
        sqx = sqx + w[i] * xv[i] * q
        sq2 = sq2 + w[i] * q * q
    return sqx, sq2


@njit(**_J)
def _signs(x, w, xv, sg, ng, parity):
    """ggml's sign groups: xv = |x| with one weight of an odd group negated, sg[k] 7 bits
    (parity False, IQ2_S: xv = |x|, sg[k] all 8 sign bits)."""
    for k in range(ng):
        nflip = 0
        s = 0
        for i in range(8):
            v = x[8 * k + i]
            if v >= 0:
                xv[8 * k + i] = v
            else:
                xv[8 * k + i] = -v
                nflip += 1
                s |= 1 << i
        if not parity:
            sg[k] = s
            continue
        if nflip % 2:
            imin = 0
            mn = w[8 * k] * x[8 * k] * x[8 * k]
            for i in range(1, 8):
                ax = w[8 * k + i] * x[8 * k + i] * x[8 * k + i]
                if ax < mn:
                    mn = ax
                    imin = i
            xv[8 * k + imin] = -xv[8 * k + imin]
            s ^= 1 << imin
        sg[k] = s & 127


@njit(**_J)
def _sub_block(x, w, xv, waux, L, lv, g, ga, on, sg, points, kmap, nbrs):
    """One IQ2_XXS sub-block of 32: signs into sg[4], grid indices into g[4]; returns the
    scale (0: skipped; ggml's `continue`, grid and signs left 0)."""
    _signs(x, w, xv, sg, 4, True)
    for i in range(32):
        waux[i] = np.sqrt(w[i])
    mx = xv[0]
    for i in range(1, 32):
        mx = max(mx, xv[i])
    for k in range(4):
        g[k] = 0
    if not (mx >= EPS):
        for k in range(4):
            sg[k] = 0
        return F0
    scale = _make_qp(xv, w, KMAXQ + 1, L)
    eff = scale * np.float32(KMAXQ)
    if not (eff > 0):
        for k in range(4):
            sg[k] = 0
        return F0
    best = F0
    for is_ in range(-6, 7):
        iscale = (np.float32(2 * KMAXQ - 1) + np.float32(is_) * np.float32(0.1)) / eff
        _codes(xv, waux, iscale, F1 / iscale, points, kmap, nbrs, lv, ga, on, 4)
        sqx, sq2 = _qsums(w, xv, lv, 32)
        if sq2 > 0 and sqx * sqx > best * sq2:
            scale = sqx / sq2
            best = scale * sqx
            for k in range(4):
                g[k] = ga[k]
    if scale > 0:
        _codes(xv, waux, F1 / scale, scale, points, kmap, nbrs, lv, ga, on, 4)
        sqx, sq2 = _qsums(w, xv, lv, 32)
        if sq2 > 0:
            scale = sqx / sq2
        for k in range(4):
            g[k] = ga[k]
    if scale < 0:
        scale = -scale
        for k in range(4):
            sg[k] = (~sg[k]) & 127
    return scale


@njit(**_J)
def _sub_block_xs(x, w, xv, waux, lv, la, g, ga, on, ona, sg, points, kmap, nbrs, parity, eps):
    """One IQ2_XS sub-block of 16 (ggml's quantize_row_iq2_xs_impl; IQ2_S's with parity
    False, eps 1e-8): signs into sg[2], grid indices into g[2]; returns the scale (0:
    skipped)."""
    _signs(x, w, xv, sg, 2, parity)
    for i in range(16):
        waux[i] = np.sqrt(w[i])
    mx = xv[0]
    for i in range(1, 16):
        mx = max(mx, xv[i])
    for k in range(2):
        g[k] = 0
        on[k] = True
    for i in range(16):
        lv[i] = 0
    if not (mx >= eps):
        for k in range(2):
            sg[k] = 0
        return F0
    five = np.float32(2 * KMAXQ - 1)
    scale = mx / five
    best = F0
    for is_ in range(-9, 10):
        iscale = (five + np.float32(is_) * np.float32(0.1)) / mx
        _codes(xv, waux, iscale, F1 / iscale, points, kmap, nbrs, la, ga, ona, 2)
        sqx, sq2 = _qsums(w, xv, la, 16)
        if sq2 > 0 and sqx * sqx > best * sq2:
            scale = sqx / sq2
            best = scale * sqx
            for i in range(16):
                lv[i] = la[i]
            for k in range(2):
                g[k] = ga[k]
                on[k] = ona[k]
    if (not on[0] or not on[1]) and scale > 0:
        _codes(xv, waux, F1 / scale, scale, points, kmap, nbrs, la, ga, ona, 2)
        for k in range(2):
            if not on[k]:
                g[k] = ga[k]
                for i in range(8):
                    lv[8 * k + i] = la[8 * k + i]
        sqx, sq2 = _qsums(w, xv, lv, 16)
        if sq2 > 0:
            scale = sqx / sq2
    if scale < 0:
        scale = -scale
        for k in range(2):
            sg[k] = (~sg[k]) & (127 if parity else 255)
    return scale


@njit(**_J)
def _enc_super(kind, row, qrow, o, weighted, points, values, kmap, nbrs, ksigns, f16, dfac,
               w, xv, waux, L, lv, la, ga, on, ona, gs, sgs, a, b, out, p):
    """One super-block row[o:o+256] -> out[p:p+bytes]: IQ2_XXS (kind 0: 8 sub-blocks of 32,
    66 bytes), IQ2_XS (kind 1: 16 of 16, 74 bytes) or IQ2_S (kind 2: 16 of 16, 82 bytes);
    returns 1 if d overflows."""
    ns = 8 if kind == 0 else 16
    sz = 256 // ns
    ng = sz // 8
    nbytes = 66 if kind == 0 else (74 if kind == 1 else 82)
    sumx2 = F0
    for i in range(256):
        sumx2 = sumx2 + row[o + i] * row[o + i]
    if kind == 2:
        sigma2 = np.float32(2) * sumx2 / np.float32(256)
    else:
        sigma2 = sumx2 / np.float32(256)
    for j in range(nbytes):
        out[p + j] = 0
    if not (sigma2 < np.inf):           # squares overflow float32: refused, as the reference
        out[p + 1] = np.uint8(0x7C)
        return 1
    for i in range(256):
        if kind == 2 and not weighted:
            w[i] = np.float32(0.25) * sigma2 + row[o + i] * row[o + i]
        else:
            qv = qrow[o + i] if weighted else F1
            w[i] = qv * np.sqrt(sigma2 + row[o + i] * row[o + i])
    max_scale = F0
    for ib in range(ns):
        xb = row[o + sz * ib:o + sz * ib + sz]
        wb = w[sz * ib:sz * ib + sz]
        if kind == 0:
            sc = _sub_block(xb, wb, xv, waux, L, lv, gs[ib], ga, ona, sgs[ib], points, kmap,
                            nbrs)
        else:
            sc = _sub_block_xs(xb, wb, xv, waux, lv, la, gs[ib], ga, on, ona, sgs[ib], points,
                               kmap, nbrs, kind == 1, EPS if kind == 1 else EPS_S)
        if not (sc > 0):
            for k in range(ng):
                gs[ib, k] = 0
                sgs[ib, k] = 0
        max_scale = max(max_scale, sc)
        # the last step's sums: importance times x and the signed decoder value
        sa = F0
        sb = F0
        for k in range(ng):
            sbits = ksigns[sgs[ib, k]] if kind < 2 else sgs[ib, k]
            for i in range(8):
                v = np.float32(values[gs[ib, k], i])
                if (sbits >> i) & 1:
                    v = -v
                qv = qrow[o + sz * ib + 8 * k + i] if weighted else F1
                sa = sa + qv * row[o + sz * ib + 8 * k + i] * v
                sb = sb + qv * v * v
        a[ib] = sa
        b[ib] = sb
    if max_scale == 0:
        return 0
    best_e = np.float32(np.inf)
    best_h = _f32_to_f16_bits(max_scale / np.float32(31) * dfac[0])
    if (best_h & 0x7FFF) == 0x7C00:
        out[p] = np.uint8(best_h & 255)
        out[p + 1] = np.uint8(best_h >> 8)
        return 1
    for c in range(dfac.shape[0]):
        h = _f32_to_f16_bits(max_scale / np.float32(31) * dfac[c])
        d = f16[h]
        if not (abs(d) < np.inf):
            continue
        tot = F0
        for ib in range(ns):
            e_min = np.float32(np.inf)
            for s in range(16):
                db = d * (np.float32(0.5) + np.float32(s)) * np.float32(0.25)
                e = db * db * b[ib] - np.float32(2) * db * a[ib]
                if e < e_min:
                    e_min = e
            tot = tot + e_min
        if tot < best_e:
            best_e = tot
            best_h = h
    d = f16[best_h]
    out[p] = np.uint8(best_h & 255)
    out[p + 1] = np.uint8(best_h >> 8)
    for ib in range(ns):
        e_min = np.float32(np.inf)
        s_min = 0
        for s in range(16):
            db = d * (np.float32(0.5) + np.float32(s)) * np.float32(0.25)
            e = db * db * b[ib] - np.float32(2) * db * a[ib]
            if e < e_min:
                e_min = e
                s_min = s
        if kind == 0:
            q = p + 2 + 8 * ib
            for k in range(4):
                out[q + k] = np.uint8(gs[ib, k])
            w1 = (np.int64(sgs[ib, 0]) | (np.int64(sgs[ib, 1]) << 7)
                  | (np.int64(sgs[ib, 2]) << 14) | (np.int64(sgs[ib, 3]) << 21)
                  | (np.int64(s_min) << 28))
            for k in range(4):
                out[q + 4 + k] = np.uint8((w1 >> (8 * k)) & 255)
        elif kind == 1:
            for k in range(2):
                v16 = np.int64(gs[ib, k]) | (np.int64(sgs[ib, k]) << 9)
                out[p + 2 + 4 * ib + 2 * k] = np.uint8(v16 & 255)
                out[p + 3 + 4 * ib + 2 * k] = np.uint8(v16 >> 8)
            out[p + 66 + ib // 2] |= np.uint8(s_min << (4 * (ib % 2)))
        else:                            # qs[32] | signs[32] | qh[8] | scales[8]
            for k in range(2):
                i8 = 2 * ib + k
                out[p + 2 + i8] = np.uint8(gs[ib, k] & 255)
                out[p + 34 + i8] = np.uint8(sgs[ib, k])
                out[p + 66 + i8 // 4] |= np.uint8((gs[ib, k] >> 8) << (2 * (i8 % 4)))
            out[p + 74 + ib // 2] |= np.uint8(s_min << (4 * (ib % 2)))
    return 0


@njit(**_P)
def iq2_encode(kind, w, qw, weighted, points, values, kmap, nbrs, ksigns, f16, dfac, blocks,
               flags):
    """IQ2 blocks (kind 0: IQ2_XXS, 1: IQ2_XS) of w (rows, cols % 256 == 0) into blocks;
    with `weighted`, qw (rows or 1, cols) is the importance (finite, >= 0)."""
    rows, cols = w.shape
    nb = cols // 256
    bpb = 66 if kind == 0 else (74 if kind == 1 else 82)
    nch = min(rows, 256)
    for ch in prange(nch):
        ws = np.empty(256, np.float32)
        xv = np.empty(32, np.float32)
        waux = np.empty(32, np.float32)
        L = np.empty(32, np.int64)
        lv = np.empty(32, np.int64)
        la = np.empty(32, np.int64)
        ga = np.empty(4, np.int64)
        on = np.empty(4, np.bool_)
        ona = np.empty(4, np.bool_)
        gs = np.empty((16, 4), np.int64)
        sgs = np.empty((16, 4), np.int64)
        a = np.empty(16, np.float32)
        b = np.empty(16, np.float32)
        for r in range(ch * rows // nch, (ch + 1) * rows // nch):
            row = w[r]
            qrow = qw[r if qw.shape[0] > 1 else 0]
            out = blocks[r]
            f = _row_flag(row)
            if f == 0:
                for bi in range(nb):
                    f |= _enc_super(kind, row, qrow, bi * 256, weighted, points, values, kmap,
                                    nbrs, ksigns, f16, dfac, ws, xv, waux, L, lv, la, ga, on,
                                    ona, gs, sgs, a, b, out, bi * bpb)
            flags[r] = f


KINDS = {"IQ2_XXS": 0, "IQ2_XS": 1, "IQ2_S": 2}


def encode_blocks(w2d: np.ndarray, blocks: np.ndarray, flags: np.ndarray,
                  qw: np.ndarray | None = None, name: str = "IQ2_XXS") -> None:
    """Fill blocks (rows, cols/256*bytes uint8) and flags (rows uint8) from float32 w2d; qw:
    optional importance (rows or 1, cols), finite and >= 0; name: IQ2_XXS or IQ2_XS."""
    from .tables import f16_table
    lat = lattice(name.lower())
    weighted = qw is not None
    q = readonly(np.ascontiguousarray(qw, np.float32).reshape(-1, w2d.shape[1]) if weighted
                 else np.ones((1, 1), np.float32))
    iq2_encode(KINDS[name.upper()], readonly(w2d), q, weighted, lat.points, lat.values,
               lat.kmap, lat.neighbours, KSIGNS, f16_table(),
               readonly(D_FACTORS_S if name.upper() == "IQ2_S" else D_FACTORS), blocks, flags)

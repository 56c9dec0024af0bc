"""numba quantize kernels for Q2_K, Q4_K and Q5_K, bit-identical to the numpy reference
``workbench.schemes.ggml.affine_k`` (the same float32 operations in the same order, no FMA
contraction, every sum in index order).

Plain arrays in, bytes out; imports nothing from ``workbench``. The search parameters
(candidate steps, super-scale divisors, rounds) come from the caller as arrays/ints.

Speed: a super-block is held transposed (weight i of sub-block j at i*ns + j), so every loop
of the search runs across the sub-blocks (8 or 16 lanes) with a per-lane accumulator: the
sums stay in index order per sub-block, as in the reference, and the loops vectorize.

``affine_k_encode`` flags per row: 1 a float16 super-scale overflows (the reference refuses
the tensor), 2 NaN/Inf, 4 a block needs the reference's own decision (the float64
"decodes worse than zeros" test too close to call, or a block max at the 1e-15 all-zero
threshold). Any flag sends the whole tensor to the numpy reference.

The search itself is ``kquant_affine_search``; this module packs its results into blocks and
runs it over a tensor.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .kquant_affine_search import LANES, NDIV, OLM, OLS, SBUF, _group16, _group32
from .kquant_common import _J, _P, _f16_to_f32

#: kind -> (nmax, weights per sub-block, sub-blocks, scale code levels)
KINDS = {"Q2_K": 0, "Q4_K": 1, "Q5_K": 2}


@njit(**_J)
def _put16(dst, p, h):
    dst[p] = np.uint8(h & 255)
    dst[p + 1] = np.uint8((h >> 8) & 255)


@njit(**_J)
def _pack(kind, q, ls, lm, dh, mh, dst):
    if kind == 0:                                   # Q2_K: scales[16] qs[64] d dmin
        for j in range(16):
            dst[j] = np.uint8((np.int64(ls[j]) & 15) | ((np.int64(lm[j]) & 15) << 4))
        for h in range(2):
            for l in range(32):
                v = 0
                for s in range(4):
                    v |= (np.int64(q[h * 128 + s * 32 + l]) & 3) << (2 * s)
                dst[16 + h * 32 + l] = np.uint8(v)
        _put16(dst, 80, dh)
        _put16(dst, 82, mh)
        return
    _put16(dst, 0, dh)                              # Q4_K/Q5_K: d dmin scales[12] (qh) qs
    _put16(dst, 2, mh)
    for j in range(4):
        a = np.int64(ls[j])
        b = np.int64(ls[j + 4])
        c = np.int64(lm[j])
        g = np.int64(lm[j + 4])
        dst[4 + j] = np.uint8((a & 63) | ((b >> 4) << 6))
        dst[8 + j] = np.uint8((c & 63) | ((g >> 4) << 6))
        dst[12 + j] = np.uint8((b & 15) | ((g & 15) << 4))
    p = 16
    if kind == 2:
        for l in range(32):
            v = 0
            for b in range(8):
                v |= ((np.int64(q[b * 32 + l]) >> 4) & 1) << b
            dst[16 + l] = np.uint8(v)
        p = 48
    for c in range(4):
        for l in range(32):
            lo_ = np.int64(q[c * 64 + l]) & 15
            hi_ = np.int64(q[c * 64 + 32 + l]) & 15
            dst[p + c * 32 + l] = np.uint8(lo_ | (hi_ << 4))


@njit(**_J)
def _worse_than_zero(x, q, ls, lm, dh, mh, n, ns):
    """The reference's zero_when_worse test in float64: 1 worse, 0 not, -1 too close to call."""
    d = _f16_to_f32(dh)
    dm = _f16_to_f32(mh)
    err = 0.0
    sig = 0.0
    for j in range(ns):
        dl = d * ls[j]
        ml = dm * lm[j]
        for i in range(n):
            k = j * n + i
            y = dl * q[k] - ml
            t = np.float64(y) - np.float64(x[k])
            err += t * t
            sig += np.float64(x[k]) * np.float64(x[k])
    if err == sig:
        return 0
    if abs(err - sig) <= 1e-9 * (err + sig):
        return -1
    return 1 if err > sig else 0


@njit(**_J)
def _finish(kind, x, codes, S, g, ns, n, gi, dst, bpb):
    """Pack group g's block into dst (or zeros when it decodes worse than zeros); returns
    the block's flag."""
    f = gi[g]
    if f:
        return f
    q = codes[g * 256:(g + 1) * 256]
    ls = S[OLS + g * ns:OLS + g * ns + ns]
    lm = S[OLM + g * ns:OLM + g * ns + ns]
    z = _worse_than_zero(x, q, ls, lm, gi[2 + g], gi[4 + g], n, ns)
    if z < 0:
        return 4
    if z == 1:
        for k in range(bpb):
            dst[k] = np.uint8(0)
    else:
        _pack(kind, q, ls, lm, gi[2 + g], gi[4 + g], dst)
    return 0


def affine_k_encode(w, qw, weighted, kind, cands, divs, iters, rounds, blocks, flags):
    """Q2_K (kind 0), Q4_K (1), Q5_K (2) blocks of w (rows, cols % 256 == 0).

    qw: importance (rows or 1, cols) when `weighted` (row r of w uses qw's row r, or row 0),
    finite and >= 0. blocks: uint8 (rows, cols/256 * bytes per block). flags: uint8 (rows,),
    see the module docstring.

    Two kernels: Q2_K's (one super-block of 16 sub-blocks at a time) and Q4_K/Q5_K's (two
    super-blocks of 8 at a time). Each holds one specialization of the search, so each
    compiles about half of what one kernel for both did, and the warm-up can compile them in
    two processes at once (docs/kernels.md)."""
    flags[:] = 0
    if kind == 0:
        q2k_encode(w, qw, weighted, cands, divs, iters, rounds, blocks, flags)
    else:
        q45k_encode(w, qw, weighted, kind, cands, divs, iters, rounds, blocks, flags)


@njit(**_J)
def _chunk(w, ch, nch, flags):
    """Chunk ch of nch: its rows r0..r1-1 (flags[r] = 2 for each holding a NaN/Inf: such a row
    is not searched) and a scratch set for the search (S, gi, gf, codes, QMH)."""
    rows, cols = w.shape
    r0 = ch * rows // nch
    r1 = (ch + 1) * rows // nch
    for r in range(r0, r1):
        row = w[r]
        for c in range(cols):
            v = row[c]
            if not (v == v and abs(v) < np.inf):
                flags[r] = 2
                break
    return (r0, r1, np.zeros(SBUF, np.float32), np.zeros(16, np.int64),
            np.zeros(20, np.float32), np.zeros(512, np.float32), np.zeros(2 * NDIV, np.int64))


@njit(**_P)
def q2k_encode(w, qw, weighted, cands, divs, iters, rounds, blocks, flags):
    """Q2_K blocks of w (see affine_k_encode; flags zeroed by the caller): its super-blocks
    one at a time."""
    rows, cols = w.shape
    nbk = cols // 256
    nch = min(rows, 256)
    nl = min(cols >> 4, LANES)          # LANES wherever a block is searched (see _screen_sums)
    for ch in prange(nch):
        r0, r1, S, gi, gf, codes, QMH = _chunk(w, ch, nch, flags)
        for r in range(r0, r1):
            if flags[r] & 2:
                continue
            for b in range(nbk):
                xa = w[r, b * 256:(b + 1) * 256]
                qa = qw[r if qw.shape[0] > 1 else 0, b * 256:(b + 1) * 256] if weighted else xa
                _group16(S, xa, qa, weighted, cands, divs, iters, rounds, gi, gf, codes, QMH,
                         nl)
                flags[r] |= _finish(0, xa, codes, S, 0, 16, 16, gi,
                                    blocks[r, b * 84:(b + 1) * 84], 84)


@njit(**_P)
def q45k_encode(w, qw, weighted, kind, cands, divs, iters, rounds, blocks, flags):
    """Q4_K (kind 1) and Q5_K (2) blocks of w (see affine_k_encode; flags zeroed by the
    caller): super-blocks two at a time, in order across rows (a lone last one pairs with
    zeros)."""
    rows, cols = w.shape
    nbk = cols // 256
    if kind == 1:
        nmax, bpb = 15, 144
    else:
        nmax, bpb = 31, 176
    n, ns = 32, 8
    nch = min(rows, 256)
    nl = min(cols >> 4, LANES)          # LANES wherever a block is searched (see _screen_sums)
    for ch in prange(nch):
        r0, r1, S, gi, gf, codes, QMH = _chunk(w, ch, nch, flags)
        zero = np.zeros(256, np.float32)
        t = r0 * nbk
        t_end = r1 * nbk
        while t < t_end:
            ra = t // nbk
            if flags[ra] & 2:
                t = (ra + 1) * nbk
                continue
            ba = t % nbk
            xa = w[ra, ba * 256:(ba + 1) * 256]
            qa = qw[ra if qw.shape[0] > 1 else 0, ba * 256:(ba + 1) * 256] if weighted else xa
            xb, qb, rb, bb = zero, zero, -1, 0
            u = t + 1
            while u < t_end and (flags[u // nbk] & 2):
                u = (u // nbk + 1) * nbk
            if u < t_end:
                rb = u // nbk
                bb = u % nbk
                xb = w[rb, bb * 256:(bb + 1) * 256]
                if weighted:
                    qb = qw[rb if qw.shape[0] > 1 else 0, bb * 256:(bb + 1) * 256]
                t = u + 1
            else:
                t = t_end
            _group32(S, xa, xb, qa, qb, weighted, nmax, cands, divs, iters, rounds, gi, gf,
                     codes, QMH, nl)
            flags[ra] |= _finish(kind, xa, codes, S, 0, ns, n, gi,
                                 blocks[ra, ba * bpb:(ba + 1) * bpb], bpb)
            if rb >= 0:
                flags[rb] |= _finish(kind, xb, codes, S, 1, ns, n, gi,
                                     blocks[rb, bb * bpb:(bb + 1) * bpb], bpb)

"""numba CPU helpers of the symmetric divisor search (``cpu_affine_quant._sym_qp``) for a whole
row of small blocks at once, SIMD lanes across the blocks instead of along one block.

``_sym_qp`` searches one block: five candidate scales, a float32 screen of the five squared
errors summed side by side along the block, then a decision. For blocks of 32 or 64 weights
its vector loop runs one or two iterations and the rest is per-block work: the scales and
their float16 rounding one at a time, five horizontal sums, a branchy decision. ``_sym_row``
does the same search for every block of a row in loops over the blocks, each of which LLVM
vectorizes: the candidate scales (float16 rounding in integer arithmetic, no table lookup),
the row transposed once (weight k of every block side by side), the screen as vertical sums
(block b's error in lane b, summed over k in order), the first least error and the near-tie
test. A block whose screen is not clear (a near tie) is decided by the reference's own sums
(``_exact_best``), as in ``_sym_qp``; a row where a candidate scale saturates float16 or has an
overflowing inverse is searched block by block by ``_sym_qp`` itself. Same results, bit for
bit (tests/kernels/test_sym_rows.py). The one-pass error of a 4096 x 4096 matrix, 2 threads,
2.2-2.7x as fast at int4-g32 and 1.3x at int4-g64 (docs/kernels.md); for blocks of 128 and
more the block-wise search is as fast or faster, and stays. Compile cost: the packed-code
family's warm-up task about 6 CPU s more (17 -> 24 CPU s).

Imports nothing from ``workbench``."""

from __future__ import annotations

import numpy as np
from numba import njit

from .cpu_affine_quant import _exact_best, _sqd
from .cpu_common import F0, _J, _key_f32

#: _sym_row takes rows of blocks of at most ROW_GS weights, at least ROW_BLOCKS of them
ROW_GS = 64
ROW_BLOCKS = 16


@njit(**_J)
def _candidates(am, divs, f16, sc):
    """sc[i] = the stored scale amax / divs[i] of each block (amax: am), sc[nc + i] its
    inverse (0 for a zero scale), sc[2 nc + i] its float16 bits (0 for float32 scales).
    float16 storage rounds to nearest even as _fp8_code(s, 10, 15, 0x7BFF) does, in integer
    arithmetic, and the value is rebuilt from the bits (no table lookup: the loop
    vectorizes). Returns False when a block needs _sym_qp's own handling: a float16 scale
    above 65504 or an inverse that overflows."""
    nc = divs.shape[0]
    bpr = am.shape[0]
    for i in range(nc):
        d = divs[i]
        si = sc[i]
        vi = sc[nc + i]
        bi = sc[2 * nc + i]
        for b in range(bpr):
            s = am[b] / d
            if f16:
                u = np.float32(s).view(np.int32)
                # normal: 23 -> 10 mantissa bits, ties to even; subnormal: units of 2**-24
                cn = ((u + np.int32(4095) + ((u >> np.int32(13)) & np.int32(1)))
                      >> np.int32(13)) - np.int32(112 << 10)
                cs = np.int32(np.rint(s * np.float32(2.0 ** 24)))
                code = cn if u >= np.int32(113 << 23) else cs
                code = code if code < np.int32(0x7BFF) else np.int32(0x7BFF)
                bi[b] = np.float32(code)
                hn = np.int32((((code >> np.int32(10)) + np.int32(112)) << np.int32(23))
                              | ((code & np.int32(0x3FF)) << np.int32(13))).view(np.float32)
                hs = np.float32(code) * np.float32(2.0 ** -24)
                s = hn if code >= np.int32(0x400) else hs
            else:
                bi[b] = F0
            si[b] = s
            vi[b] = F0 if s == F0 else np.float32(1.0) / s
    ok = True
    for b in range(bpr):
        if f16 and am[b] / divs[0] > np.float32(65504.0):   # the largest candidate
            ok = False
    for i in range(nc):
        vi = sc[nc + i]
        for b in range(bpr):
            if np.isinf(vi[b]):
                ok = False
    return ok


@njit(**_J)
def _screen(row, tt, sc, nc, fqmin, fq, e):
    """tt[k] = weight k of every block of the row (tt: (gs, blocks)), then e[i, b] = block b's
    squared error under candidate i in float32, summed over the block's weights in order:
    within (gs + 2) * 2**-24 of the exact sum, relatively, plus gs * 2**-125 (_sq_screen's
    bound)."""
    gs, bpr = tt.shape
    for b in range(bpr):
        o = b * gs
        for k in range(gs):
            tt[k, b] = row[o + k]
    for i in range(nc):
        ei = e[i]
        s = sc[i]
        iv = sc[nc + i]
        for b in range(bpr):
            ei[b] = F0
        for k in range(gs):
            t = tt[k]
            for b in range(bpr):
                ei[b] += _sqd(t[b], iv[b], s[b], fqmin, fq)


@njit(**_J)
def _decide(e, sc, nc, eb, sb, tol, slack, ib, flag):
    """ib[b] = the first candidate of least screened error of block b (eb[b] that error, sb[b]
    its scale), and flag[b] = 1 when another candidate of another stored scale is not clear
    of it by more than both their bounds (_sym_qp's test), else 0. Selects, no branch: each
    loop vectorizes."""
    bpr = e.shape[1]
    for b in range(bpr):
        eb[b] = e[0, b]
        sb[b] = sc[0, b]
        ib[b] = 0
        flag[b] = 0
    for i in range(1, nc):
        ei = e[i]
        si = sc[i]
        for b in range(bpr):
            c = ei[b] < eb[b]
            eb[b] = ei[b] if c else eb[b]
            sb[b] = si[b] if c else sb[b]
            ib[b] = i if c else ib[b]
    for i in range(nc):
        ei = e[i]
        si = sc[i]
        for b in range(bpr):
            x = np.float64(ei[b])
            z = np.float64(eb[b])
            near = np.int64(not (x - z > tol * (x + z) + slack))
            flag[b] |= near & np.int64(si[b] != sb[b])


@njit(**_J)
def _sym_row(row, tlo, thi, gs, divs, fqmin, fq, f16, rf, tt, ib, c32, lanes, k0, scale32,
             scale16, tq):
    """_sym_qp for every block of one row (tlo/thi: the blocks' min and max keys; blocks of gs
    weights, tt.shape[1] of them), written as _row_qparams writes a block's: its stored scale
    at k0 + b of scale16 (float16 bits) or scale32, tq[2 b] its inverse, tq[2 b + 1] zero.
    Returns False, having written nothing, when a candidate scale saturates float16 or has an
    overflowing inverse: the caller then searches the row block by block with _sym_qp, which
    decides those (not compiled in here a second time). Scratch: rf (4 nc + 3, blocks) and tt
    (gs, blocks) float32, ib (2, blocks) int64; c32 and lanes as _sym_qp's."""
    nc = divs.shape[0]
    bpr = tt.shape[1]
    sc = rf[:3 * nc + 1]              # candidates' scales, inverses, float16 bits; amax
    e = rf[3 * nc + 1:4 * nc + 1]     # their screened errors
    eb = rf[4 * nc + 1:4 * nc + 3]    # the least error and its scale
    am = sc[3 * nc]
    for b in range(bpr):
        lo = abs(_key_f32(tlo[b]))
        hi = abs(_key_f32(thi[b]))
        am[b] = lo if lo > hi else hi
    if not _candidates(am, divs, f16, sc):
        return False
    _screen(row, tt, sc, nc, fqmin, fq, e)
    _decide(e, sc, nc, eb[0], eb[1], (gs + 2) * 2.0 ** -24 + gs * 2.0 ** -52, gs * 2.0 ** -125,
            ib[0], ib[1])
    for b in range(bpr):
        best = ib[0, b]
        if ib[1, b]:
            for i in range(nc):
                c32[i] = sc[i, b]
                c32[nc + i] = sc[nc + i, b]
            best = _exact_best(row[b * gs:(b + 1) * gs], c32, nc, fqmin, fq, lanes)
        if f16:
            scale16[k0 + b] = np.uint16(np.int64(sc[2 * nc + best, b]))
        else:
            scale32[k0 + b] = sc[best, b]
        tq[2 * b] = sc[nc + best, b]
        tq[2 * b + 1] = F0
    return True

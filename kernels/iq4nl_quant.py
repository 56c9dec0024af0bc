"""numba quantize kernel for IQ4_NL (32-weight blocks, 4-bit indices into a fixed non-linear
codebook), bit-identical to ``workbench.schemes.ggml.iq4_nl`` + ``search.codebook_search``
(float32 operation for operation, sums in index order as the reference's ``_seqsum``, no FMA
contraction).

Per block: normalize by a power of two (max |x| in [0.5, 1), exact but for a rounding into
float32 subnormals that both sides do alike: one float64 product, one rounding), try 16
candidate scales (127/mx and (t - 127)/mx, t = -7..7; mx the first weight of largest |x|),
round each weight to the nearest codebook value (ties to the larger), fit the least-squares
scale with weights x^2 and keep the candidate with the largest explained energy (first wins
ties); store float16(d * 2^e), then the indices of x / (float16 d * 2^-e).

The 16 candidates of 4 blocks run side by side (64 vector lanes, one per block and
candidate), so each candidate's two sums are still sequential over its block's 32 weights,
exactly as the reference adds them; the nearest-value search is 15 selects on constants.

``iq4nl_encode`` flags per row: 1 a float16 scale overflows, 2 NaN/Inf in the row, 4 a block
whose reciprocal scale is not finite (the reference decides). Any flag sends the tensor to the
numpy reference (or refuses it, for NaN/Inf). Imports nothing from ``workbench``.
"""

from __future__ import annotations

from . import _numba_prelude  # noqa: F401  (before numba: cheaper start)
import math

import numpy as np
from numba import njit, prange

from . import tables
from .host import readonly
from .cpu_common import _f32_to_f16_bits, _row_flag

_J = dict(cache=True, nogil=True)
_P = dict(cache=True, nogil=True, parallel=True)

F32 = np.float32
#: ggml ``kvalues_iq4nl`` (a format fact), and the midpoints between neighbours
KVALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                   dtype=np.float32)
MIDS = ((KVALUES[1:].astype(np.float64) + KVALUES[:-1]) / 2).astype(np.float32)
# the codebook and midpoints as scalar globals: numba compiles them in as constants
(_K0, _K1, _K2, _K3, _K4, _K5, _K6, _K7, _K8, _K9, _K10, _K11, _K12, _K13, _K14,
 _K15) = (np.float32(v) for v in KVALUES)
(_M0, _M1, _M2, _M3, _M4, _M5, _M6, _M7, _M8, _M9, _M10, _M11, _M12, _M13,
 _M14) = (np.float32(v) for v in MIDS)
NTRY = 7
#: numerators of the candidate inverse scales: 127, then t - 127 for t = -7..7
CAND_NUM = np.array([127.0] + [t - 127.0 for t in range(-NTRY, NTRY + 1)], np.float32)
GROUP_EPS = np.float32(1e-15)


@njit(inline="always", **_J)
def _nearest_value(y):
    """The codebook value nearest y (ties to the larger), written out as 15 selects on
    constants: a loop here would stay a loop and keep its caller from vectorizing."""
    q = _K0
    q = _K1 if y >= _M0 else q
    q = _K2 if y >= _M1 else q
    q = _K3 if y >= _M2 else q
    q = _K4 if y >= _M3 else q
    q = _K5 if y >= _M4 else q
    q = _K6 if y >= _M5 else q
    q = _K7 if y >= _M6 else q
    q = _K8 if y >= _M7 else q
    q = _K9 if y >= _M8 else q
    q = _K10 if y >= _M9 else q
    q = _K11 if y >= _M10 else q
    q = _K12 if y >= _M11 else q
    q = _K13 if y >= _M12 else q
    q = _K14 if y >= _M13 else q
    q = _K15 if y >= _M14 else q
    return q


@njit(inline="always", **_J)
def _nearest(y, mids):
    """Index of the codebook value nearest y (ties to the larger): how many midpoints <= y."""
    k = 0
    for m in range(mids.shape[0]):
        k += 1 if y >= mids[m] else 0
    return k


GROUP = 4                                    # blocks searched together: 4 x 16 = 64 lanes


@njit(inline="always", **_J)
def _normalize(x, xn, o):
    """pow2_normalize of one block: xn[o:o+32] = x * 2^-e (one float64 product, one rounding,
    as ldexp), e from frexp(max |x|); blocks below GROUP_EPS become zeros with e = 0."""
    amax = F32(0.0)
    for j in range(32):
        a = abs(x[j])
        amax = a if a > amax else amax
    if amax < GROUP_EPS:
        for j in range(32):
            xn[o + j] = F32(0.0)
        return 0
    e = math.frexp(np.float64(amax))[1]
    sc = 2.0 ** (-e)
    for j in range(32):
        xn[o + j] = F32(np.float64(x[j]) * sc)
    return e


@njit(**_J)
def _enc_group(row, qrow, weighted, b0, nb, kv, mids, num, f16, xn, xr, wr, iscale, sqx, sq2, es,
               mxs, zeros, out):
    """Blocks b0 .. b0+GROUP-1 of a row (those < nb) -> out; returns the OR of their flags.
    Lane l = g*nc + c: block b0+g, candidate c. Missing blocks of the last group are zeros.
    Search weights: xn^2, or with `weighted` qrow_j * sqrt(sigma2 + xn_j^2), sigma2 =
    2 * sum(xn^2) / 32 (the reference's IQ4_NL.encode(x, qw))."""
    nc = num.shape[0]
    lanes = GROUP * nc
    for g in range(GROUP):
        b = b0 + g
        es[g] = 0
        if b < nb:
            es[g] = _normalize(row[b * 32:b * 32 + 32], xn, g * 32)
        else:
            for j in range(32):
                xn[g * 32 + j] = F32(0.0)
    for g in range(GROUP):
        # codebook_search: mx = the first value of largest |xn|
        i = 0
        best = abs(xn[g * 32])
        for j in range(1, 32):
            a = abs(xn[g * 32 + j])
            if a > best:
                best = a
                i = j
        mx = xn[g * 32 + i]
        zeros[g] = abs(mx) < GROUP_EPS
        if zeros[g]:
            mx = F32(1.0)
        mxs[g] = mx
        for c in range(nc):
            iscale[g * nc + c] = num[c] / mx
    for g in range(GROUP):
        sigma2 = F32(0.0)
        if weighted:
            acc = xn[g * 32] * xn[g * 32]
            for j in range(1, 32):
                acc = acc + xn[g * 32 + j] * xn[g * 32 + j]
            sigma2 = F32(2.0) * acc / F32(32.0)
        for j in range(32):                      # weights and search weights laid out per lane
            v = xn[g * 32 + j]
            if not weighted:
                wv = v * v
            elif b0 + g < nb:
                wv = qrow[(b0 + g) * 32 + j] * np.sqrt(sigma2 + v * v)
            else:
                wv = F32(0.0)
            for c in range(nc):
                xr[j * lanes + g * nc + c] = v
                wr[j * lanes + g * nc + c] = wv
    for l in range(lanes):
        sqx[l] = F32(-0.0)                       # -0 + t == t: the sum starts with its first term
        sq2[l] = F32(-0.0)
    # each lane's sums in index order (the reference's _seqsum); every inner loop runs over
    # the lanes, none over the 32 weights
    for j in range(32):
        base = j * lanes
        for l in range(lanes):
            v = xr[base + l]
            y = iscale[l] * v
            q = _nearest_value(y)
            wq = wr[base + l] * q
            sqx[l] = sqx[l] + wq * v
            sq2[l] = sq2[l] + wq * q
    f = 0
    for g in range(GROUP):
        b = b0 + g
        if b >= nb:
            break
        best_d = F32(0.0)
        best_score = F32(-np.inf)
        found = False
        for c in range(nc):
            l = g * nc + c
            if sq2[l] > 0:
                d = sqx[l] / sq2[l]
                score = d * sqx[l]
                if score > best_score:
                    best_score = score
                    best_d = d
                    found = True
        if not found or not (abs(best_score) < np.inf):
            best_d = mxs[g] / -kv[0]
        if zeros[g]:
            best_d = F32(0.0)
        e = es[g]
        # float16 of the denormalized scale, then the effective (renormalized) scale
        h = _f32_to_f16_bits(F32(np.float64(best_d) * 2.0 ** e))
        p = b * 18
        out[p] = np.uint8(h & 255)
        out[p + 1] = np.uint8(h >> 8)
        if (h & 0x7FFF) == 0x7C00:
            f |= 1
            continue
        d_eff = F32(np.float64(f16[h]) * 2.0 ** (-e))
        inv = F32(0.0)
        if d_eff != 0:
            inv = F32(1.0) / d_eff
            if not (abs(inv) < np.inf):
                f |= 4
                continue
        for j in range(16):
            lo = _nearest(xn[g * 32 + j] * inv, mids)
            hi = _nearest(xn[g * 32 + j + 16] * inv, mids)
            out[p + 2 + j] = np.uint8(lo | (hi << 4))
    return f


@njit(**_P)
def iq4nl_encode(w, qw, weighted, kv, mids, num, f16, blocks, flags):
    """IQ4_NL blocks of w (rows, cols % 32 == 0) into blocks (rows, cols/32*18); with
    `weighted`, qw (rows or 1, cols) is the importance (finite, >= 0)."""
    rows, cols = w.shape
    nb = cols // 32
    lanes = GROUP * num.shape[0]
    nch = min(rows, 256)                     # chunks of rows: one scratch set each
    for ch in prange(nch):
        xn = np.empty(GROUP * 32, np.float32)
        xr = np.empty(32 * lanes, np.float32)
        wr = np.empty(32 * lanes, np.float32)
        iscale = np.empty(lanes, np.float32)
        sqx = np.empty(lanes, np.float32)
        sq2 = np.empty(lanes, np.float32)
        es = np.empty(GROUP, np.int64)
        mxs = np.empty(GROUP, np.float32)
        zeros = np.empty(GROUP, np.bool_)
        for r in range(ch * rows // nch, (ch + 1) * rows // nch):
            row = w[r]
            qrow = qw[r if qw.shape[0] > 1 else 0]
            out = blocks[r]
            f = _row_flag(row)
            if f == 0:
                for b0 in range(0, nb, GROUP):
                    f |= _enc_group(row, qrow, weighted, b0, nb, kv, mids, num, f16, xn, xr,
                                    wr, iscale, sqx, sq2, es, mxs, zeros, out)
            flags[r] = f


def encode_blocks(w2d: np.ndarray, blocks: np.ndarray, flags: np.ndarray,
                  qw: np.ndarray | None = None) -> None:
    """Fill blocks (rows, cols/32*18 uint8) and flags (rows uint8) from float32 w2d; qw:
    optional importance (rows or 1, cols), finite and >= 0."""
    weighted = qw is not None
    q = readonly(np.ascontiguousarray(qw, np.float32).reshape(-1, w2d.shape[1]) if weighted
                 else np.ones((1, 1), np.float32))
    iq4nl_encode(readonly(w2d), q, weighted, KVALUES, MIDS, CAND_NUM, tables.f16_table(), blocks, flags)

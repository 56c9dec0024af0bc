"""numba quantize kernels of the GGML types whose llama.cpp quantizer is a fixed rounding rule
(no search, no importance): MXFP4 (``quantize_row_mxfp4_ref``), TQ1_0 and TQ2_0
(``quantize_row_tq{1,2}_0_ref``), NVFP4 (``quantize_row_nvfp4_ref``), bit-identical to the numpy
references in ``workbench/schemes/ggml`` and so to llama.cpp's bytes (float32 operation for
operation, no FMA contraction).

``rtn_encode`` flags per row: 1 a float16 scale overflows (NVFP4: a UE4M3 scale above 448), 2 NaN/Inf in the row (the
reference decides: it refuses). Parallel over rows. Imports nothing from ``workbench``.
"""

from __future__ import annotations

from . import _numba_prelude  # noqa: F401  (before numba: cheaper start)
import math

import numpy as np
from numba import njit, prange

from .cpu_common import _f32_to_f16_bits, _row_flag
from .host import readonly

_J = dict(cache=True, nogil=True)
_P = dict(cache=True, nogil=True, parallel=True)

F32 = np.float32
#: ggml ``kvalues_mxfp4`` (E2M1 doubled, a format fact)
FP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)
#: ggml_e8m0_to_fp32_half of every byte: 2^(e - 128)
E8M0_HALF = np.ldexp(np.float32(1), np.arange(256, dtype=np.int32) - 128).astype(np.float32)
#: this module's own branch numbers of the types it encodes (by GGML name: cpu_ops passes it)
KINDS = {"MXFP4": 0, "TQ1_0": 1, "TQ2_0": 2, "NVFP4": 40}


@njit(inline="always", **_J)
def _best_fp4(x, d, kv):
    """best_index_mxfp4: the first index of least |kv[i]*d - x| (float32)."""
    bi = 0
    be = abs(kv[0] * d - x)
    for i in range(1, 16):
        er = abs(kv[i] * d - x)
        if er < be:
            be = er
            bi = i
    return bi


@njit(**_J)
def _mxfp4_row(row, nb, kv, e8, out):
    for b in range(nb):
        o = b * 32
        amax = F32(0.0)
        for j in range(32):
            a = abs(row[o + j])
            if amax < a:
                amax = a
        e = 0
        if amax > 0:
            fl = math.floor(F32(math.log2(np.float64(amax))))
            e = (np.int64(fl) + 125) & 255
        d = e8[e]
        p = b * 17
        out[p] = np.uint8(e)
        for j in range(16):
            i0 = _best_fp4(row[o + j], d, kv)
            i1 = _best_fp4(row[o + 16 + j], d, kv)
            out[p + 1 + j] = np.uint8(i0 | (i1 << 4))
    return 0


@njit(inline="always", **_J)
def _fp32_to_ue4m3(x):
    """ggml_fp32_to_ue4m3 of a float32 x (its bit fields from frexp, exact)."""
    if not (x > 0):
        return 0
    if x > F32(448.0):
        x = F32(448.0)
    m, e2 = math.frexp(np.float64(x))         # x = m * 2^e2, m in [0.5, 1)
    ue = e2 - 1 + 7
    if ue <= 0:
        man = np.int64(F32(x * F32(512.0)) + F32(0.5))
        if man > 7:
            man = 7
        return 0 if man < 1 else man
    if ue >= 15:
        return 0x7E
    f16 = np.int64(math.floor((2.0 * m - 1.0) * 16.0))   # top 4 mantissa bits
    man = (f16 >> 1) + (f16 & 1)
    if man > 7:
        man = 0
        ue += 1
        if ue >= 15:
            return 0x7E
    return (ue << 3) | man


@njit(inline="always", **_J)
def _fp4_mid(x, m0, m1, m2, m3, m4, m5, m6):
    """_best_fp4 without the search: the index of |x| among 0 1 2 3 4 6 8 12 (times d) is the
    count of midpoints m_k = h[k]*d strictly below |x| (every product exact: 3 significant
    bits times UE4M3's 4; wherever two neighbours compete, both float32 errors |v*d - |x||
    are exact by Sterbenz, so the first-least rule is the exact nearest with ties to the
    lower index); x < 0 takes 8 + that index (|-v*d - x| = |v*d - |x||). d == 0 (all errors
    equal, index 0) is the caller's: every m_k is then 0 and it masks the codes."""
    a = abs(x)
    i = ((a > m0) + (a > m1) + (a > m2) + (a > m3) + (a > m4) + (a > m5) + (a > m6))
    return i + 8 * ((x < 0) & (i > 0))


#: the midpoints of neighbouring kvalues_fp4 magnitudes
FP4_MIDS = np.array([0.5, 1.5, 2.5, 3.5, 5, 7, 10], np.float32)


@njit(**_J)
def _nvfp4_row(row, nb, h, ue4h, out):
    for b in range(nb * 4):
        o = b * 16
        amax = F32(0.0)
        for j in range(16):
            a = abs(row[o + j])
            if amax < a:
                amax = a
        if F32(amax / F32(6.0)) > F32(448.0):
            return 1                   # the reference refuses (ggml would clip)
        ue = _fp32_to_ue4m3(F32(amax / F32(6.0)))
        d = ue4h[ue]
        keep = 0 if d == 0 else 255
        m0, m1, m2, m3 = h[0] * d, h[1] * d, h[2] * d, h[3] * d
        m4, m5, m6 = h[4] * d, h[5] * d, h[6] * d
        p = (b // 4) * 36
        s = b % 4
        out[p + s] = np.uint8(ue)
        for j in range(8):
            i0 = _fp4_mid(row[o + j], m0, m1, m2, m3, m4, m5, m6)
            i1 = _fp4_mid(row[o + 8 + j], m0, m1, m2, m3, m4, m5, m6)
            out[p + 4 + 8 * s + j] = np.uint8((i0 | (i1 << 4)) & keep)
    return 0


@njit(inline="always", **_J)
def _trit(x, inv):
    """lroundf(x * inv) + 1 (half away from zero), as 0..2."""
    v = x * inv
    a = abs(v)
    fl = np.floor(a)
    q = np.int64(fl) + (1 if a - fl >= F32(0.5) else 0)
    q = -q if v < 0 else q
    return min(max(q + 1, 0), 2)


@njit(inline="always", **_J)
def _tq_scale(row, o, out, p, f16):
    """max |w| of the block at row[o:o+256], its float16 stored at out[p:p+2], and the float32
    reciprocal (0 when it is 0 or overflows); flag 1 when the float16 overflows."""
    amax = F32(0.0)
    for j in range(256):
        a = abs(row[o + j])
        amax = a if a > amax else amax
    h = _f32_to_f16_bits(amax)
    out[p] = np.uint8(h & 255)
    out[p + 1] = np.uint8(h >> 8)
    inv = F32(0.0)
    if amax != 0:
        inv = F32(1.0) / amax
        if not (abs(inv) < np.inf):
            inv = F32(0.0)
    return inv, (1 if (h & 0x7FFF) == 0x7C00 else 0)


@njit(**_J)
def _tq2_0_row(row, nb, f16, out):
    f = 0
    for b in range(nb):
        o = b * 256
        p = b * 66
        inv, fl = _tq_scale(row, o, out, p + 64, f16)
        f |= fl
        for h in range(2):
            for m in range(32):
                q = 0
                for k in range(4):
                    q |= _trit(row[o + 128 * h + m + 32 * k], inv) << (2 * k)
                out[p + 32 * h + m] = np.uint8(q)
    return f


@njit(inline="always", **_J)
def _pack_trits(row, o, stride, n, inv):
    """ceil((sum_k t_k 3^(4-k)) * 256 / 243) of the n trits row[o + stride*k] (n < 5: the
    missing low trits are 0)."""
    q = 0
    for k in range(5):
        q = q * 3 + (_trit(row[o + stride * k], inv) if k < n else 0)
    return np.uint8((q * 256 + 242) // 243)


@njit(**_J)
def _tq1_0_row(row, nb, f16, out):
    f = 0
    for b in range(nb):
        o = b * 256
        p = b * 54
        inv, fl = _tq_scale(row, o, out, p + 52, f16)
        f |= fl
        for m in range(32):
            out[p + m] = _pack_trits(row, o + m, 32, 5, inv)
        for m in range(16):
            out[p + 32 + m] = _pack_trits(row, o + 160 + m, 16, 5, inv)
        for j in range(4):
            out[p + 48 + j] = _pack_trits(row, o + 240 + j, 4, 4, inv)
    return f


@njit(**_P)
def rtn_encode(w, kind, kv, e8, f16, ue4h, mids, blocks, flags):
    """Blocks of w (rows, cols) for type `kind` (KINDS) into blocks (rows, bytes per row)."""
    rows, cols = w.shape
    for r in prange(rows):
        row = w[r]
        f = _row_flag(row)
        if f == 0:
            if kind == 0:
                f = _mxfp4_row(row, cols // 32, kv, e8, blocks[r])
            elif kind == 40:
                f = _nvfp4_row(row, cols // 64, mids, ue4h, blocks[r])
            elif kind == 1:
                f = _tq1_0_row(row, cols // 256, f16, blocks[r])
            else:
                f = _tq2_0_row(row, cols // 256, f16, blocks[r])
        flags[r] = f


def encode_blocks(name: str, w2d: np.ndarray, blocks: np.ndarray, flags: np.ndarray) -> None:
    """Fill blocks (rows, bytes per row) and flags (rows,) from float32 w2d for GGML type
    `name` (a KINDS key)."""
    from .tables import f16_table, ue4m3_half_table
    rtn_encode(readonly(w2d), KINDS[name], FP4_VALUES, E8M0_HALF, f16_table(),
               ue4m3_half_table(), FP4_MIDS, blocks, flags)

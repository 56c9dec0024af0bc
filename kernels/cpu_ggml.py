"""numba CPU kernels of the GGML block formats: one block decoder per format (dequantize,
fused error) and the Q4_0 / Q8_0 encoders. Imports nothing from ``workbench``."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from . import tables
from .cpu_common import (F0, NO_ACC, NO_OUT, NO_W, _J, _P, _acc_row, _encode_row, _h, _key_f32,
                         _put_f16, _u32)
from .iq1_decode import iq1_m_row, iq1_s_row
from .iq23_decode import iq2_s_row, iq2_xs_row, iq2_xxs_row, iq3_s_row, iq3_xxs_row

# ---------------------------------------------------------------- GGML block decoders
# Common signature: (src row bytes, f16 table, IQ4_NL levels, dst row); each decodes every
# block of the row (p: byte offset, o: element offset of block b). Layouts: ggml-common.h.

@njit(inline="always", **_J)
def _u8f(x):
    """float32 of a uint8 code computed in uint8. numba widens integer arithmetic to int64,
    and LLVM then keeps the vector loop in 64-bit lanes (8 per AVX-512 register, int64 ->
    float conversions); truncating every step back to uint8 and converting through int32
    lets it narrow to 8/32-bit lanes (about 2x faster on q4_K/q5_K, the same values)."""
    return np.float32(np.int32(np.uint8(x)))


@njit(**_J)
def _q4_0(src, f16, kv, dst, qk):       # d f16 | qs[16]: lo nibble j, hi nibble j+16
    h = qk >> 1                         # run-time trip count (see _q8_0)
    for b in range(dst.shape[0] // 32):
        p = b * 18
        o = b * 32
        d = _h(src, p, f16)
        for j in range(h):
            v = np.int64(src[p + 2 + j])
            dst[o + j] = d * np.float32((v & 15) - 8)
            dst[o + j + 16] = d * np.float32((v >> 4) - 8)


@njit(**_J)
def _q4_1(src, f16, kv, dst, qk):       # d f16 | m f16 | qs[16]
    h = qk >> 1                         # run-time trip count (see _q8_0)
    for b in range(dst.shape[0] // 32):
        p = b * 20
        o = b * 32
        d = _h(src, p, f16)
        m = _h(src, p + 2, f16)
        for j in range(h):
            v = src[p + 4 + j]
            dst[o + j] = d * _u8f(v & np.uint8(15)) + m
            dst[o + j + 16] = d * _u8f(v >> np.uint8(4)) + m


@njit(**_J)
def _q5_0(src, f16, kv, dst):           # d f16 | qh u32 (5th bits) | qs[16]
    for b in range(dst.shape[0] // 32):
        p = b * 22
        o = b * 32
        d = _h(src, p, f16)
        qh = _u32(src, p + 2)
        for j in range(16):
            b = np.int64(src[p + 6 + j])
            dst[o + j] = d * np.float32(((b & 15) | (((qh >> j) & 1) << 4)) - 16)
            dst[o + j + 16] = d * np.float32(((b >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16)


@njit(**_J)
def _q5_1(src, f16, kv, dst):           # d f16 | m f16 | qh u32 | qs[16]
    for b in range(dst.shape[0] // 32):
        p = b * 24
        o = b * 32
        d = _h(src, p, f16)
        m = _h(src, p + 2, f16)
        qh = _u32(src, p + 4)
        for j in range(16):
            b = np.int64(src[p + 8 + j])
            dst[o + j] = d * np.float32((b & 15) | (((qh >> j) & 1) << 4)) + m
            dst[o + j + 16] = d * np.float32((b >> 4) | (((qh >> (j + 16)) & 1) << 4)) + m


@njit(**_J)
def _q8_0(src, f16, kv, dst, qk):       # d f16 | qs int8[32]
    # qk (== 32) is a run-time trip count: a constant one gets the loop fully unrolled into
    # scalar code before the loop vectorizer (with its run-time alias check) sees it.
    for b in range(dst.shape[0] // 32):
        p = b * 34
        o = b * 32
        d = _h(src, p, f16)
        for j in range(qk):
            dst[o + j] = d * np.float32(np.int8(src[p + 2 + j]))


@njit(**_J)
def _iq4_nl(src, f16, kv, dst):         # d f16 | qs[16] indices into kvalues
    for b in range(dst.shape[0] // 32):
        p = b * 18
        o = b * 32
        d = _h(src, p, f16)
        for j in range(16):
            b = np.int64(src[p + 2 + j])
            dst[o + j] = d * kv[b & 15]
            dst[o + j + 16] = d * kv[b >> 4]


#: ggml kvalues_mxfp4 (E2M1 doubled) and ggml_e8m0_to_fp32_half of every byte, 2^(e-128):
#: global arrays, compiled in as constants
_FP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)
_E8H = np.ldexp(np.float32(1), np.arange(256, dtype=np.int32) - 128).astype(np.float32)


@njit(**_J)
def _mxfp4(src, dst):                   # e (E8M0) | qs[16] indices into kvalues_mxfp4
    for b in range(dst.shape[0] // 32):
        p = b * 17
        o = b * 32
        d = _E8H[src[p]]
        for j in range(16):
            v = np.int64(src[p + 1 + j])
            dst[o + j] = _FP4[v & 15] * d
            dst[o + j + 16] = _FP4[v >> 4] * d


_UE4H = tables.ue4m3_half_table()


@njit(**_J)
def _nvfp4(src, dst):                   # d[4] (UE4M3, one per 16) | qs[32] (8 bytes per 16)
    for b in range(dst.shape[0] // 64):
        p = b * 36
        o = b * 64
        for s in range(4):
            d = _UE4H[src[p + s]]
            for j in range(8):
                v = np.int64(src[p + 4 + 8 * s + j])
                dst[o + 16 * s + j] = _FP4[v & 15] * d
                dst[o + 16 * s + j + 8] = _FP4[v >> 4] * d


@njit(**_J)
def _tq2_0(src, f16, dst, qk):          # qs[64] (2-bit t at bits 2n of byte 32h+m) | d
    # 8/32-bit lanes (see _u8f); qk (== 256) keeps the inner trip count a run-time value
    n32 = qk >> 3
    for b in range(dst.shape[0] // 256):
        p = b * 66
        o = b * 256
        d = _h(src, p + 64, f16)
        for h in range(2):
            for n in range(4):
                sh = np.uint8(2 * n)
                for m in range(n32):
                    t = np.uint8(src[p + 32 * h + m] >> sh) & np.uint8(3)
                    dst[o + 128 * h + 32 * n + m] = np.float32(np.int32(t) - np.int32(1)) * d


@njit(inline="always", **_J)
def _trit(byte, pw):
    """The trit of a TQ1_0 byte that pw = 3^k selects: ((byte * pw mod 256) * 3) >> 8, in
    32-bit lanes, as float32 t - 1."""
    q = np.uint8(np.uint32(byte) * np.uint32(pw))
    return np.float32(((np.int32(q) * np.int32(3)) >> np.int32(8)) - np.int32(1))


@njit(**_J)
def _tq1_0(src, f16, dst, qk):          # qs[48] (5 trits/byte) | qh[4] (4 trits/byte) | d
    n32 = qk >> 3                       # run-time trip counts (see _q8_0)
    n16 = qk >> 4
    for b in range(dst.shape[0] // 256):
        p = b * 54
        o = b * 256
        d = _h(src, p + 52, f16)
        pw = 1
        for k in range(5):
            for m in range(n32):
                dst[o + 32 * k + m] = _trit(src[p + m], pw) * d
            for m in range(n16):
                dst[o + 160 + 16 * k + m] = _trit(src[p + 32 + m], pw) * d
            if k < 4:
                for j in range(4):
                    dst[o + 240 + 4 * k + j] = _trit(src[p + 48 + j], pw) * d
            pw *= 3


@njit(**_J)
def _iq4_xs(src, f16, kv, dst):         # d | scales_h u16 | scales_l[4] | qs[128]
    for b in range(dst.shape[0] // 256):
        p = b * 136
        o = b * 256
        d = _h(src, p, f16)
        sh = np.int64(src[p + 2]) | (np.int64(src[p + 3]) << 8)
        for ib in range(8):
            ls = ((np.int64(src[p + 4 + ib // 2]) >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3) << 4)
            dl = d * np.float32(ls - 32)
            q = p + 8 + 16 * ib
            for j in range(16):
                v = np.int64(src[q + j])
                dst[o + 32 * ib + j] = dl * kv[v & 15]
                dst[o + 32 * ib + j + 16] = dl * kv[v >> 4]


@njit(**_J)
def _q2_k(src, f16, kv, dst):           # scales[16] | qs[64] | d | dmin
    for b in range(dst.shape[0] // 256):
        p = b * 84
        o = b * 256
        d = _h(src, p + 80, f16)
        dmin = _h(src, p + 82, f16)
        for h in range(2):
            for j in range(4):
                # 32 weights per loop, the two 16-weight sub-blocks' scales by a select (a
                # 16-trip loop is unrolled into scalar code; see _q3_k)
                sc0 = np.int64(src[p + h * 8 + 2 * j])
                sc1 = np.int64(src[p + h * 8 + 2 * j + 1])
                dl0 = d * np.float32(sc0 & 15)
                ml0 = dmin * np.float32(sc0 >> 4)
                dl1 = d * np.float32(sc1 & 15)
                ml1 = dmin * np.float32(sc1 >> 4)
                sh = 2 * j
                qo = p + 16 + h * 32
                do = o + h * 128 + j * 32
                for l in range(32):
                    q = (np.int64(src[qo + l]) >> sh) & 3
                    dst[do + l] = (dl0 if l < 16 else dl1) * np.float32(q) - (ml0 if l < 16 else ml1)


@njit(inline="always", **_J)
def _q3_scale(src, s, i):
    """6-bit scale i (0..15) of a Q3_K block, from its 12 packed bytes at src[s:], minus 32."""
    lo = np.int64(src[s + i]) & 15 if i < 8 else np.int64(src[s + i - 8]) >> 4
    hi = (np.int64(src[s + 8 + (i & 3)]) >> (2 * (i >> 2))) & 3
    return (lo | (hi << 4)) - 32


@njit(**_J)
def _q3_k(src, f16, kv, dst):           # hmask[32] | qs[64] | scales[12] | d
    # 32 weights per inner loop (two 16-weight scales picked by a select), branch-free:
    # the high bit is -4 when clear. Straight indexing of the row arrays vectorizes.
    for b in range(dst.shape[0] // 256):
        p = b * 110
        o = b * 256
        d = _h(src, p + 108, f16)
        for h in range(2):
            for j in range(4):
                i = h * 8 + 2 * j
                dl0 = d * np.float32(_q3_scale(src, p + 96, i))
                dl1 = d * np.float32(_q3_scale(src, p + 96, i + 1))
                sh = 2 * j
                hb = 4 * h + j
                qo = p + 32 + h * 32
                do = o + h * 128 + j * 32
                for l in range(32):
                    q = ((np.int64(src[qo + l]) >> sh) & 3) - ((((np.int64(src[p + l]) >> hb) & 1) ^ 1) << 2)
                    dst[do + l] = (dl0 if l < 16 else dl1) * np.float32(q)


@njit(inline="always", **_J)
def _scale_min_k4(src, s, j):
    """6-bit (scale, min) of sub-block j from the 12 packed bytes at src[s:]."""
    if j < 4:
        return np.int64(src[s + j]) & 63, np.int64(src[s + j + 4]) & 63
    a = np.int64(src[s + j + 4])
    return ((a & 15) | ((np.int64(src[s + j - 4]) >> 6) << 4),
            (a >> 4) | ((np.int64(src[s + j]) >> 6) << 4))


@njit(**_J)
def _q4_k(src, f16, kv, dst):           # d | dmin | scales[12] | qs[128]
    for b in range(dst.shape[0] // 256):
        p = b * 144
        o = b * 256
        d = _h(src, p, f16)
        dmin = _h(src, p + 2, f16)
        for c in range(4):
            sc1, m1 = _scale_min_k4(src, p + 4, 2 * c)
            sc2, m2 = _scale_min_k4(src, p + 4, 2 * c + 1)
            d1 = d * np.float32(sc1)
            n1 = dmin * np.float32(m1)
            d2 = d * np.float32(sc2)
            n2 = dmin * np.float32(m2)
            for l in range(32):
                b = src[p + 16 + 32 * c + l]
                dst[o + 64 * c + l] = d1 * _u8f(b & np.uint8(15)) - n1
                dst[o + 64 * c + 32 + l] = d2 * _u8f(b >> np.uint8(4)) - n2


@njit(**_J)
def _q5_k(src, f16, kv, dst):           # d | dmin | scales[12] | qh[32] | qs[128]
    u0 = np.uint8(0)
    u16 = np.uint8(16)
    for b in range(dst.shape[0] // 256):
        p = b * 176
        o = b * 256
        d = _h(src, p, f16)
        dmin = _h(src, p + 2, f16)
        for c in range(4):
            sc1, m1 = _scale_min_k4(src, p + 4, 2 * c)
            sc2, m2 = _scale_min_k4(src, p + 4, 2 * c + 1)
            d1 = d * np.float32(sc1)
            n1 = dmin * np.float32(m1)
            d2 = d * np.float32(sc2)
            n2 = dmin * np.float32(m2)
            # the 5th bits: a test against a uint8 mask and a select of 16 (not a shift by a
            # run-time amount, which keeps the loop in 64-bit lanes; see _u8f)
            k1 = np.uint8(1 << (2 * c))
            k2 = np.uint8(2 << (2 * c))
            for l in range(32):
                b = src[p + 48 + 32 * c + l]
                hb = src[p + 16 + l]
                q1 = np.uint8(b & np.uint8(15)) + (u16 if np.uint8(hb & k1) != 0 else u0)
                q2 = np.uint8(b >> np.uint8(4)) + (u16 if np.uint8(hb & k2) != 0 else u0)
                dst[o + 64 * c + l] = d1 * _u8f(q1) - n1
                dst[o + 64 * c + 32 + l] = d2 * _u8f(q2) - n2


@njit(**_J)
def _q6_k(src, f16, kv, dst):           # ql[128] | qh[64] | scales int8[16] | d
    for b in range(dst.shape[0] // 256):
        p = b * 210
        o = b * 256
        d = _h(src, p + 208, f16)
        for h in range(2):
            for g in range(4):
                sl = 0 if g < 2 else 4
                sh = 2 * g
                dl0 = d * np.float32(np.int8(src[p + 192 + 8 * h + 2 * g]))
                dl1 = d * np.float32(np.int8(src[p + 192 + 8 * h + 2 * g + 1]))
                lo = p + 64 * h + 32 * (g & 1)
                hq = p + 128 + 32 * h
                do = o + 128 * h + 32 * g
                for l in range(32):
                    q = ((np.int64(src[lo + l]) >> sl) & 15) | (((np.int64(src[hq + l]) >> sh) & 3) << 4)
                    dst[do + l] = (dl0 if l < 16 else dl1) * np.float32(q - 32)


#: the lattice i-quants' type ids (IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ3_S, IQ2_S, IQ1_M): their
#: decoders are a kernel of their own (iq_rows), so that the common formats' kernel (ggml_rows)
#: compiles without their grids (about 4 CPU s less on the way to the first schemes)
IQ_TIDS = frozenset({16, 17, 18, 19, 21, 22, 29})


@njit(**_J)
def _ggml_row(src, tid, qk, bpb, f16, kv, dst):
    if tid == 0:
        _q4_0(src, f16, kv, dst, qk)
    elif tid == 1:
        _q4_1(src, f16, kv, dst, qk)
    elif tid == 2:
        _q5_0(src, f16, kv, dst)
    elif tid == 3:
        _q5_1(src, f16, kv, dst)
    elif tid == 4:
        _q8_0(src, f16, kv, dst, qk)
    elif tid == 5:
        _q2_k(src, f16, kv, dst)
    elif tid == 6:
        _q3_k(src, f16, kv, dst)
    elif tid == 7:
        _q4_k(src, f16, kv, dst)
    elif tid == 8:
        _q5_k(src, f16, kv, dst)
    elif tid == 9:
        _q6_k(src, f16, kv, dst)
    elif tid == 10:
        _iq4_nl(src, f16, kv, dst)
    elif tid == 11:
        _mxfp4(src, dst)
    elif tid == 12:
        _tq1_0(src, f16, dst, qk)
    elif tid == 13:
        _tq2_0(src, f16, dst, qk)
    elif tid == 14:
        _iq4_xs(src, f16, kv, dst)
    elif tid == 40:
        _nvfp4(src, dst)


@njit(**_J)
def _iq_row(src, tid, qk, bpb, f16, kv, dst):
    if tid == 18:
        iq3_xxs_row(src, f16, dst)
    elif tid == 21:
        iq3_s_row(src, f16, dst)
    elif tid == 16:
        iq2_xxs_row(src, f16, dst)
    elif tid == 17:
        iq2_xs_row(src, f16, dst)
    elif tid == 22:
        iq2_s_row(src, f16, dst)
    elif tid == 19:
        iq1_s_row(src, f16, dst)
    elif tid == 29:
        iq1_m_row(src, f16, dst)


@njit(inline="always", **_J)
def _shape(w, out):
    """(write, rows, cols) of a row kernel's call: decode into out, or measure against w."""
    write = out.shape[0] > 0
    return write, (out.shape[0] if write else w.shape[0]), (out.shape[1] if write else w.shape[1])


@njit(inline="always", **_J)
def _one_row(row, r, blocks, tid, qk, bpb, f16, kv, w, out, acc, write, cols):
    buf = out[r] if write else np.empty(cols, np.float32)
    row(blocks[r], tid, qk, bpb, f16, kv, buf)
    if not write:
        _acc_row(w[r], buf, acc[r])


@njit(**_P)
def ggml_rows(blocks, tid, qk, bpb, f16, kv, w, out, acc):
    """Decode each row of GGML blocks into out's row; or, where out has no rows, compare it
    with w's row and put the error sums in acc's (_acc_row). One kernel for both, so that
    LLVM compiles the decoders of every type once, not once per entry (about 7 CPU s)."""
    write, rows, cols = _shape(w, out)
    for r in prange(rows):
        _one_row(_ggml_row, r, blocks, tid, qk, bpb, f16, kv, w, out, acc, write, cols)


@njit(**_P)
def iq_rows(blocks, tid, qk, bpb, f16, kv, w, out, acc):
    """ggml_rows for the lattice i-quants (IQ_TIDS)."""
    write, rows, cols = _shape(w, out)
    for r in prange(rows):
        _one_row(_iq_row, r, blocks, tid, qk, bpb, f16, kv, w, out, acc, write, cols)


def _rows_kernel(tid):
    return iq_rows if int(tid) in IQ_TIDS else ggml_rows


def ggml_dequant(blocks, tid, qk, bpb, f16, kv, out):
    """out (rows, cols) float32 = the blocks decoded."""
    _rows_kernel(tid)(blocks, tid, qk, bpb, f16, kv, NO_W, out, NO_ACC)


def ggml_error(blocks, tid, qk, bpb, f16, kv, w, acc):
    """acc (rows, 5) float64 = per row the error sums of the blocks against w (read-only)."""
    _rows_kernel(tid)(blocks, tid, qk, bpb, f16, kv, w, NO_OUT, acc)


@njit(inline="always", **_J)
def _enc_q4_0(x, key, dst):
    """One Q4_0 block: x float32[32], key from _block_keys -> dst[0:18]. Returns 0, or 1
    when the float16 scale overflows."""
    mx = x[31 - (key & 31)]                  # the first value of largest |x|
    d = mx / np.float32(-8.0)
    inv = F0 if d == 0 else np.float32(1.0) / d
    inv = inv if abs(inv) < np.inf else F0     # subnormal d: 1/d overflows (as safe_recip)
    for j in range(16):
        q0 = np.int32(x[j] * inv + np.float32(8.5))
        q1 = np.int32(x[j + 16] * inv + np.float32(8.5))
        q0 = min(max(q0, 0), 15)
        q1 = min(max(q1, 0), 15)
        dst[2 + j] = np.uint8(q0 | (q1 << 4))
    return _put_f16(dst, d)


@njit(inline="always", **_J)
def _enc_q8_0(x, key, dst):
    """One Q8_0 block: x float32[32] -> dst[0:34], int8 codes rounded half away from zero.
    Returns as _enc_q4_0."""
    d = _key_f32(np.int32(key >> 5)) / np.float32(127.0)     # max |x| (bits >= 0: a key)
    inv = F0 if d == 0 else np.float32(1.0) / d
    inv = inv if abs(inv) < np.inf else F0     # subnormal d: 1/d overflows (as safe_recip)
    for j in range(32):
        v = x[j] * inv
        av = abs(v)
        fl = np.floor(av)
        q = np.int32(fl) + (1 if av - fl >= np.float32(0.5) else 0)
        q = -q if v < 0 else q
        dst[2 + j] = np.uint8(q & 255)
    return _put_f16(dst, d)


@njit(inline="always", **_J)
def _enc_block(x, key, q, dst, tid):
    """_encode_row's block encoder: Q4_0 (tid 0) or Q8_0 (tid 4); q unused (None)."""
    return _enc_q4_0(x, key, dst) if tid == 0 else _enc_q8_0(x, key, dst)


@njit(**_P)
def ggml_encode(w, wu, tid, bpb, blocks, flags):
    """Q4_0 (tid 0) / Q8_0 (tid 4) blocks of w (rows, cols), float16 scale included.
    flags[r] = 1 when a block scale of row r overflows float16, 2 for NaN/Inf in row r."""
    rows, cols = w.shape
    nb = cols // 32
    nch = min(rows, 256)                     # chunks of rows: one scratch buffer each
    for ch in prange(nch):
        t = np.empty(max(cols >> 2, 1), np.int64)
        for r in range(ch * rows // nch, (ch + 1) * rows // nch):
            flags[r] = _encode_row(_enc_block, w[r], wu[r], t, None, nb, bpb, tid, blocks[r])

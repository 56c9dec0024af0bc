"""numba CPU kernels of the packed-code (affine) family, the one-pass quantize: each row's
ranges, qparams and codes while it is in cache (``quant_fused``), and the same pass measured
against the row instead of packed (``quant_error_fused``). The code and qparams helpers are
``cpu_affine_quant``'s. Imports nothing from ``workbench``."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .cpu_affine_quant import _codes_int, _codes_int_pair, _int_qp, _pack_row, _qint, _sym_qp
from .cpu_common import F0, _J, _P, _acc_row, _key_f32
from .cpu_sym_rows import ROW_BLOCKS, ROW_GS, _sym_row

# ---------------------------------------------------------------- fused quantize
# One pass per row: each block's range, its qparams and its packed codes while the block is
# in L1, plus a NaN/Inf test on the exponent bits (the caller counts them only when one is
# found). The output bytes are written whole (2 or 4 codes per byte) in vectorizable loops.

@njit(**_J)
def _minmax_keys(u):
    """(min, max) of the float32 values whose int32 bits are u, as order keys: the bits
    with the magnitude bits flipped for negative values, so that integer order is float
    order (-0.0 just below +0.0; NaN/Inf beyond every finite value). Integer min/max
    reductions vectorize (float compares in numba carry no fast-math flags and do not)."""
    lo = np.int32(0x7FFFFFFF)
    hi = np.int32(-0x80000000)
    for c in range(u.shape[0]):
        s = u[c]
        k = np.int32(s ^ ((s >> np.int32(31)) & np.int32(0x7FFFFFFF)))
        lo = min(lo, k)
        hi = max(hi, k)
    return lo, hi


@njit(inline="always", **_J)
def _key_bad(lo, hi):
    """True when the keys' range holds a NaN or an Inf."""
    return lo < np.int32(-0x7F800000) or hi >= np.int32(0x7F800000)


@njit(inline="always", **_J)
def _icode(x, a, z, qmin, qmax, offset):
    return np.int32(_qint(x, a, z, qmin, qmax)) + offset


@njit(**_J)
def _put_codes(x, a, z, qmin, qmax, offset, bits, dst):
    """Integer codes of block x packed little-endian into dst (len(x) % 8 == 0)."""
    n = x.shape[0]
    if bits == 8:
        for c in range(n):
            dst[c] = np.uint8(_icode(x[c], a, z, qmin, qmax, offset))
    elif bits == 4:
        for i in range(n >> 1):
            q0 = _icode(x[2 * i], a, z, qmin, qmax, offset)
            q1 = _icode(x[2 * i + 1], a, z, qmin, qmax, offset)
            dst[i] = np.uint8(q0 | (q1 << 4))
    elif bits == 2:
        for i in range(n >> 2):
            q0 = _icode(x[4 * i], a, z, qmin, qmax, offset)
            q1 = _icode(x[4 * i + 1], a, z, qmin, qmax, offset)
            q2 = _icode(x[4 * i + 2], a, z, qmin, qmax, offset)
            q3 = _icode(x[4 * i + 3], a, z, qmin, qmax, offset)
            dst[i] = np.uint8(q0 | (q1 << 2) | (q2 << 4) | (q3 << 6))
    else:
        for g in range(n >> 3):
            v = np.int64(0)
            for j in range(8):
                v |= np.int64(_icode(x[8 * g + j], a, z, qmin, qmax, offset)) << (j * bits)
            for t in range(bits):
                dst[g * bits + t] = np.uint8((v >> (8 * t)) & 255)


@njit(inline="always", **_J)
def _f64_to_f16_bits(v):
    """float16 bits of a float64 0 <= v <= 65504, rounded to nearest even in one step (as
    numpy's float64 -> float16 cast), with integer operations on v's bits."""
    if v == 0.0:
        return np.int64(0)
    u = np.float64(v).view(np.int64)
    e = (u >> 52) - 1023
    m = (u & ((np.int64(1) << 52) - 1)) | (np.int64(1) << 52)
    if e >= -14:                             # normal: 53 -> 11 significant bits
        q = (m + (np.int64(1) << 41) - 1 + ((m >> 42) & 1)) >> 42
        return ((e + 15) << 10) + (q - 1024)  # q == 2048 carries into the exponent
    sh = 28 - e                              # subnormal: units of 2**-24
    if sh >= 60:
        return np.int64(0)
    return (m + (np.int64(1) << (sh - 1)) - 1 + ((m >> sh) & 1)) >> sh


@njit(inline="always", **_J)
def _absmean8s(x, t):
    """_absmean8 (numpy's pairwise order, 8 <= len <= 128) with |x| widened into the float64
    scratch t first (a vectorized loop), then the eight partial sums."""
    n = x.shape[0]
    for i in range(n):
        t[i] = np.float64(abs(x[i]))
    p0 = t[0]
    p1 = t[1]
    p2 = t[2]
    p3 = t[3]
    p4 = t[4]
    p5 = t[5]
    p6 = t[6]
    p7 = t[7]
    for g in range(1, n >> 3):
        c = 8 * g
        p0 += t[c]
        p1 += t[c + 1]
        p2 += t[c + 2]
        p3 += t[c + 3]
        p4 += t[c + 4]
        p5 += t[c + 5]
        p6 += t[c + 6]
        p7 += t[c + 7]
    return (((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7))) / n


@njit(**_P)
def quant_rows(w, wu, mode, bits, gs, asym, qmin, qmax, offset, f16, f16_table, scale32,
               scale16, zero, out, bad, divs, acc):
    """quant_fused where out has elements, else quant_error_fused (acc): one kernel for both,
    so that numba and LLVM compile the row helpers and the parallel loop once, not once per
    entry."""
    rows, cols = w.shape
    bpr = cols // gs
    fq = np.float32(qmax)
    fqmin = np.float32(qmin)
    measure = out.shape[0] == 0
    rb = (cols * bits) >> 3
    bb = (gs * bits) >> 3
    nch = min(rows, 256)                     # chunks of rows: one scratch buffer each
    # 2 and 3 bits, and blocks of 32: one code per byte into a row buffer, block by block
    # (blocks of 32 two at a time), then the row packed in one loop (short blocks pack
    # poorly on their own; measured).
    rowwise = bits == 2 or bits == 3 or gs <= 32
    nc = divs.shape[0]
    # small symmetric blocks: the search of a whole row at once (cpu_sym_rows._sym_row)
    srow = mode == 0 and not asym and gs <= ROW_GS and bpr >= ROW_BLOCKS
    sb = bpr if srow else 1
    for ch in prange(nch):
        t = np.empty(gs if mode == 1 else 1, np.float64)
        cb = np.empty(cols if rowwise and not measure else 1, np.uint8)
        tk = np.empty((2, bpr), np.int32)
        tq = np.empty(2 * bpr, np.float32)
        buf = np.empty(cols if measure else 1, np.float32)
        c32 = np.empty(3 * nc, np.float32)
        lanes = np.empty(8 * nc, np.float64)
        rf = np.empty((4 * nc + 3, sb), np.float32)     # _sym_row's scratch
        rt = np.empty((gs if srow else 1, sb), np.float32)
        ri = np.empty((2, sb), np.int64)
        for r in range(ch * rows // nch, (ch + 1) * rows // nch):
            if measure:
                _row_qparams(w[r], wu[r], r, mode, gs, bpr, asym, fqmin, fq, f16, f16_table,
                             scale32, scale16, zero, t, bad, tk, tq, divs, c32, lanes, srow, rf,
                             rt, ri)
                if bad[r]:
                    continue
                _deq_row(w[r], r * bpr, gs, bpr, tq, f16, f16_table, scale32, scale16, fqmin,
                         fq, buf)
                _acc_row(w[r], buf, acc[r])
                continue
            orow = out[r * rb:(r + 1) * rb]
            _quant_row(w[r], wu[r], r, mode, bits, gs, bpr, asym, fqmin, fq, offset, f16,
                       f16_table, scale32, scale16, zero, orow, bb, t, bad, rowwise, cb, tk, tq,
                       divs, c32, lanes, srow, rf, rt, ri)
            if rowwise:
                _pack_row(cb, bits, orow)


#: quant_rows' stand-ins for the output an entry does not write
_NO_CODES = np.zeros(0, np.uint8)
_NO_ACC = np.zeros((0, 5), np.float64)


def quant_fused(w, wu, mode, bits, gs, asym, qmin, qmax, offset, f16, f16_table, scale32,
                scale16, zero, out, bad, divs):
    """Quantize w (rows, cols), blocks of gs along each row (gs % 8 == 0, gs | cols), codes
    packed into out (row r at r * cols * bits / 8). mode 0: integer min/max qparams (as
    int_qparams); mode 1: ternary (scale = float16(mean|x|) from float64, codes in -1..1).
    wu: w's int32 bits; bad[r] = 1 when row r holds a NaN/Inf (its block is skipped)."""
    quant_rows(w, wu, mode, bits, gs, asym, qmin, qmax, offset, f16, f16_table, scale32,
               scale16, zero, out, bad, divs, _NO_ACC)


def quant_error_fused(w, wu, mode, bits, gs, asym, qmin, qmax, offset, f16, f16_table,
                      scale32, scale16, zero, bad, acc, divs):
    """The exact error of quantizing w as quant_fused does (acc as affine_error's), in one
    pass and without packing: each row's qparams (quant_fused's), then its codes dequantized
    at once as the integer lookup table gives them ((code - offset) - zero) * scale, float32
    as affine_dequant; _deq_row) and measured against the row while it is in cache. Scales
    and zero points are written as quant_fused writes them (the caller checks their range);
    bad as there (that row is skipped)."""
    quant_rows(w, wu, mode, bits, gs, asym, qmin, qmax, offset, f16, f16_table, scale32,
               scale16, zero, _NO_CODES, bad, divs, acc)


@njit(**_J)
def _deq_row(row, k0, gs, bpr, tq, f16, f16_table, scale32, scale16, qmin, qmax, dst):
    """dst = the row's codes dequantized, computed at once: q = clip(rint(x * inv) + zero) as
    _codes_int gives it, then (q - zero) * scale, which is affine_dequant's (lut[code] -
    zero) * scale for code = q + offset (lut[code] = code - offset = q). Unsigned indices:
    numba checks a signed one for wraparound, and that loop did not vectorize (3x slower)."""
    for b in range(bpr):
        s = f16_table[scale16[k0 + b]] if f16 else scale32[k0 + b]
        a = tq[2 * b]
        z = tq[2 * b + 1]
        o = np.uint64(b * gs)
        for c in range(o, o + np.uint64(gs)):
            dst[c] = (_qint(row[c], a, z, qmin, qmax) - z) * s


@njit(**_J)
def _quant_row(row, urow, r, mode, bits, gs, bpr, asym, fqmin, fq, offset, f16, f16_table,
               scale32, scale16, zero, orow, bb, t, bad, rowwise, cb, tk, tq, divs, c32, lanes,
               srow, rf, rt, ri):
    """Qparams and codes of each block of one row (rowwise: one code per byte into cb):
    _row_qparams, then a loop over the row's blocks for the codes."""
    _row_qparams(row, urow, r, mode, gs, bpr, asym, fqmin, fq, f16, f16_table, scale32,
                 scale16, zero, t, bad, tk, tq, divs, c32, lanes, srow, rf, rt, ri)
    if bad[r]:
        return
    b0 = 0
    if rowwise and gs <= 32:
        b0 = bpr & ~1
        for b in range(0, b0, 2):
            _codes_int_pair(row[b * gs:(b + 2) * gs], tq[2 * b], tq[2 * b + 1], tq[2 * b + 2],
                            tq[2 * b + 3], gs, fqmin, fq, offset, cb[b * gs:(b + 2) * gs])
    for b in range(b0, bpr):
        x = row[b * gs:(b + 1) * gs]
        if rowwise:
            _codes_int(x, tq[2 * b], tq[2 * b + 1], fqmin, fq, offset, cb[b * gs:(b + 1) * gs])
        else:
            _put_codes(x, tq[2 * b], tq[2 * b + 1], fqmin, fq, offset, bits,
                       orow[b * bb:(b + 1) * bb])


@njit(**_J)
def _row_qparams(row, urow, r, mode, gs, bpr, asym, fqmin, fq, f16, f16_table, scale32,
                 scale16, zero, t, bad, tk, tq, divs, c32, lanes, srow, rf, rt, ri):
    """The qparams of each block of one row, in two loops over its blocks: ranges (tk[0]
    min, tk[1] max keys), then qparams (scale32/scale16, zero; tq: 1/scale, zero). bad[r] = 1
    for a NaN/Inf in the row or a float32 scale whose inverse overflows. srow: the symmetric
    search of the whole row at once (_sym_row; scratch rf, rt, ri), else (or where _sym_row
    declines) block by block."""
    k0 = r * bpr
    tlo = tk[0]
    thi = tk[1]
    for b in range(bpr):
        klo, khi = _minmax_keys(urow[b * gs:(b + 1) * gs])
        tlo[b] = klo
        thi[b] = khi
    for b in range(bpr):
        if _key_bad(tlo[b], thi[b]):
            bad[r] = 1
    if bad[r]:
        return
    if srow and _sym_row(row, tlo, thi, gs, divs, fqmin, fq, f16, rf, rt, ri, c32, lanes, k0,
                         scale32, scale16, tq):
        return
    if mode == 0 and not asym:
        for b in range(bpr):
            lo = abs(_key_f32(tlo[b]))
            hi = abs(_key_f32(thi[b]))
            s, sb, iv, ok = _sym_qp(row, b * gs, gs, lo if lo > hi else hi, divs, fqmin, fq,
                                    f16, f16_table, c32, lanes)
            if not ok:
                bad[r] = 1
                return
            if f16:
                scale16[k0 + b] = np.uint16(sb)
            else:
                scale32[k0 + b] = s
            tq[2 * b] = iv
            tq[2 * b + 1] = F0
    elif mode == 0:
        for b in range(bpr):
            s, sb, iv, z = _int_qp(_key_f32(tlo[b]), _key_f32(thi[b]), asym, fq, f16,
                                   f16_table)
            if asym:
                zero[k0 + b] = np.uint8(np.int32(z))
            if f16:
                scale16[k0 + b] = np.uint16(sb)
            else:
                scale32[k0 + b] = s
            tq[2 * b] = iv
            tq[2 * b + 1] = z
    else:
        for b in range(bpr):
            m = _absmean8s(row[b * gs:(b + 1) * gs], t)
            m = m if m < 65504.0 else 65504.0
            sb = _f64_to_f16_bits(m)
            s = f16_table[sb]
            scale16[k0 + b] = np.uint16(sb)
            tq[2 * b] = F0 if s == F0 else np.float32(1.0) / s
            tq[2 * b + 1] = F0

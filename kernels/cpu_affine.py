"""numba CPU kernels of the packed-code (affine) family: every integer scheme, NF4,
ternary and FP8 -- dequantize, fused error, block statistics, encode, integer qparams and
the fused one-pass quantize. Imports nothing from ``workbench``."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .cpu_common import F0, _J, _P, _acc_row, _fp8_code, _key_f32

# ---------------------------------------------------------------- affine (packed codes)
@njit(**_J)
def _lut8(codes, lut, z, s, dst):
    for c in range(dst.shape[0]):
        dst[c] = (lut[codes[c]] - z) * s


@njit(**_J)
def _lut4(codes, lut, z, s, dst):
    for c in range(codes.shape[0]):
        v = np.int32(codes[c])
        dst[2 * c] = (lut[v & 15] - z) * s
        dst[2 * c + 1] = (lut[v >> 4] - z) * s


@njit(**_J)
def _lut3(codes, lut, z, s, dst):
    """8 codes in each 3 bytes, little-endian bit stream."""
    for g in range(codes.shape[0] // 3):
        v = np.int32(codes[3 * g]) | (np.int32(codes[3 * g + 1]) << 8) | (np.int32(codes[3 * g + 2]) << 16)
        dst[8 * g] = (lut[v & 7] - z) * s
        dst[8 * g + 1] = (lut[(v >> 3) & 7] - z) * s
        dst[8 * g + 2] = (lut[(v >> 6) & 7] - z) * s
        dst[8 * g + 3] = (lut[(v >> 9) & 7] - z) * s
        dst[8 * g + 4] = (lut[(v >> 12) & 7] - z) * s
        dst[8 * g + 5] = (lut[(v >> 15) & 7] - z) * s
        dst[8 * g + 6] = (lut[(v >> 18) & 7] - z) * s
        dst[8 * g + 7] = (lut[v >> 21] - z) * s


@njit(**_J)
def _lut23_row(codes, bits, lut, scales, zeros, has_zero, sh, dst):
    """A whole row of 2- (or 3-) bit codes (block of output i: i >> sh, gs = 2**sh >= 8) in
    one loop over the row, so that short blocks (8 bytes for 2 bits x 32) still vectorize;
    each group of 8 codes (bits bytes) takes one block's scale and zero."""
    for g in range(codes.shape[0] // bits):
        k = (8 * g) >> sh
        s = scales[k]
        z = np.float32(zeros[k]) if has_zero else F0
        if bits == 2:
            v = np.int32(codes[2 * g]) | (np.int32(codes[2 * g + 1]) << 8)
        else:
            v = (np.int32(codes[3 * g]) | (np.int32(codes[3 * g + 1]) << 8)
                 | (np.int32(codes[3 * g + 2]) << 16))
        m = (1 << bits) - 1
        dst[8 * g] = (lut[v & m] - z) * s
        dst[8 * g + 1] = (lut[(v >> bits) & m] - z) * s
        dst[8 * g + 2] = (lut[(v >> (2 * bits)) & m] - z) * s
        dst[8 * g + 3] = (lut[(v >> (3 * bits)) & m] - z) * s
        dst[8 * g + 4] = (lut[(v >> (4 * bits)) & m] - z) * s
        dst[8 * g + 5] = (lut[(v >> (5 * bits)) & m] - z) * s
        dst[8 * g + 6] = (lut[(v >> (6 * bits)) & m] - z) * s
        dst[8 * g + 7] = (lut[(v >> (7 * bits)) & m] - z) * s


@njit(**_J)
def _affine_row(codes, bits, lut, scales, zeros, has_zero, cols, gs, bpr, r, dst):
    # x - 0.0 == x bit for bit (signed zeros and quiet NaNs included), so the 8-, 4-, 3- and
    # 2-bit paths subtract the zero point unconditionally.
    mask = (1 << bits) - 1
    base = r * cols
    nb = cols // gs
    aligned = ((base * bits) & 7) == 0 and (gs & 7) == 0
    ncodes = codes.shape[0]
    if aligned and bits == 2 and nb > 1 and (gs & (gs - 1)) == 0:     # measured: 3 bits are
        # faster per block (_lut3), 2 bits per row (blocks of 32 are only 8 bytes)
        p = (base * bits) >> 3
        k0 = r * bpr
        sh = 0
        while (1 << sh) < gs:
            sh += 1
        _lut23_row(codes[p:p + ((cols * bits) >> 3)], bits, lut, scales[k0:k0 + nb],
                   zeros[k0:k0 + nb] if has_zero else zeros, has_zero, sh, dst)
        return
    for b in range(nb):
        k = r * bpr + b
        s = scales[k]
        z = np.float32(zeros[k]) if has_zero else F0
        c0 = b * gs
        if aligned and bits == 8:                 # one code per byte
            _lut8(codes[base + c0:base + c0 + gs], lut, z, s, dst[c0:c0 + gs])
        elif aligned and bits == 4:               # two codes per byte, low nibble first
            p = (base + c0) >> 1
            _lut4(codes[p:p + (gs >> 1)], lut, z, s, dst[c0:c0 + gs])
        elif aligned and bits == 3:
            p = ((base + c0) * 3) >> 3
            _lut3(codes[p:p + ((gs * 3) >> 3)], lut, z, s, dst[c0:c0 + gs])
        elif aligned:
            p = ((base + c0) * bits) >> 3
            for c in range(c0, c0 + gs, 8):
                v = np.int64(0)
                for t in range(bits):
                    v |= np.int64(codes[p + t]) << (8 * t)
                p += bits
                if has_zero:
                    for j in range(8):
                        dst[c + j] = (lut[(v >> (j * bits)) & mask] - z) * s
                else:
                    for j in range(8):
                        dst[c + j] = lut[(v >> (j * bits)) & mask] * s
        else:
            for c in range(c0, c0 + gs):
                bp = (base + c) * bits
                i = bp >> 3
                v = np.int64(codes[i])
                if i + 1 < ncodes:
                    v |= np.int64(codes[i + 1]) << 8
                x = lut[(v >> (bp & 7)) & mask]
                if has_zero:
                    x = x - z
                dst[c] = x * s


@njit(**_P)
def affine_dequant(codes, bits, lut, scales, zeros, has_zero, gs, bpr, out):
    rows, cols = out.shape
    for r in prange(rows):
        _affine_row(codes, bits, lut, scales, zeros, has_zero, cols, gs, bpr, r, out[r])


@njit(**_P)
def affine_error(codes, bits, lut, scales, zeros, has_zero, gs, bpr, w, acc):
    rows, cols = w.shape
    for r in prange(rows):
        buf = np.empty(cols, np.float32)
        _affine_row(codes, bits, lut, scales, zeros, has_zero, cols, gs, bpr, r, buf)
        _acc_row(w[r], buf, acc[r])


# ---------------------------------------------------------------- quantize
@njit(fastmath={"nnan", "nsz"}, **_J)
def _amax(x):
    m = F0
    for c in range(x.shape[0]):
        a = abs(x[c])
        m = a if a > m else m
    return m


@njit(fastmath={"nnan", "nsz"}, **_J)
def _minmax(x):
    lo = x[0]
    hi = x[0]
    for c in range(x.shape[0]):
        v = x[c]
        lo = v if v < lo else lo
        hi = v if v > hi else hi
    return lo, hi


@njit(**_J)
def _absmean8(x):
    """mean |x| in float64, summed like numpy's pairwise sum for 8 <= len <= 128."""
    p0 = 0.0
    p1 = 0.0
    p2 = 0.0
    p3 = 0.0
    p4 = 0.0
    p5 = 0.0
    p6 = 0.0
    p7 = 0.0
    for g in range(x.shape[0] >> 3):
        c = 8 * g
        p0 += np.float64(abs(x[c]))
        p1 += np.float64(abs(x[c + 1]))
        p2 += np.float64(abs(x[c + 2]))
        p3 += np.float64(abs(x[c + 3]))
        p4 += np.float64(abs(x[c + 4]))
        p5 += np.float64(abs(x[c + 5]))
        p6 += np.float64(abs(x[c + 6]))
        p7 += np.float64(abs(x[c + 7]))
    return (((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7))) / x.shape[0]


@njit(**_P)
def block_stats(w, gs, bpr, mode, o1, o2):
    """Per block of (rows, cols) in group geometry: mode 0 o1 = max|w| (float32);
    mode 1 o1 = min, o2 = max (float32); mode 2 o1 = mean|w| in float64, summed in numpy's
    pairwise order for 8 <= gs <= 128, gs % 8 == 0 (eight interleaved partial sums).
    Inputs are finite (checked before) and the sign of a zero min/max never changes the
    qparams, hence nnan/nsz in the min/max helpers (lets them vectorize); no reassociation."""
    rows, cols = w.shape
    for r in prange(rows):
        row = w[r]
        for b in range(bpr):
            x = row[b * gs:(b + 1) * gs]
            k = r * bpr + b
            if mode == 0:
                o1[k] = _amax(x)
            elif mode == 1:
                lo, hi = _minmax(x)
                o1[k] = lo
                o2[k] = hi
            else:
                o1[k] = _absmean8(x)


# Hot loops run over whole 1-D views from index 0: numba then knows the indices are
# non-negative (no wrap-around checks) and LLVM vectorizes them (~10x faster).

@njit(**_J)
def _codes_int(row, a, z, qmin, qmax, offset, buf):
    """q = clip(rint(x * inv) + zero, qmin, qmax) + offset (float32, as the reference)."""
    for c in range(row.shape[0]):
        q = np.rint(row[c] * a) + z          # + 0.0 for symmetric: same integer
        q = qmin if q < qmin else q
        q = qmax if q > qmax else q
        buf[c] = np.uint8(np.int32(q) + offset)


@njit(**_J)
def _codes_int_pair(row, a0, z0, a1, z1, half, qmin, qmax, offset, buf):
    """_codes_int of two adjacent blocks of length half in one loop (parameters picked by a
    select): a 32-weight block alone is too short for the vectorized loop (measured 2x)."""
    for c in range(row.shape[0]):
        a = a0 if c < half else a1
        z = z0 if c < half else z1
        q = np.rint(row[c] * a) + z
        q = qmin if q < qmin else q
        q = qmax if q > qmax else q
        buf[c] = np.uint8(np.int32(q) + offset)


@njit(**_J)
def _codes_codebook(row, a, mids, buf):
    """Count of midpoints strictly below x * inv (searchsorted side='left')."""
    m = mids.shape[0]
    if m == 15:                                 # 16-entry codebook: branch-free lower bound
        for c in range(row.shape[0]):
            v = row[c] * a
            i = 0
            i += 8 if mids[i + 7] < v else 0
            i += 4 if mids[i + 3] < v else 0
            i += 2 if mids[i + 1] < v else 0
            i += 1 if mids[i] < v else 0
            buf[c] = np.uint8(i)
    else:
        for c in range(row.shape[0]):
            v = row[c] * a
            k = 0
            for i in range(m):
                if mids[i] < v:
                    k += 1
            buf[c] = np.uint8(k)


@njit(**_J)
def _codes_fp8(row, a, man, bias, maxcode, buf):
    for c in range(row.shape[0]):
        buf[c] = np.uint8(_fp8_code(row[c] / a, man, bias, maxcode))


@njit(**_J)
def _pack_row(buf, bits, out):
    """Pack the codes in buf as a little-endian bit stream into out (len(buf) % 8 == 0)."""
    n = buf.shape[0]
    if bits == 8:
        for i in range(n):
            out[i] = buf[i]
    elif bits == 4:
        for i in range(n >> 1):
            out[i] = buf[2 * i] | (buf[2 * i + 1] << 4)
    elif bits == 2:
        for i in range(n >> 2):
            out[i] = (buf[4 * i] | (buf[4 * i + 1] << 2) | (buf[4 * i + 2] << 4)
                      | (buf[4 * i + 3] << 6))
    elif bits == 3:
        for g in range(n >> 3):
            c = 8 * g
            v = (np.int32(buf[c]) | (np.int32(buf[c + 1]) << 3) | (np.int32(buf[c + 2]) << 6)
                 | (np.int32(buf[c + 3]) << 9) | (np.int32(buf[c + 4]) << 12)
                 | (np.int32(buf[c + 5]) << 15) | (np.int32(buf[c + 6]) << 18)
                 | (np.int32(buf[c + 7]) << 21))
            out[3 * g] = np.uint8(v & 255)
            out[3 * g + 1] = np.uint8((v >> 8) & 255)
            out[3 * g + 2] = np.uint8((v >> 16) & 255)
    else:
        for g in range(n >> 3):
            v = np.int64(0)
            for j in range(8):
                v |= np.int64(buf[8 * g + j]) << (j * bits)
            for t in range(bits):
                out[g * bits + t] = np.uint8((v >> (8 * t)) & 255)


@njit(**_P)
def encode(w, mode, bits, a, zf, has_zero, qmin, qmax, offset, mids, man, bias, maxcode,
           gs, bpr, packed, out):
    """Codes of w (rows, cols), block k = r*bpr + c//gs (gs divides cols). mode 0 integer
    (a = 1/scale, zf = zero point), 1 codebook (a = 1/absmax), 2 FP8 (a = row scale).
    packed: out is the little-endian bit stream (cols % 8 == 0); else one code per byte."""
    rows, cols = w.shape
    fqmin = np.float32(qmin)
    fqmax = np.float32(qmax)
    for r in prange(rows):
        row = w[r]
        buf = np.empty(cols, np.uint8)
        for b in range(cols // gs):
            k = r * bpr + b
            x = row[b * gs:(b + 1) * gs]
            o = buf[b * gs:(b + 1) * gs]
            if mode == 0:
                zk = zf[k] if has_zero else F0
                _codes_int(x, a[k], zk, fqmin, fqmax, offset, o)
            elif mode == 1:
                _codes_codebook(x, a[k], mids, o)
            else:
                _codes_fp8(x, a[k], man, bias, maxcode, o)
        if packed:
            p = (r * cols * bits) >> 3
            _pack_row(buf, bits, out[p:p + ((cols * bits) >> 3)])
        else:
            for c in range(cols):
                out[r * cols + c] = buf[c]


@njit(inline="always", **_J)
def _int_qp(lo, hi, asym, fq, f16, f16_table):
    """Min/max-clipping qparams of one block, exactly as IntAffine.choose_qparams +
    _store_scale (no @pot): sym scale = max|.| / qmax, asym scale = (max(hi,0) - min(lo,0)) /
    qmax and zero = clip(rint(-lo' / scale), 0, qmax); float16 storage rounds to nearest even
    after min(scale, 65504). Returns (stored scale as float32, its float16 bits, 1/scale or 0,
    zero point as float32)."""
    if asym:
        l = lo if lo < F0 else F0
        h = hi if hi > F0 else F0
        s = (h - l) / fq
    else:
        a = abs(lo)
        b = abs(hi)
        s = (a if a > b else b) / fq
    bits = np.int64(0)
    if f16:
        if s > np.float32(65504.0):
            s = np.float32(65504.0)
        bits = _fp8_code(s, 10, 15, 0x7BFF)      # float32 -> float16 bits, RNE
        s = f16_table[bits]
    iv = F0 if s == F0 else np.float32(1.0) / s
    z = F0
    if asym:
        l = lo if lo < F0 else F0
        z = np.rint(-l * iv)
        z = F0 if z < F0 else z
        z = fq if z > fq else z
    return s, bits, iv, z


@njit(**_P)
def int_qparams(lo, hi, asym, qmax, f16, f16_table, scale32, scale16, inv, zf, zero):
    """int_qparams of per-block lo/hi (see _int_qp): the stored scale (float32 or float16
    bits), inv = 1/stored scale (0 for 0) and the zero point."""
    fq = np.float32(qmax)
    for k in prange(lo.shape[0]):
        s, bits, iv, z = _int_qp(lo[k], hi[k], asym, fq, f16, f16_table)
        if f16:
            scale16[k] = np.uint16(bits)
        scale32[k] = s
        inv[k] = iv
        if asym:
            zero[k] = np.uint8(np.int32(z))
            zf[k] = z


@njit(inline="always", **_J)
def _sq1(x, iv, s, fqmin, fq):
    q = np.rint(x * iv)
    q = fqmin if q < fqmin else q
    q = fq if q > fq else q
    d = np.float64(q * s - x)
    return d * d


@njit(**_J)
def _sq_err8(x, iv, s, fqmin, fq):
    """Squared error of block x under scale s (inverse iv), codes clipped to fqmin..fq: float64
    squares of the float32 differences summed in eight lanes (element c into lane c % 8, each
    lane in element order) then ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)) -- the reference's order
    (IntAffine._sq_err), eight independent chains instead of one."""
    n = x.shape[0]
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
    for g in range(n >> 3):
        c = 8 * g
        a0 += _sq1(x[c], iv, s, fqmin, fq)
        a1 += _sq1(x[c + 1], iv, s, fqmin, fq)
        a2 += _sq1(x[c + 2], iv, s, fqmin, fq)
        a3 += _sq1(x[c + 3], iv, s, fqmin, fq)
        a4 += _sq1(x[c + 4], iv, s, fqmin, fq)
        a5 += _sq1(x[c + 5], iv, s, fqmin, fq)
        a6 += _sq1(x[c + 6], iv, s, fqmin, fq)
        a7 += _sq1(x[c + 7], iv, s, fqmin, fq)
    c0 = n & ~7
    for c in range(c0, n):
        v = _sq1(x[c], iv, s, fqmin, fq)
        k = c - c0
        if k == 0:
            a0 += v
        elif k == 1:
            a1 += v
        elif k == 2:
            a2 += v
        elif k == 3:
            a3 += v
        elif k == 4:
            a4 += v
        elif k == 5:
            a5 += v
        else:
            a6 += v
    return ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))


@njit(**_J)
def _sym_qp(x, amax, divs, fqmin, fq, f16, f16_table):
    """The symmetric divisor search of one block x (IntAffine._search_sym, min/max clipping, no
    @pot): each candidate scale amax / divs[i] (divs ascending), stored (float16: RNE), its
    codes clip(rint(x * (1/scale))) and the squared error (_sq_err8); the first least error
    wins. Returns (stored scale as
    float32, its float16 bits, 1/scale or 0, ok); ok False: a float32 scale whose inverse
    overflows (the reference divides: it decides). A float16 scale above 65504 gives 65504,
    which the caller's reference check (reference_needed) hands to the reference to refuse."""
    best_e = np.inf
    best_s = F0
    best_b = np.int64(0x7BFF)
    best_iv = F0
    held = False
    for i in range(divs.shape[0]):
        s = amax / divs[i]
        bits = np.int64(0)
        if f16:
            if s > np.float32(65504.0):          # the reference refuses: flag it by 65504
                return np.float32(65504.0), np.int64(0x7BFF), np.float32(1.0) / np.float32(
                    65504.0), True
            bits = _fp8_code(s, 10, 15, 0x7BFF)
            s = f16_table[bits]
        iv = F0 if s == F0 else np.float32(1.0) / s
        if np.isinf(iv):
            return s, bits, iv, False
        e = _sq_err8(x, iv, s, fqmin, fq)
        if not held or e < best_e:
            best_e = e
            best_s = s
            best_b = bits
            best_iv = iv
            held = True
    return best_s, best_b, best_iv, True


@njit(**_P)
def sym_qparams(w, gs, bpr, divs, qmin, qmax, f16, f16_table, scale32, scale16, inv, flags):
    """Symmetric searched qparams (_sym_qp) of each block of w (rows, cols), block k = r*bpr +
    c//gs: scale32 (or scale16 bits), inv. flags[k] = 1: a NaN/Inf in the block or a scale
    the reference decides (the caller declines)."""
    fq = np.float32(qmax)
    fqmin = np.float32(qmin)
    for k in prange(w.shape[0] * bpr):
        r = k // bpr
        b = k - r * bpr
        x = w[r, b * gs:(b + 1) * gs]
        amax = F0
        fin = True
        for c in range(x.shape[0]):
            a = abs(x[c])
            if not np.isfinite(a):
                fin = False
            amax = a if a > amax else amax
        flags[k] = 0
        if not fin:
            flags[k] = 1
            continue
        s, sb, iv, ok = _sym_qp(x, amax, divs, fqmin, fq, f16, f16_table)
        if not ok:
            flags[k] = 1
        if f16:
            scale16[k] = np.uint16(sb)
        scale32[k] = s
        inv[k] = iv


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
    q = np.rint(x * a) + z
    q = qmin if q < qmin else q
    q = qmax if q > qmax else q
    return np.int32(q) + offset


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
def quant_fused(w, wu, mode, bits, gs, asym, qmin, qmax, offset, f16, f16_table,
                scale32, scale16, zero, out, bad, divs):
    """Quantize w (rows, cols), blocks of gs along each row (gs % 8 == 0, gs | cols), codes
    packed into out (row r at r * cols * bits / 8). mode 0: integer min/max qparams (as
    int_qparams); mode 1: ternary (scale = float16(mean|x|) from float64, codes in -1..1).
    wu: w's int32 bits; bad[r] = 1 when row r holds a NaN/Inf (its block is skipped)."""
    rows, cols = w.shape
    bpr = cols // gs
    fq = np.float32(qmax)
    fqmin = np.float32(qmin)
    rb = (cols * bits) >> 3
    bb = (gs * bits) >> 3
    nch = min(rows, 256)                     # chunks of rows: one scratch buffer each
    # 2 and 3 bits, and blocks of 32: one code per byte into a row buffer, block by block
    # (blocks of 32 two at a time), then the row packed in one loop (short blocks pack
    # poorly on their own; measured).
    rowwise = bits == 2 or bits == 3 or gs <= 32
    for ch in prange(nch):
        t = np.empty(gs if mode == 1 else 1, np.float64)
        cb = np.empty(cols if rowwise else 1, np.uint8)
        tk = np.empty((2, bpr), np.int32)
        tq = np.empty(2 * bpr, np.float32)
        for r in range(ch * rows // nch, (ch + 1) * rows // nch):
            orow = out[r * rb:(r + 1) * rb]
            _quant_row(w[r], wu[r], r, mode, bits, gs, bpr, asym, fqmin, fq, offset, f16,
                       f16_table, scale32, scale16, zero, orow, bb, t, bad, rowwise, cb, tk, tq,
                       divs)
            if rowwise:
                _pack_row(cb, bits, orow)


@njit(**_P)
def quant_error_fused(w, wu, mode, bits, gs, asym, qmin, qmax, offset, f16, f16_table,
                      scale32, scale16, zero, bad, acc, divs):
    """The exact error of quantizing w as quant_fused does (acc as affine_error's), in one
    pass and without packing: each row's codes, one per byte (quant_fused's row helper with
    its row-wise layout: the same codes), dequantized at once as the integer lookup table
    gives them ((code - offset) - zero) * scale, float32 as affine_dequant) and measured
    against the row while it is in cache. Scales and zero points are written as quant_fused
    writes them (the caller checks their range); bad as there (that row is skipped)."""
    rows, cols = w.shape
    bpr = cols // gs
    fq = np.float32(qmax)
    fqmin = np.float32(qmin)
    nch = min(rows, 256)
    for ch in prange(nch):
        t = np.empty(gs if mode == 1 else 1, np.float64)
        cb = np.empty(cols, np.uint8)
        tk = np.empty((2, bpr), np.int32)
        tq = np.empty(2 * bpr, np.float32)
        buf = np.empty(cols, np.float32)
        for r in range(ch * rows // nch, (ch + 1) * rows // nch):
            _quant_row(w[r], wu[r], r, mode, bits, gs, bpr, asym, fqmin, fq, offset, f16,
                       f16_table, scale32, scale16, zero, cb, 0, t, bad, True, cb, tk, tq, divs)
            if bad[r]:
                continue
            k0 = r * bpr
            for b in range(bpr):
                s = f16_table[scale16[k0 + b]] if f16 else scale32[k0 + b]
                z = np.float32(zero[k0 + b]) if asym else F0
                _deq_int(cb[b * gs:(b + 1) * gs], offset, z, s, buf[b * gs:(b + 1) * gs])
            _acc_row(w[r], buf, acc[r])


@njit(**_J)
def _deq_int(codes, offset, z, s, dst):
    """(lut[code] - z) * s for the integer table lut[c] = float32(c - offset) (tables.int_lut),
    computed instead of looked up (vectorizes); x - 0.0 == x for the symmetric schemes."""
    for c in range(codes.shape[0]):
        dst[c] = (np.float32(np.int32(codes[c]) - offset) - z) * s


@njit(**_J)
def _quant_row(row, urow, r, mode, bits, gs, bpr, asym, fqmin, fq, offset, f16, f16_table,
               scale32, scale16, zero, orow, bb, t, bad, rowwise, cb, tk, tq, divs):
    """Qparams and codes of each block of one row (rowwise: one code per byte into cb), in
    three loops over the row's blocks: ranges (tk[0] min, tk[1] max keys), qparams (tq:
    1/scale, zero), codes."""
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
    if mode == 0 and not asym:
        for b in range(bpr):
            lo = abs(_key_f32(tlo[b]))
            hi = abs(_key_f32(thi[b]))
            s, sb, iv, ok = _sym_qp(row[b * gs:(b + 1) * gs], lo if lo > hi else hi, divs,
                                    fqmin, fq, f16, f16_table)
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

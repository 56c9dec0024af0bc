"""numba CPU kernels of the packed-code (affine) family, quantizing pass by pass: block
statistics (ranges, mean |w|), integer qparams (min/max and the symmetric divisor search),
and the codes with their packing (integer, codebook, FP8). ``cpu_affine_fused`` reuses the
code and qparams helpers in its one-pass kernels. Imports nothing from ``workbench``."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .cpu_common import F0, _J, _P, _fp8_code

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

@njit(inline="always", **_J)
def _qint(x, a, z, qmin, qmax):
    """clip(rint(x * inv) + zero, qmin, qmax) in float32, as the reference (+ 0.0 for the
    symmetric schemes: the same integer)."""
    q = np.rint(x * a) + z
    q = qmin if q < qmin else q
    return qmax if q > qmax else q


@njit(**_J)
def _codes_int(row, a, z, qmin, qmax, offset, buf):
    """q = clip(rint(x * inv) + zero, qmin, qmax) + offset (float32, as the reference)."""
    for c in range(row.shape[0]):
        buf[c] = np.uint8(np.int32(_qint(row[c], a, z, qmin, qmax)) + offset)


@njit(**_J)
def _codes_int_pair(row, a0, z0, a1, z1, half, qmin, qmax, offset, buf):
    """_codes_int of two adjacent blocks of length half in one loop (parameters picked by a
    select): a 32-weight block alone is too short for the vectorized loop (measured 2x)."""
    for c in range(row.shape[0]):
        a = a0 if c < half else a1
        z = z0 if c < half else z1
        buf[c] = np.uint8(np.int32(_qint(row[c], a, z, qmin, qmax)) + offset)


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
def _diff(x, iv, s, fqmin, fq):
    """q * s - x in float32, q = clip(rint(x * iv)): one weight's symmetric error."""
    q = np.rint(x * iv)
    q = fqmin if q < fqmin else q
    q = fq if q > fq else q
    return q * s - x


@njit(inline="always", **_J)
def _sq1(x, iv, s, fqmin, fq):
    d = np.float64(_diff(x, iv, s, fqmin, fq))
    return d * d


@njit(**_J)
def _sq_errs(x, ivs, ss, nc, fqmin, fq, lanes):
    """The squared errors of block x under nc candidate scales (scale ss[i], inverse ivs[i],
    codes clipped to fqmin..fq) in one pass over x, in the reference's order
    (IntAffine._sq_err): float64 squares of the float32 differences, element c into lane
    c % 8, each lane in element order: lanes[8 i + l] = lane l of candidate i (the caller
    adds ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7))). The lane loop's length is read off the buffer (lanes.shape[0] //
    nc = 8), a value LLVM cannot see: a loop of unknown length over consecutive addresses
    vectorizes, a constant 8 is unrolled and stays scalar. 2.7-3x faster than a pass per
    candidate (int4, 5 candidates, blocks of 128 and rows of 4096)."""
    n = x.shape[0]
    nl = lanes.shape[0] // nc
    for k in range(nc * 8):
        lanes[k] = 0.0
    for g in range(n >> 3):
        c = 8 * g
        for i in range(nc):
            iv = ivs[i]
            s = ss[i]
            o = i * 8
            for l in range(nl):
                lanes[o + l] += _sq1(x[c + l], iv, s, fqmin, fq)
    c0 = n & ~7
    for c in range(c0, n):
        for i in range(nc):
            lanes[i * 8 + c - c0] += _sq1(x[c], ivs[i], ss[i], fqmin, fq)


#: the float32 screen's chunk: its sums are within (SCREEN + 2) * 2**-24 of the exact ones
SCREEN = 256


@njit(inline="always", **_J)
def _sqd(v, iv, s, fqmin, fq):
    d = _diff(v, iv, s, fqmin, fq)
    return d * d


@njit(fastmath={"reassoc"}, **_J)
def _sq32(x, c32, nc, i, fqmin, fq, out):
    """out[i + k] (k < 5, i + k < nc) = the squared error of x under candidate i + k (scale
    c32[i + k], inverse c32[nc + i + k]) in float32, the five summed side by side in one
    loop, each in whatever order vectorizes (reassociation only: each difference q * s - x
    rounds as the reference's). Past nc the last candidate is computed again, not stored."""
    j = nc - 1
    i1 = min(i + 1, j)
    i2 = min(i + 2, j)
    i3 = min(i + 3, j)
    i4 = min(i + 4, j)
    s0, v0 = c32[i], c32[nc + i]
    s1, v1 = c32[i1], c32[nc + i1]
    s2, v2 = c32[i2], c32[nc + i2]
    s3, v3 = c32[i3], c32[nc + i3]
    s4, v4 = c32[i4], c32[nc + i4]
    a0 = np.float32(0.0)
    a1 = np.float32(0.0)
    a2 = np.float32(0.0)
    a3 = np.float32(0.0)
    a4 = np.float32(0.0)
    for c in range(x.shape[0]):
        v = x[c]
        a0 += _sqd(v, v0, s0, fqmin, fq)
        a1 += _sqd(v, v1, s1, fqmin, fq)
        a2 += _sqd(v, v2, s2, fqmin, fq)
        a3 += _sqd(v, v3, s3, fqmin, fq)
        a4 += _sqd(v, v4, s4, fqmin, fq)
    out[i] += a0
    if i + 1 <= j:
        out[i1] += a1
    if i + 2 <= j:
        out[i2] += a2
    if i + 3 <= j:
        out[i3] += a3
    if i + 4 <= j:
        out[i4] += a4


@njit(**_J)
def _sq_screen(x, c32, nc, fqmin, fq, out):
    """out[i] = the squared error of block x under candidate i (scale c32[i], inverse
    c32[nc + i]): _sq32 over chunks of SCREEN weights, the chunks' sums added in float64.
    Each is within (SCREEN + 2) * 2**-24 + len(x) * 2**-52 of the exact sum, relatively, plus
    len(x) * 2**-125 for squares below float32's normal range: a screen for _sym_qp
    (_sq_errs gives the reference's own figures). A loop over the chunks inside one function
    did not vectorize (measured 2x slower)."""
    n = x.shape[0]
    for i in range(nc):
        out[i] = 0.0
    for i in range(0, nc, 5):
        if n <= SCREEN:
            _sq32(x, c32, nc, i, fqmin, fq, out)
            continue
        for c0 in range(0, n, SCREEN):
            _sq32(x[c0:c0 + SCREEN], c32, nc, i, fqmin, fq, out)


@njit(inline="always", **_J)
def _exact_best(x, c32, nc, fqmin, fq, lanes):
    """The first candidate of least squared error on block x, the errors summed in the
    reference's order (_sq_errs; scales c32[:nc], inverses c32[nc:2 nc]): the decision of a
    near tie the float32 screen cannot make."""
    _sq_errs(x, c32[nc:2 * nc], c32[:nc], nc, fqmin, fq, lanes)
    best = 0
    best_e = np.inf
    for i in range(nc):
        k = 8 * i
        e = (((lanes[k] + lanes[k + 1]) + (lanes[k + 2] + lanes[k + 3]))
             + ((lanes[k + 4] + lanes[k + 5]) + (lanes[k + 6] + lanes[k + 7])))
        if i == 0 or e < best_e:
            best_e = e
            best = i
    return best


@njit(inline="always", **_J)
def _sym_qp(row, o, n, amax, divs, fqmin, fq, f16, f16_table, c32, lanes):
    """The symmetric divisor search of one block x = row[o:o+n] (IntAffine._search_sym,
    min/max clipping, no @pot): each candidate scale amax / divs[i] (divs ascending), stored
    (float16: RNE), its codes clip(rint(x * (1/scale))) and the squared error; the first least
    error wins. The errors are screened in float32 (_sq_screen, bounded); only when the least
    is not clear of another candidate by more than both their bounds (a near tie, an overflow)
    are they summed in the reference's order (_sq_errs) to decide. Returns (stored scale as
    float32, its float16 bits, 1/scale or 0, ok); ok False: a float32 scale whose inverse
    overflows (the reference divides: it decides). A float16 scale above 65504 gives 65504,
    which the caller's reference check (reference_needed) hands to the reference to refuse.
    c32 (3 * len(divs) float32: scales, inverses, float16 bits) and lanes (8 * len(divs)
    float64): the caller's scratch."""
    nc = divs.shape[0]
    for i in range(nc):                   # the scales first, checked in the search's order
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
            return s, np.int64(bits), iv, False
        c32[i] = s
        c32[nc + i] = iv
        c32[2 * nc + i] = np.float32(bits)    # < 2^15: exact
    x = row[o:o + n]
    _sq_screen(x, c32, nc, fqmin, fq, lanes)
    best = 0
    for i in range(1, nc):
        if lanes[i] < lanes[best]:
            best = i
    tol = (min(n, SCREEN) + 2) * 2.0 ** -24 + n * 2.0 ** -52
    slack = n * 2.0 ** -125
    clear = True
    for i in range(nc):
        # the same stored scale: the same error, and the first of them is best's side of it
        if i != best and c32[i] != c32[best] and not (
                lanes[i] - lanes[best] > tol * (lanes[i] + lanes[best]) + slack):
            clear = False
    if not clear:
        best = _exact_best(x, c32, nc, fqmin, fq, lanes)
    return c32[best], np.int64(c32[2 * nc + best]), c32[nc + best], True


@njit(**_P)
def sym_qparams(w, gs, bpr, divs, qmin, qmax, f16, f16_table, scale32, scale16, inv, flags):
    """Symmetric searched qparams (_sym_qp) of each block of w (rows, cols), block k = r*bpr +
    c//gs: scale32 (or scale16 bits), inv. flags[k] = 1: a NaN/Inf in the block or a scale
    the reference decides (the caller declines)."""
    fq = np.float32(qmax)
    fqmin = np.float32(qmin)
    nb = w.shape[0] * bpr
    nch = min(nb, 256)                       # chunks of blocks: one scratch buffer each
    for ch in prange(nch):
        c32 = np.empty(3 * divs.shape[0], np.float32)
        lanes = np.empty(8 * divs.shape[0], np.float64)
        for k in range(ch * nb // nch, (ch + 1) * nb // nch):
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
            s, sb, iv, ok = _sym_qp(w[r], b * gs, gs, amax, divs, fqmin, fq, f16, f16_table,
                                    c32, lanes)
            if not ok:
                flags[k] = 1
            if f16:
                scale16[k] = np.uint16(sb)
            scale32[k] = s
            inv[k] = iv

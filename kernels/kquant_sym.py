"""numba quantize kernels for Q3_K and Q6_K, bit-identical to the numpy reference
``workbench.schemes.ggml.sym_k`` (the same float32 operations in the same order, no FMA
contraction, every sum in index order).

Plain arrays in, bytes out; imports nothing from ``workbench``. The search parameters
(candidate steps, super-scale divisors, rounds) come from the caller as arrays/ints.

Speed: a super-block is held transposed (weight i of sub-block j at i*16 + j), so every loop
of the search runs across the 16 sub-blocks with a per-lane accumulator: the sums stay in
index order per sub-block, as in the reference, and the loops vectorize 16 wide.

``sym_k_encode`` flags per row: 1 the float16 super-scale overflows (the reference refuses
the tensor), 2 NaN/Inf in the row, 4 a block max at the 1e-15 all-zero threshold (the
reference decides). Any flag sends the whole tensor to the numpy reference.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .kquant_common import U, _f16_to_f32, _frexp_e, _ldexp32, _pow2  # noqa: F401  (shared helpers)


_J = dict(cache=True, nogil=True, error_model="numpy")
_P = dict(cache=True, nogil=True, parallel=True, error_model="numpy")

F0 = np.float32(0.0)
F1 = np.float32(1.0)
FM1 = np.float32(-1.0)
INF = np.float32(np.inf)
MAGIC = np.float32(12582912.0)      # 1.5 * 2**23: (v + MAGIC) - MAGIC == rint(v) for |v| < 2**22
EPS32 = np.float32(1e-15)           # common.GROUP_EPS as numpy compares it
SUB_EPS = np.float32(1e-30)         # sym_k.SUB_EPS

#: kind of ``sym_k_encode``
KINDS = {"Q3_K": 0, "Q6_K": 1}

LANES = 16
XT, WT, WX = 0, 256, 512
_R = 768
(MXS, ZR, ISC, S2, S3, BS, BA, HAA, AA, LS, CLS, SC, IV, EE, E2, PAA, PAX, DL, ISC2, T2,
 T3, CL3, E3, SC0, IV0, SC3, IV3) = [_R + 16 * k for k in range(27)]
SBUF = _R + 16 * 28


@njit(**_J)
def _rc(v, lo, hi):
    """clip(rint(v), lo, hi); NaN -> lo, -0 -> +0 (sym_k._rc)."""
    q = (v + MAGIC) - MAGIC
    q = q if q > lo else lo
    return q if q < hi else hi


@njit(**_J)
def _f16_bits(x):
    """float16 bits of float32 x, nearest even, overflow -> Inf (cpu_common._f32_to_f16_bits,
    in float64 arithmetic: every step exact but the one rint)."""
    a = abs(np.float64(x))
    sign = 0x8000 if math.copysign(1.0, x) < 0 else 0
    if a != a:
        return 0x7E00 | sign
    if a >= 65520.0:
        return 0x7C00 | sign
    if a < 6.103515625e-05:                     # 2**-14: float16 subnormals, step 2**-24
        return np.int64(np.rint(a * 16777216.0)) | sign
    m, ex = math.frexp(a)                       # a = m * 2**ex, m in [0.5, 1)
    return (((ex + 14) << 10) + np.int64(np.rint(m * 2048.0)) - 1024) | sign


@njit(**_J)
def _fp16_scale(v, e):
    """(float16 bits of v * 2**e, that float16's value * 2**-e as float32)."""
    h = _f16_bits(_ldexp32(v, e))
    return h, _ldexp32(_f16_to_f32(h), -e)


# _consider (5 call sites) and _pass (2) are not numba-inlined (inline="always" typed them at
# every site); LLVM inlines them all the same: Q3_K's first compile 43 -> 31 CPU s, same bytes.
@njit(**_J)
def _consider(S, s2, s3, nl):
    """nl: LANES, as a value LLVM cannot see (numba leaves the SLP vectorizer off: a lane
    loop of constant length is unrolled and stays scalar; of unknown length, the loop
    vectorizer takes it). No division inside a select (it would become a branch)."""
    for j in range(nl):
        sl2 = S[s2 + j]
        sxl = S[s3 + j]
        ok = sl2 > F0
        a0 = sxl / sl2
        a = a0 if ok else sxl
        score = a * sxl
        bs = S[BS + j]
        bt = ok & (score > bs)
        S[BS + j] = score if bt else bs
        S[BA + j] = a if bt else S[BA + j]
        S[HAA + j] = sl2 if bt else S[HAA + j]


@njit(**_J)
def _pass(S, lo, hi, nl):
    """S2/S3 of the codes clip(rint(x * ISC)) on all lanes."""
    for j in range(nl):
        S[U(S2 + j)] = F0
        S[U(S3 + j)] = F0
    for i in range(16):
        for j in range(nl):
            k = U(i * LANES + j)
            L = _rc(S[XT + k] * S[U(ISC + j)], lo, hi)
            S[U(S3 + j)] += S[WX + k] * L
            S[U(S2 + j)] += (S[WT + k] * L) * L


@njit(**_J)
def _pass2(S, lo, hi, weighted):
    """_pass for two candidates at once (ISC -> S2/S3, ISC2 -> T2/T3): four independent
    accumulator chains instead of two. Unweighted (w = 1): w * x == x and (w * L) * L ==
    L * L exactly, so the multiplications by w are left out."""
    for j in range(LANES):
        S[S2 + j] = F0
        S[S3 + j] = F0
        S[T2 + j] = F0
        S[T3 + j] = F0
    if not weighted:
        for i in range(16):
            for j in range(LANES):
                k = i * LANES + j
                x = S[XT + k]
                L = _rc(x * S[ISC + j], lo, hi)
                M = _rc(x * S[ISC2 + j], lo, hi)
                S[S3 + j] += x * L
                S[S2 + j] += L * L
                S[T3 + j] += x * M
                S[T2 + j] += M * M
        return
    for i in range(16):
        for j in range(LANES):
            k = i * LANES + j
            x = S[XT + k]
            w = S[WT + k]
            wx = S[WX + k]
            L = _rc(x * S[ISC + j], lo, hi)
            M = _rc(x * S[ISC2 + j], lo, hi)
            S[S3 + j] += wx * L
            S[S2 + j] += (w * L) * L
            S[T3 + j] += wx * M
            S[T2 + j] += (w * M) * M


@njit(**_J)
def _iv(sc):
    """1 / sc, 0 for sc == 0 (the division outside the select: inside it becomes a branch)."""
    r = F1 / sc
    return r if sc != F0 else F0


@njit(**_J)
def _err3(S, lo, hi, nl, weighted):
    """_sub_err for three scale codes at once (three independent chains): LS -> EE,
    CLS -> E2, CL3 -> E3, all with the super-scale DL."""
    for j in range(nl):
        d = S[U(DL + j)]
        a = d * S[U(LS + j)]
        b = d * S[U(CLS + j)]
        c = d * S[U(CL3 + j)]
        S[U(SC0 + j)] = a
        S[U(SC + j)] = b
        S[U(SC3 + j)] = c
        S[U(IV0 + j)] = _iv(a)
        S[U(IV + j)] = _iv(b)
        S[U(IV3 + j)] = _iv(c)
        S[U(EE + j)] = F0
        S[U(E2 + j)] = F0
        S[U(E3 + j)] = F0
    if not weighted:                    # w = 1: w * (r * r) == r * r
        for i in range(16):
            for j in range(LANES):
                k = i * LANES + j
                x = S[XT + k]
                r = x - S[SC0 + j] * _rc(x * S[IV0 + j], lo, hi)
                S[EE + j] += r * r
                r = x - S[SC + j] * _rc(x * S[IV + j], lo, hi)
                S[E2 + j] += r * r
                r = x - S[SC3 + j] * _rc(x * S[IV3 + j], lo, hi)
                S[E3 + j] += r * r
        return
    for i in range(16):
        for j in range(LANES):
            k = i * LANES + j
            x = S[XT + k]
            w = S[WT + k]
            r = x - S[SC0 + j] * _rc(x * S[IV0 + j], lo, hi)
            S[EE + j] += w * (r * r)
            r = x - S[SC + j] * _rc(x * S[IV + j], lo, hi)
            S[E2 + j] += w * (r * r)
            r = x - S[SC3 + j] * _rc(x * S[IV3 + j], lo, hi)
            S[E3 + j] += w * (r * r)


@njit(**_J)
def _sub_err(S, lo, hi, nl):
    """E2[j] = weighted squared error of lane j with codes re-rounded for DL * CLS."""
    for j in range(nl):
        sc = S[U(DL + j)] * S[U(CLS + j)]
        S[U(SC + j)] = sc
        S[U(IV + j)] = _iv(sc)
        S[U(E2 + j)] = F0
    for i in range(16):
        for j in range(nl):
            k = U(i * LANES + j)
            x = S[XT + k]
            L = _rc(x * S[U(IV + j)], lo, hi)
            r = x - S[U(SC + j)] * L
            S[U(E2 + j)] += S[WT + k] * (r * r)


@njit(**_J)
def _candidates(S, cands, iters, lo, hi, nl, weighted):
    """Step 1's candidate and refit passes on all lanes (in a function of its own: that way
    the pass loops vectorize fully)."""
    nc = cands.shape[0]
    for t in range(0, nc - 1, 2):
        c = cands[t]
        c2 = cands[t + 1]
        for j in range(nl):
            S[ISC + j] = c / S[MXS + j]
            S[ISC2 + j] = c2 / S[MXS + j]
        _pass2(S, lo, hi, weighted)
        _consider(S, S2, S3, nl)
        _consider(S, T2, T3, nl)
    if nc % 2:
        for j in range(nl):
            S[ISC + j] = cands[nc - 1] / S[MXS + j]
        _pass(S, lo, hi, nl)
        _consider(S, S2, S3, nl)
    for _ in range(iters):
        for j in range(nl):
            b = S[BA + j]
            r = F1 / b
            S[ISC + j] = r if b != F0 else F0
        _pass(S, lo, hi, nl)
        _consider(S, S2, S3, nl)


@njit(**_J)
def _refine(S, d, dh, e, rounds, lo, hi, slo, shi, nl, weighted):
    """Step 2b: +-1 on each sub-block scale code, then the least-squares super-scale."""
    for j in range(nl):
        q = _rc(S[U(AA + j)] / d, slo, shi)
        S[U(LS + j)] = q if d != F0 else F0
        S[U(DL + j)] = d
    for _ in range(rounds):
        # the errors of s, s - 1 and s + 1 in one pass (EE of s equals the carried one: the
        # same formula). Where s - 1 wins, the reference's next try (s - 1) + 1 is s again,
        # which cannot win: so s + 1 is tried only where s - 1 lost.
        for j in range(nl):
            S[U(CLS + j)] = _rc(S[U(LS + j)] + FM1, slo, shi)
            S[U(CL3 + j)] = _rc(S[U(LS + j)] + F1, slo, shi)
        _err3(S, lo, hi, nl, weighted)
        for j in range(nl):
            ee = S[U(EE + j)]
            e2 = S[U(E2 + j)]
            e3 = S[U(E3 + j)]
            bt = e2 < ee
            b3 = (not bt) & (e3 < ee)
            ls = S[U(LS + j)]
            S[U(LS + j)] = S[U(CLS + j)] if bt else (S[U(CL3 + j)] if b3 else ls)
            S[U(EE + j)] = e2 if bt else (e3 if b3 else ee)
        # least-squares d for the fixed codes
        for j in range(nl):
            sc = d * S[U(LS + j)]
            S[U(SC + j)] = sc
            S[U(IV + j)] = _iv(sc)
            S[U(PAA + j)] = F0
            S[U(PAX + j)] = F0
        for i in range(16):
            for j in range(nl):
                k = U(i * LANES + j)
                xv = S[XT + k]
                L = _rc(xv * S[U(IV + j)], lo, hi)
                A = S[U(LS + j)] * L
                wa = S[WT + k] * A
                S[U(PAA + j)] += wa * A
                S[U(PAX + j)] += wa * xv
        saa = F0
        sax = F0
        for j in range(LANES):
            saa += S[PAA + j]
        for j in range(LANES):
            sax += S[PAX + j]
        ok = saa > F0
        nd = sax / (saa if ok else F1)
        nh, nd_ = _fp16_scale(nd if ok else F0, e)
        ok = ok and (nh & 0x7C00) != 0x7C00 and nd_ != F0
        if not ok:
            continue
        for j in range(LANES):
            S[DL + j] = nd_
            S[CLS + j] = S[LS + j]
        _sub_err(S, lo, hi, nl)
        e1 = F0
        e2 = F0
        for j in range(LANES):
            e1 += S[EE + j]
        for j in range(LANES):
            e2 += S[E2 + j]
        if e2 < e1:
            d = nd_
            dh = nh
            for j in range(LANES):
                S[EE + j] = S[E2 + j]
        else:
            for j in range(LANES):
                S[DL + j] = d
    return d, dh


NOPE = -100000        # _prep: the block max is at the all-zero threshold (flag 4)


@njit(**_J)
def _prep(S, x, q, weighted, nl):
    """Normalize and transpose a super-block into S, find each lane's largest weight;
    returns the exponent e (NOPE: the reference decides). nl: see _consider; U(...): unsigned
    indices (no wraparound select), so that the loop vectorizer takes the lane loops."""
    # ---- normalize (common.pow2_normalize)
    # transpose first; the block max is the max of the lane maxima (the same value)
    for i in range(16):
        for j in range(nl):
            S[U(XT + i * LANES + j)] = x[U(j * 16 + i)]
    if weighted:
        for i in range(16):
            for j in range(nl):
                S[U(WT + i * LANES + j)] = q[U(j * 16 + i)]
    else:
        for k in range(256):
            S[WT + k] = F1
    for j in range(nl):
        S[U(PAX + j)] = F0
    for i in range(16):
        for j in range(nl):
            a = abs(S[U(XT + i * LANES + j)])
            b = S[U(PAX + j)]
            S[U(PAX + j)] = a if a > b else b
    amax = F0
    for j in range(LANES):
        amax = S[PAX + j] if S[PAX + j] > amax else amax
    tiny32 = amax < EPS32
    if tiny32 != (np.float64(amax) < 1e-15):
        return NOPE
    e = 0 if tiny32 else _frexp_e(amax)
    p = F0 if tiny32 else np.float32(_pow2(-e))
    if tiny32:
        for k in range(256):
            S[XT + k] = F0
    else:
        for k in range(256):
            S[XT + k] = S[XT + k] * p
    if weighted:
        for j in range(nl):
            S[U(PAA + j)] = F0
        for i in range(16):
            for j in range(nl):
                S[U(PAA + j)] += S[U(WT + i * LANES + j)]
        for i in range(16):
            for j in range(nl):
                k = U(WT + i * LANES + j)
                w = S[k]
                S[k] = w if S[U(PAA + j)] > F0 else F1
    for k in range(256):
        S[WX + k] = S[WT + k] * S[XT + k]
    # ---- step 1 (sym_k.sub_search)
    for j in range(nl):
        S[U(MXS + j)] = S[U(XT + j)]
        S[U(PAX + j)] = abs(S[U(XT + j)])
    for i in range(1, 16):
        for j in range(nl):
            v = S[U(XT + i * LANES + j)]
            a = abs(v)
            m = S[U(MXS + j)]
            b = S[U(PAX + j)]
            bt = a > b
            S[U(MXS + j)] = v if bt else m
            S[U(PAX + j)] = a if bt else b
    for j in range(nl):
        z = not (S[U(PAX + j)] >= SUB_EPS)
        S[U(ZR + j)] = F1 if z else F0
        m = S[U(MXS + j)]
        S[U(MXS + j)] = F1 if z else m
        S[U(BS + j)] = FM1
        S[U(BA + j)] = F0
        S[U(HAA + j)] = F0
    return e


@njit(**_J)
def _final(S, d, lo, hi, codes, nl):
    """The weight codes for the stored scales."""
    for j in range(nl):
        S[U(IV + j)] = _iv(d * S[U(LS + j)])
    for i in range(16):
        for j in range(LANES):
            codes[j * 16 + i] = _rc(S[XT + i * LANES + j] * S[IV + j], lo, hi)


@njit(**_J)
def _block(S, x, q, weighted, nmax, levels, cands, divs, iters, rounds, codes, gi, nl):
    """Search one super-block x (256 float32; q its importance). Returns the flag; gi[0]
    the float16 bits of d; S[LS + j] the sub-block codes, codes[256] the weight codes."""
    lo = np.float32(-nmax)
    hi = np.float32(nmax - 1)
    slo = np.float32(-levels)
    shi = np.float32(levels - 1)
    flag = 0
    e = _prep(S, x, q, weighted, nl)
    if e == NOPE:
        return 4
    _candidates(S, cands, iters, lo, hi, nl, weighted)
    for j in range(LANES):
        z = S[ZR + j] != F0
        S[AA + j] = F0 if z else S[BA + j]
        S[HAA + j] = F0 if z else S[HAA + j]
    # ---- step 2 (sym_k.super_search): (a) screening
    top = S[AA]
    ta = abs(top)
    for j in range(1, LANES):
        a = abs(S[AA + j])
        if a > ta:
            ta = a
            top = S[AA + j]
    best_p = INF
    dh = 0x7C00
    d = F0
    for k in range(divs.shape[0]):
        ch, c = _fp16_scale(top / (-divs[k]), e)
        for j in range(nl):                     # the terms across lanes, then their sum in order
            a = S[U(AA + j)]
            q = _rc(a / c, slo, shi)
            s = q if c != F0 else F0
            da = c * s - a
            S[U(PAA + j)] = S[U(HAA + j)] * (da * da)
        P = F0
        for j in range(LANES):
            P += S[PAA + j]
        if (ch & 0x7C00) != 0x7C00 and P < best_p:
            best_p = P
            dh = ch
            d = c
    if not best_p < INF:
        return 1
    # (b) refinement
    d, dh = _refine(S, d, dh, e, rounds, lo, hi, slo, shi, nl, weighted)
    _final(S, d, lo, hi, codes, nl)
    gi[0] = dh
    return flag


@njit(**_J)
def _put16(dst, p, h):
    dst[p] = np.uint8(h & 255)
    dst[p + 1] = np.uint8((h >> 8) & 255)


@njit(**_J)
def _pack(kind, codes, S, dh, dst):
    if kind == 0:                       # Q3_K: hmask[32] qs[64] scales[12] d
        for l in range(32):
            v = 0
            for b in range(8):
                v |= ((np.int64(codes[b * 32 + l]) + 4) >> 2 & 1) << b
            dst[l] = np.uint8(v)
        for h in range(2):
            for l in range(32):
                v = 0
                for s in range(4):
                    v |= ((np.int64(codes[h * 128 + s * 32 + l]) + 4) & 3) << (2 * s)
                dst[32 + h * 32 + l] = np.uint8(v)
        for j in range(8):
            a = np.int64(S[LS + j]) + 32
            b = np.int64(S[LS + j + 8]) + 32
            dst[96 + j] = np.uint8((a & 15) | ((b & 15) << 4))
        for k in range(4):
            v = 0
            for g in range(4):
                v |= ((np.int64(S[LS + 4 * g + k]) + 32) >> 4 & 3) << (2 * g)
            dst[104 + k] = np.uint8(v)
        _put16(dst, 108, dh)
        return
    # Q6_K: ql[128] qh[64] scales[16] d
    for hh in range(2):
        for l in range(32):
            b = hh * 128 + l
            c0 = np.int64(codes[b]) + 32
            c1 = np.int64(codes[b + 32]) + 32
            c2 = np.int64(codes[b + 64]) + 32
            c3 = np.int64(codes[b + 96]) + 32
            dst[hh * 64 + l] = np.uint8((c0 & 15) | ((c2 & 15) << 4))
            dst[hh * 64 + 32 + l] = np.uint8((c1 & 15) | ((c3 & 15) << 4))
            dst[128 + hh * 32 + l] = np.uint8((c0 >> 4) | ((c1 >> 4) << 2) | ((c2 >> 4) << 4)
                                              | ((c3 >> 4) << 6))
    for j in range(16):
        dst[192 + j] = np.uint8(np.int64(S[LS + j]) & 255)
    _put16(dst, 208, dh)


@njit(**_P)
def sym_k_encode(w, qw, weighted, kind, cands, divs, iters, rounds, blocks, flags):
    """Q3_K (kind 0) or Q6_K (kind 1) blocks of w (rows, cols % 256 == 0).

    qw: importance (rows or 1, cols) when `weighted` (row r of w uses qw's row r, or row 0),
    finite and >= 0. blocks: uint8 (rows, cols/256 * bytes per block). flags: uint8 (rows,),
    see the module docstring."""
    rows, cols = w.shape
    nbk = cols // 256
    wi = w.view(np.uint32)
    if kind == 0:
        nmax, levels, bpb = 4, 32, 110
    else:
        nmax, levels, bpb = 32, 128, 210
    nch = min(rows, 256)
    nl = min(cols >> 4, LANES)          # LANES wherever a block is searched (see _consider)
    for ch in prange(nch):
        S = np.zeros(SBUF, np.float32)
        gi = np.zeros(2, np.int64)
        codes = np.zeros(256, np.float32)
        for r in range(ch * rows // nch, (ch + 1) * rows // nch):
            row = w[r]
            bits = wi[r]
            nf = 0
            for c in range(cols):               # NaN/Inf: exponent bits all set (vectorizes)
                nf |= np.int64((bits[c] & 0x7F800000) == 0x7F800000)
            f = 2 if nf else 0
            if f == 0:
                for b in range(nbk):
                    xa = row[b * 256:(b + 1) * 256]
                    qa = qw[r if qw.shape[0] > 1 else 0, b * 256:(b + 1) * 256] if weighted else xa
                    fb = _block(S, xa, qa, weighted, nmax, levels, cands, divs, iters, rounds,
                                codes, gi, nl)
                    if fb:
                        f |= fb
                        break
                    _pack(kind, codes, S, gi[0], blocks[r, b * bpb:(b + 1) * bpb])
            flags[r] = f

"""The Q2_K/Q4_K/Q5_K search of ``kquant_affine``: one super-block (Q2_K) or two (Q4_K/Q5_K)
held transposed in a per-thread scratch buffer, sub-block (scale, min) by least squares over
candidate steps, then the float16 super-scales (screened divisors, refinement rounds) and the
weight codes -- ``workbench.schemes.ggml.affine_k``'s sub_search and super_search, bit for
bit. Imports nothing from ``workbench``."""

from __future__ import annotations

import numpy as np
from numba import njit

from .kquant_common import (_J, EPS32, F0, F1, F2, INF, MAGIC, U, _fp16_scale, _frexp_e, _pow2,
                            _rc)


# ---------------------------------------------------------------- the lane scratch buffer
# One float32 buffer per thread: 16 lanes (sub-blocks: one Q2_K super-block, or two Q4_K/Q5_K
# super-blocks) of up to 32 weights, stored transposed (weight i of lane j at i*16 + j), and
# per-lane rows of 16. Constant offsets into one buffer let LLVM prove the loops independent
# and vectorize them 16 wide.
LANES = 16
XT, WT, XS, XH = 0, 512, 1024, 1536
_R = 2048
(LO, HI, RNG, SW, SX, SXX, BA, BB, BE, ISC, S1, S2, S3, T1, T2, T3, AA, MM, LS, LM, EE, E2,
 CD, CDM, CLS, CLM, SC, MO, IV, PAA, PAB, PAX, PBB, PBX, OLS, OLM, DL, DML, WS, HAA, HAB) = \
    [_R + 16 * k for k in range(41)]
_Q = _R + 16 * 42
QD, QT, CT = _Q, _Q + 256, _Q + 512        # 16 x 16 screening rows; 32 x 16 final codes
QP, QMD, QOK, PDA, PT1, PH2 = [_Q + 1024 + 32 * k for k in range(6)]
SBUF = _Q + 1024 + 32 * 6
NDIV = 16                           # super-scale divisors screened (affine_k.NDIV)


@njit(**_J)
def _consider(S, s1, s2, s3, nl):
    """affine_k.sub_search's consider() on all lanes (branch-free; nl: see _screen_sums)."""
    for j in range(nl):
        sl = S[s1 + j]
        sl2 = S[s2 + j]
        sxl = S[s3 + j]
        sw = S[SW + j]
        sx = S[SX + j]
        D = sw * sl2 - sl * sl
        Ds = D if D > F0 else F1
        a = (sw * sxl - sx * sl) / Ds
        b = (sl2 * sx - sl * sxl) / Ds
        pos = b > F0
        s2s = sl2 if sl2 > F0 else F1
        a0 = sxl / s2s
        a = a0 if pos else a
        b = F0 if pos else b
        err = (S[SXX + j] - F2 * a * sxl - F2 * b * sx + a * a * sl2 + F2 * a * b * sl
               + b * b * sw)
        ok = (D > F0) & (a > F0) & (err < S[BE + j])
        S[BE + j] = err if ok else S[BE + j]
        S[BA + j] = a if ok else S[BA + j]
        S[BB + j] = b if ok else S[BB + j]
        S[HAA + j] = sl2 if ok else S[HAA + j]
        S[HAB + j] = sl if ok else S[HAB + j]


@njit(**_J)
def _screen_sums(S, ns, nl):
    """QP[mv] = sum over the sub-blocks jl of the error model for dmin candidate mv. nl:
    LANES (= NDIV) as a value LLVM cannot see, and unsigned indices (no wraparound
    select): numba leaves the SLP vectorizer off, so only a loop of unknown length whose
    addresses are affine gets vectorized (a constant 16 is unrolled and stays scalar)."""
    for mv in range(nl):
        S[U(QP + mv)] = F0
    for jl in range(16):
        if jl < ns:
            t1 = S[PT1 + jl]
            h2 = S[PH2 + jl]
            da = S[PDA + jl]
            for mv in range(nl):
                S[U(QP + mv)] += ((t1 - h2 * (da * S[U(QD + jl * NDIV + mv)]))
                                  + S[U(QT + jl * NDIV + mv)])


@njit(**_J)
def _lane_steps(S, d, ls, dm, lm):
    """Per lane j: SC = step d*ls, MO = offset dm*lm, IV = 1/SC (1 where SC <= 0), for
    _lane_code; d, ls, dm, lm: offsets of lane rows in S."""
    for j in range(LANES):
        s = S[d + j] * S[ls + j]
        S[SC + j] = s
        S[MO + j] = S[dm + j] * S[lm + j]
        r = F1 / s                  # no division inside a select: it would become a branch
        S[IV + j] = r if s > F0 else F1


@njit(**_J)
def _lane_code(S, x, j, fnmax):
    """The code of weight x (normalized) in lane j for _lane_steps' step and offset."""
    L = _rc((x + S[MO + j]) * S[IV + j], fnmax)
    return L if S[SC + j] > F0 else F0


@njit(**_J)
def _sub_err(S, n, fnmax):
    """E2[j] = weighted squared error of lane j with its codes re-rounded for the stored
    (CD*CLS, CDM*CLM)."""
    _lane_steps(S, CD, CLS, CDM, CLM)
    for j in range(LANES):
        S[E2 + j] = F0
    for i in range(n):
        for j in range(LANES):
            x = S[XT + i * LANES + j]
            L = _lane_code(S, x, j, fnmax)
            r = x - (S[SC + j] * L - S[MO + j])
            S[E2 + j] += S[WT + i * LANES + j] * (r * r)


# Not inline="always": numba's own IR inlining of this body into _group16 and _group32 cost
# 2/3 of affine_k_encode's compile (153 -> 87 CPU s without it); LLVM still inlines and
# specializes it at the two call sites (same bytes, same speed: docs/kernels.md). Nor are its
# helpers _consider, _lane_steps, _lane_code and _sub_err (3-7 call sites each, typed at every
# one when numba inlined them): Q4_K's first compile 128 -> 103 CPU s, the same bytes and speed.
@njit(**_J)
def _group(S, G, xa, xb, qa, qb, weighted, nmax, n, ns, levels, cands, divs, iters, rounds,
           gi, gf, codes, QMH, nl):
    """Search G super-blocks (xa, xb: 256 float32 each; qa/qb their importance) together.
    Per group g: gi[g] flag, gi[2+g] / gi[4+g] d / dmin float16 bits; codes[g*256 + k] the
    weight codes, S[OLS/OLM + g*ns + j] the sub-block codes."""
    fnmax = np.float32(nmax)
    flev = np.float32(levels)
    # ---- normalize (common.pow2_normalize), lanes g*ns .. g*ns+ns-1
    for g in range(G):
        x = xa if g == 0 else xb
        qr = qa if g == 0 else qb
        gi[g] = 0
        amax = F0
        for k in range(256):
            a = abs(x[k])
            amax = a if a > amax else amax
        tiny32 = amax < EPS32
        if tiny32 != (np.float64(amax) < 1e-15):
            gi[g] = 4
        e = 0 if tiny32 else _frexp_e(amax)
        gi[6 + g] = e
        p = F0 if tiny32 else np.float32(_pow2(-e))
        for jl in range(ns):
            j = g * ns + jl
            for i in range(n):
                v = x[jl * n + i] * p
                S[XT + i * LANES + j] = v if not tiny32 else F0
                S[WT + i * LANES + j] = qr[jl * n + i] if weighted else F1
    if weighted:
        for j in range(LANES):
            S[WS + j] = F0
        for i in range(n):
            for j in range(LANES):
                S[WS + j] += S[WT + i * LANES + j]
        for i in range(n):
            for j in range(LANES):
                k = WT + i * LANES + j
                S[k] = S[k] if S[WS + j] > F0 else F1
    # ---- step 1 (affine_k.sub_search)
    for j in range(LANES):
        S[LO + j] = F0
        S[HI + j] = S[XT + j]
        S[SW + j] = F0
        S[SX + j] = F0
        S[SXX + j] = F0
    for i in range(n):
        for j in range(LANES):
            v = S[XT + i * LANES + j]
            lo = S[LO + j]
            hi = S[HI + j]
            S[LO + j] = v if v < lo else lo
            S[HI + j] = v if v > hi else hi
            ww = S[WT + i * LANES + j]
            wx = ww * v
            S[SW + j] += ww
            S[SX + j] += wx
            S[SXX + j] += wx * v
    for j in range(LANES):
        r = S[HI + j] - S[LO + j]
        rs = r if r > F0 else F1
        S[RNG + j] = rs
        S[BE + j] = INF
        S[HAA + j] = F0
        S[HAB + j] = F0
        S[BA + j] = rs / fnmax
        S[BB + j] = S[LO + j]
    for i in range(n):
        for j in range(LANES):
            S[XS + i * LANES + j] = S[XT + i * LANES + j] - S[LO + j]
            S[XH + i * LANES + j] = S[HI + j] - S[XT + i * LANES + j]
    for c in cands:
        for j in range(LANES):
            S[ISC + j] = c / S[RNG + j]
            S[S1 + j] = F0
            S[S2 + j] = F0
            S[S3 + j] = F0
            S[T1 + j] = F0
            S[T2 + j] = F0
            S[T3 + j] = F0
        for i in range(n):
            for j in range(LANES):
                k = i * LANES + j
                ww = S[WT + k]
                v = S[XT + k]
                isc = S[ISC + j]
                L = _rc(S[XS + k] * isc, fnmax)
                wl = ww * L
                S[S1 + j] += wl
                S[S2 + j] += wl * L
                S[S3 + j] += wl * v
                L = fnmax - ((S[XH + k] * isc + MAGIC) - MAGIC)
                L = L if L > F0 else F0
                L = L if L < fnmax else fnmax
                wl = ww * L
                S[T1 + j] += wl
                S[T2 + j] += wl * L
                S[T3 + j] += wl * v
        _consider(S, S1, S2, S3, nl)
        _consider(S, T1, T2, T3, nl)
    for _ in range(iters):
        for j in range(LANES):
            S[ISC + j] = F1 / S[BA + j]
            S[S1 + j] = F0
            S[S2 + j] = F0
            S[S3 + j] = F0
        for i in range(n):
            for j in range(LANES):
                k = i * LANES + j
                ww = S[WT + k]
                v = S[XT + k]
                L = _rc((v - S[BB + j]) * S[ISC + j], fnmax)
                wl = ww * L
                S[S1 + j] += wl
                S[S2 + j] += wl * L
                S[S3 + j] += wl * v
        _consider(S, S1, S2, S3, nl)
    for j in range(LANES):
        flat = not (S[HI + j] - S[LO + j] > F0)
        S[AA + j] = F0 if flat else S[BA + j]
        S[MM + j] = F0 - (S[LO + j] if flat else S[BB + j])
        S[HAA + j] = F0 if flat else S[HAA + j]
        S[HAB + j] = F0 if flat else S[HAB + j]
    # ---- step 2 (affine_k.super_search); per group scalars:
    # gf[0+g] amax, [2+g] mmax, [4+g] best P, [6+g] new d, [8+g] new dm
    # gi[2+g] / gi[4+g] the chosen d / dmin float16 bits, [8+g]/[10+g] chosen divisor indices,
    # [12+g] new d bits (-1: no refit), [14+g] new dmin bits
    for g in range(G):
        amax = F0
        mmax = F0
        for jl in range(ns):
            j = g * ns + jl
            amax = S[AA + j] if S[AA + j] > amax else amax
            mmax = S[MM + j] if S[MM + j] > mmax else mmax
        gf[g] = amax
        gf[2 + g] = mmax
        gf[4 + g] = INF
        gi[2 + g] = 0x7C00
        gi[4 + g] = 0x7C00
        e = gi[6 + g]
        # (a) screening: the dmin candidates first (divisors mv in the lanes), then each d.
        # QD/QT: per sub-block jl a row of the 16 dmin candidates; QP the 16 sums for one d.
        for mv in range(NDIV):
            mh, dm = _fp16_scale(mmax / divs[mv], e)
            QMH[g * NDIV + mv] = mh
            S[QMD + g * NDIV + mv] = dm
            S[QOK + mv] = F1 if (mh & 0x7C00) != 0x7C00 else F0
        for jl in range(ns):
            j = g * ns + jl
            mj = S[MM + j]
            swj = S[SW + j]
            for mv in range(NDIV):
                dm = S[QMD + g * NDIV + mv]
                q = mj / dm
                lm = _rc(q if dm > F0 else mj, flev)
                lm = lm if dm > F0 else F0
                dmm = dm * lm - mj
                S[QD + jl * NDIV + mv] = dmm
                S[QT + jl * NDIV + mv] = swj * (dmm * dmm)
        for dv in range(NDIV):
            dh, d = _fp16_scale(amax / divs[dv], e)
            if (dh & 0x7C00) == 0x7C00:
                continue
            ds = d if d > F0 else F1
            for jl in range(ns):
                a_ = S[AA + g * ns + jl]
                ls = _rc(a_ / ds, flev)
                ls = ls if d > F0 else F0
                da = d * ls - a_
                S[PDA + jl] = da
                S[PT1 + jl] = S[HAA + g * ns + jl] * (da * da)
                S[PH2 + jl] = F2 * S[HAB + g * ns + jl]
            _screen_sums(S, ns, nl)
            bp = gf[4 + g]
            anyb = 0
            for mv in range(NDIV):
                anyb |= np.int64((S[QOK + mv] != F0) & (S[QP + mv] < bp))
            if anyb == 0:
                continue
            for mv in range(NDIV):             # in order: the first of the least wins
                if S[QOK + mv] != F0 and S[QP + mv] < gf[4 + g]:
                    gf[4 + g] = S[QP + mv]
                    gi[2 + g] = dh
                    gi[4 + g] = QMH[g * NDIV + mv]
                    gi[8 + g] = dv
                    gi[10 + g] = mv
        if gf[4 + g] < INF:
            dh, d = _fp16_scale(amax / divs[gi[8 + g]], e)
            dm = S[QMD + g * NDIV + gi[10 + g]]
        else:
            d = F0
            dm = F0
        for jl in range(ns):
            j = g * ns + jl
            S[DL + j] = d
            S[DML + j] = dm
    # (b) refinement of the chosen pair, all lanes at once
    for j in range(LANES):
        d = S[DL + j]
        dm = S[DML + j]
        qa = S[AA + j] / d
        qm = S[MM + j] / dm
        ls = _rc(qa if d > F0 else S[AA + j], flev)
        lm = _rc(qm if dm > F0 else S[MM + j], flev)
        S[LS + j] = ls if d > F0 else F0
        S[LM + j] = lm if dm > F0 else F0
        S[CD + j] = d
        S[CDM + j] = dm
        S[CLS + j] = S[LS + j]
        S[CLM + j] = S[LM + j]
    _sub_err(S, n, fnmax)
    for j in range(LANES):
        S[EE + j] = S[E2 + j]
    for _ in range(rounds):
        for j in range(LANES):
            S[CD + j] = S[DL + j]
            S[CDM + j] = S[DML + j]
        for da in range(-1, 2):
            for db in range(-1, 2):
                if da == 0 and db == 0:
                    continue
                fa = np.float32(da)
                fb = np.float32(db)
                for j in range(LANES):
                    u = S[LS + j] + fa
                    u = u if u > F0 else F0
                    S[CLS + j] = u if u < flev else flev
                    u = S[LM + j] + fb
                    u = u if u > F0 else F0
                    S[CLM + j] = u if u < flev else flev
                _sub_err(S, n, fnmax)
                for j in range(LANES):
                    bt = S[E2 + j] < S[EE + j]
                    S[EE + j] = S[E2 + j] if bt else S[EE + j]
                    S[LS + j] = S[CLS + j] if bt else S[LS + j]
                    S[LM + j] = S[CLM + j] if bt else S[LM + j]
        # least-squares (d, dmin) for the fixed codes, per group
        _lane_steps(S, DL, LS, DML, LM)
        for j in range(LANES):
            S[PAA + j] = F0
            S[PAB + j] = F0
            S[PAX + j] = F0
            S[PBB + j] = F0
            S[PBX + j] = F0
        for i in range(n):
            for j in range(LANES):
                k = i * LANES + j
                v = S[XT + k]
                L = _lane_code(S, v, j, fnmax)
                a_ = S[LS + j] * L
                b_ = S[LM + j]
                wa = S[WT + k] * a_
                wb = S[WT + k] * b_
                S[PAA + j] += wa * a_
                S[PAB + j] += wa * b_
                S[PAX + j] += wa * v
                S[PBB + j] += wb * b_
                S[PBX + j] += wb * v
        anyok = False
        for g in range(G):
            saa = F0
            sab = F0
            sax = F0
            sbb = F0
            sbx = F0
            for jl in range(ns):
                j = g * ns + jl
                saa += S[PAA + j]
                sab += S[PAB + j]
                sax += S[PAX + j]
                sbb += S[PBB + j]
                sbx += S[PBX + j]
            det = saa * sbb - sab * sab
            ok = det > F0
            dets = det if ok else F1
            nd = (sax * sbb - sab * sbx) / dets
            ndm = (sab * sax - saa * sbx) / dets
            ndm = ndm if ndm > F0 else F0
            ok = ok and nd > F0 and gf[4 + g] < INF
            ndh, nd_ = _fp16_scale(nd if ok else F0, gi[6 + g])
            nmh, ndm_ = _fp16_scale(ndm, gi[6 + g])
            ok = ok and (ndh & 0x7C00) != 0x7C00 and (nmh & 0x7C00) != 0x7C00
            gi[12 + g] = ndh if ok else -1
            gi[14 + g] = nmh
            anyok = anyok or ok
            for jl in range(ns):
                j = g * ns + jl
                S[CD + j] = nd_
                S[CDM + j] = ndm_
                S[CLS + j] = S[LS + j]
                S[CLM + j] = S[LM + j]
        if not anyok:
            continue
        _sub_err(S, n, fnmax)
        for g in range(G):
            if gi[12 + g] < 0:
                continue
            e1 = F0
            e2 = F0
            for jl in range(ns):
                j = g * ns + jl
                e1 += S[EE + j]
                e2 += S[E2 + j]
            if e2 < e1:
                gi[2 + g] = gi[12 + g]
                gi[4 + g] = gi[14 + g]
                for jl in range(ns):
                    j = g * ns + jl
                    S[EE + j] = S[E2 + j]
                    S[DL + j] = S[CD + j]
                    S[DML + j] = S[CDM + j]
    # the weight codes for the stored values, all lanes at once (CT, transposed), then out
    _lane_steps(S, DL, LS, DML, LM)
    for i in range(n):
        for j in range(LANES):
            S[CT + i * LANES + j] = _lane_code(S, S[XT + i * LANES + j], j, fnmax)
    for g in range(G):
        if not gf[4 + g] < INF:
            gi[g] |= 1
            continue
        for jl in range(ns):
            j = g * ns + jl
            S[OLS + j] = S[LS + j]
            S[OLM + j] = S[LM + j]
            for i in range(n):
                codes[g * 256 + jl * n + i] = S[CT + i * LANES + j]


@njit(**_J)
def _group16(S, xa, qa, weighted, cands, divs, iters, rounds, gi, gf, codes, QMH, nl):
    """Q2_K: one super-block of 16 sub-blocks of 16 (constant loop bounds: they vectorize)."""
    _group(S, 1, xa, xa, qa, qa, weighted, 3, 16, 16, 15, cands, divs, iters, rounds, gi, gf,
           codes, QMH, nl)


@njit(**_J)
def _group32(S, xa, xb, qa, qb, weighted, nmax, cands, divs, iters, rounds, gi, gf, codes,
             QMH, nl):
    """Q4_K/Q5_K: two super-blocks of 8 sub-blocks of 32."""
    _group(S, 2, xa, xb, qa, qb, weighted, nmax, 32, 8, 63, cands, divs, iters, rounds, gi, gf,
           codes, QMH, nl)


"""The Q2_K / Q4_K / Q5_K quantizer: a searched scale/min per sub-block, then a search on the
stored (6- or 4-bit) sub-block codes and the float16 super-scales themselves.

    w = d * ls_j * q - dmin * lm_j        (sub-block j, q in 0..nmax, ls/lm in 0..S)

The objective is the (importance-)weighted squared error sum_i w_i (x_i - y_i)^2 of the
weights as llama.cpp will decode them: w_i = 1 without an imatrix (plain squared error), w_i =
qw_i (the per-input-channel E[x^2] of an imatrix: the diagonal of the layer-output error)
with one. The search, float32 throughout, every sum taken in index order (so that
kernels/kquant_affine.py reproduces it bit for bit):

1. Per sub-block (n weights): candidate steps iscale = c / (max - min(min, 0)) for the
   candidate list `cands`; for each, the codes are rounded twice, anchored at the low end
   (q = rint((x - lo) * iscale)) and at the high end (q = nmax - rint((hi - x) * iscale)).
   For each code assignment the weighted least-squares (scale, min) is solved in closed form
   (min clamped to <= 0: the format stores -min >= 0) and its error is evaluated in closed
   form; the best wins. Then `iters` alternating rounds re-round the codes with the winner's
   scale/min and refit.
2. Per super-block: (a) screening: every pair of divisors (dv, mv) from `divs` (16 each)
   gives d = float16(max scale / dv), dmin = float16(max min / mv) (as stored) and the
   sub-block codes ls = rint(scale / d), lm = rint(min / dmin); the pair is scored by the
   exact quadratic error model of each sub-block's winning codes (haa da^2 - 2 hab da dm +
   sw dm^2, da = d ls - scale, dm = dmin lm - min), no pass over the weights; the least
   wins. (b) `rounds` times: each sub-block tries the 8 neighbours (ls+-1, lm+-1) of its code
   pair, the weights re-rounded for each against the *stored* values, keeping the pair of
   least error; then the weighted least-squares (d, dmin) for the fixed integer codes is
   solved over the whole super-block, rounded to float16, and kept when the re-rounded
   super-block error drops.

llama.cpp (make_qkx2_quants) tries one anchoring with a heuristic weighting, fits each
candidate, then rounds the winning float scales to the 6-bit grid once.

Inputs are normalized per super-block by a power of two (common.pow2_normalize), so the
search is free of float32 overflow/underflow; the float16 rounding is done on the
denormalized values.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.schemes.ggml.common import denormalize, pow2_normalize, renormalize, to_fp16

F = np.float32
INF = F(np.inf)


@dataclass(frozen=True)
class AffineKParams:
    nmax: int               # weight codes 0..nmax
    n: int                  # weights per sub-block
    levels: int             # sub-block scale/min codes 0..levels
    cands: tuple            # candidate step numerators (float32 values)
    iters: int              # alternating re-round + refit rounds after the candidates
    divs: tuple             # super-scale divisors tried (d = max scale / div)
    rounds: int             # neighbour search + super-scale refit rounds

    @property
    def ns(self) -> int:
        return 256 // self.n

    def cand_array(self) -> np.ndarray:
        return np.array(self.cands, F)

    def div_array(self) -> np.ndarray:
        return np.array(self.divs, F)

    def layout(self) -> dict:
        """The parameters as plain data, for the kernel layer (kernels.spec)."""
        return {"cands": list(self.cands), "divs": list(self.divs), "iters": self.iters,
                "rounds": self.rounds}


def _grid(nmax, rmin, rdelta, nstep):
    return tuple(float(F(nmax + rmin + rdelta * k)) for k in range(nstep + 1))


def _divs(levels):
    return tuple(levels - 0.5 * t for t in range(NDIV))


#: super-scale divisors screened, for d and for dmin each (the kernel's loops assume 16)
NDIV = 16
# Every other step of the 0.1 grid, and for Q2_K/Q5_K one refit and one neighbour round: on
# MiniLM's FFN-down weights the full grid with 3 refits / 2 rounds moved the error ratio to
# ggml by <= 0.003 (plain and imatrix-weighted) at up to 1.3x the time: Q2_K 0.8605 -> 0.8614
# (weighted 0.942 -> 0.945), Q4_K 0.9682 -> 0.9686 (0.9655 -> 0.9659), Q5_K 0.9447 -> 0.9468
# (0.9387 -> 0.9416).
Q2_K_PARAMS = AffineKParams(3, 16, 15, _grid(3, -0.5, 0.1, 15)[::2], 1, _divs(15), 1)
Q4_K_PARAMS = AffineKParams(15, 32, 63, _grid(15, -1.0, 0.1, 20)[::2], 3, _divs(63), 2)
Q5_K_PARAMS = AffineKParams(31, 32, 63, _grid(31, -0.5, 0.1, 15)[::2], 1, _divs(63), 1)

#: the neighbour order of step 2a (ls offset, lm offset)
NEIGHBOURS = tuple((a, b) for a in (-1, 0, 1) for b in (-1, 0, 1) if (a, b) != (0, 0))


def _clip(q, hi):
    """clip(q, 0, hi) with NaN -> 0 and -0 -> +0 (what the kernels' compare-and-select gives)."""
    return np.fmin(np.fmax(q, F(0)), F(hi)) + F(0)


def _seqsum(p: np.ndarray) -> np.ndarray:
    """Sum over the last axis in index order, starting from +0 (float32)."""
    acc = np.zeros(p.shape[:-1], F)
    for i in range(p.shape[-1]):
        acc = acc + p[..., i]
    return acc


def _seqmin0(v: np.ndarray) -> np.ndarray:
    """min(0, v...) over the last axis (v < acc replaces; never -0)."""
    acc = np.zeros(v.shape[:-1], F)
    for i in range(v.shape[-1]):
        acc = np.where(v[..., i] < acc, v[..., i], acc)
    return acc


def _seqmax(v: np.ndarray) -> np.ndarray:
    """max over the last axis, first element first (v > acc replaces)."""
    acc = v[..., 0].copy()
    for i in range(1, v.shape[-1]):
        acc = np.where(v[..., i] > acc, v[..., i], acc)
    return acc


def _seqmax0(v: np.ndarray) -> np.ndarray:
    """max(0, v...) over the last axis (v > acc replaces; never -0)."""
    acc = np.zeros(v.shape[:-1], F)
    for i in range(v.shape[-1]):
        acc = np.where(v[..., i] > acc, v[..., i], acc)
    return acc


# ------------------------------------------------------------------ step 1: sub-blocks
def sub_search(x: np.ndarray, w: np.ndarray, p: AffineKParams):
    """x, w float32 (B, n) -> (scale >= 0, min >= 0, haa, hab, sw) float32 (B,): x ~ scale *
    q - min; haa = sum w q^2, hab = sum w q of the winning codes q (0 for a constant
    sub-block), sw = sum w: the error of other (scale, min) for these codes is the winner's
    plus haa da^2 - 2 hab da dm + sw dm^2 (da, dm: the scale and min changes)."""
    nmax = p.nmax
    lo = _seqmin0(x)
    hi = _seqmax(x)
    rng = hi - lo
    flat = ~(rng > 0)
    rng_s = np.where(flat, F(1), rng)
    xs = x - lo[:, None]
    xh = hi[:, None] - x
    wx = w * x
    sw = _seqsum(w)
    sx = _seqsum(wx)
    sxx = _seqsum(wx * x)
    best_err = np.full(x.shape[0], INF)
    best_a = rng_s / F(nmax)
    best_b = lo.copy()
    haa = np.zeros(x.shape[0], F)
    hab = np.zeros(x.shape[0], F)

    def consider(L):
        nonlocal best_err, best_a, best_b, haa, hab
        wl = w * L
        sl = _seqsum(wl)
        sl2 = _seqsum(wl * L)
        sxl = _seqsum(wl * x)
        D = sw * sl2 - sl * sl
        ok = D > 0
        Ds = np.where(ok, D, F(1))
        a = (sw * sxl - sx * sl) / Ds
        b = (sl2 * sx - sl * sxl) / Ds
        pos = b > 0
        a = np.where(pos, sxl / np.where(sl2 > 0, sl2, F(1)), a)
        b = np.where(pos, F(0), b)
        ok &= a > 0
        err = sxx - F(2) * a * sxl - F(2) * b * sx + a * a * sl2 + F(2) * a * b * sl + b * b * sw
        better = ok & (err < best_err)
        best_err = np.where(better, err, best_err)
        best_a = np.where(better, a, best_a)
        best_b = np.where(better, b, best_b)
        haa = np.where(better, sl2, haa)
        hab = np.where(better, sl, hab)

    for c in p.cand_array():
        iscale = c / rng_s
        consider(_clip(np.rint(xs * iscale[:, None]), nmax))
        consider(_clip(F(nmax) - np.rint(xh * iscale[:, None]), nmax))
    for _ in range(p.iters):
        inv = F(1) / best_a
        consider(_clip(np.rint((x - best_b[:, None]) * inv[:, None]), nmax))
    a = np.where(flat, F(0), best_a)
    b = np.where(flat, lo, best_b)
    haa = np.where(flat, F(0), haa)
    hab = np.where(flat, F(0), hab)
    return a.astype(F), (F(0) - b).astype(F), haa, hab, sw


# ------------------------------------------------------------------ step 2: super-blocks
def fp16_scale(v: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A normalized scale v (per super-block, exponent e) -> (stored float16, its normalized
    float32 value)."""
    d16 = to_fp16(denormalize(v.astype(F), e))
    return d16, renormalize(d16.astype(F), e)


def _codes6(v, d, levels):
    """Sub-block codes clip(rint(v / d), 0, levels) (0 where d <= 0). v (nb, ns), d (nb,)."""
    ok = d > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        q = _clip(np.rint(v / np.where(ok, d, F(1))[:, None]), levels)
    return np.where(ok[:, None], q, F(0))


def weight_codes(x, d, dm, ls, lm, nmax):
    """Codes (nb, ns, n) of x given the stored values: clip(rint((x + dmin*lm) / (d*ls)))."""
    sc = d[:, None] * ls
    mo = dm[:, None] * lm
    ok = sc > 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        isc = F(1) / np.where(ok, sc, F(1))
        q = _clip(np.rint((x + mo[..., None]) * isc[..., None]), nmax)
    return np.where(ok[..., None], q, F(0)), sc, mo


def _sub_err(x, w, d, dm, ls, lm, nmax):
    """Weighted squared error per sub-block (nb, ns) of the re-rounded codes."""
    L, sc, mo = weight_codes(x, d, dm, ls, lm, nmax)
    with np.errstate(over="ignore", invalid="ignore"):
        r = x - (sc[..., None] * L - mo[..., None])
        return _seqsum(w * (r * r))


def _sum2(p):
    """(nb, ns, n) -> (nb,): per sub-block sums in index order, then over the sub-blocks."""
    return _seqsum(_seqsum(p))


def super_search(x, w, a, m, haa, hab, sw, e, p: AffineKParams):
    """x, w (nb, ns, n) normalized; a, m (nb, ns) sub-block scale/min; haa, hab, sw (nb, ns)
    the sums sum w q^2, sum w q, sum w of each sub-block's codes; e (nb,) exponents.
    Returns (d16, dmin16 float16 (nb,), ls, lm float32 (nb, ns), L float32 (nb, ns, n))."""
    nb = x.shape[0]
    S, nmax = p.levels, p.nmax
    amax, mmax = _seqmax0(a), _seqmax0(m)
    divs = p.div_array()
    best_P = np.full(nb, INF)
    d16 = np.full(nb, np.float16(np.inf))
    m16 = np.full(nb, np.float16(np.inf))
    d = np.zeros(nb, F)
    dm = np.zeros(nb, F)
    h2 = F(2) * hab
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        # (a) screen every (d, dmin) divisor pair with the quadratic error model
        mc = []
        for mv in divs:
            c16, c = fp16_scale(mmax / mv, e)
            dmm = c[:, None] * _codes6(m, c, S) - m
            mc.append((c16, c, dmm, sw * (dmm * dmm)))
        for dv in divs:
            c16, c = fp16_scale(amax / dv, e)
            da = c[:, None] * _codes6(a, c, S) - a
            t1 = haa * (da * da)
            for mv16, mvv, dmm, t3 in mc:
                P = _seqsum((t1 - h2 * (da * dmm)) + t3)
                P = np.where(np.isfinite(c16) & np.isfinite(mv16), P, INF)
                bt = P < best_P
                best_P = np.where(bt, P, best_P)
                d16, d = np.where(bt, c16, d16), np.where(bt, c, d)
                m16, dm = np.where(bt, mv16, m16), np.where(bt, mvv, dm)
        # (b) refine the winner on the real, re-rounded error
        ls, lm = _codes6(a, d, S), _codes6(m, dm, S)
        E = _sub_err(x, w, d, dm, ls, lm, nmax)
        for _ in range(p.rounds):
            for da_, db_ in NEIGHBOURS:
                l2 = _clip(ls + F(da_), S)
                m2 = _clip(lm + F(db_), S)
                E2 = _sub_err(x, w, d, dm, l2, m2, nmax)
                bt = E2 < E
                E = np.where(bt, E2, E)
                ls = np.where(bt, l2, ls)
                lm = np.where(bt, m2, lm)
            L, _, _ = weight_codes(x, d, dm, ls, lm, nmax)
            A = ls[..., None] * L
            B = np.broadcast_to(lm[..., None], L.shape)
            wa, wb = w * A, w * B
            saa, sab, sax = _sum2(wa * A), _sum2(wa * B), _sum2(wa * x)
            sbb, sbx = _sum2(wb * B), _sum2(wb * x)
            det = saa * sbb - sab * sab
            okd = det > 0
            dets = np.where(okd, det, F(1))
            nd = (sax * sbb - sab * sbx) / dets
            ndm = (sab * sax - saa * sbx) / dets
            ndm = np.where(ndm > 0, ndm, F(0))
            okd &= nd > 0
            nd16, nd_ = fp16_scale(np.where(okd, nd, F(0)), e)
            nm16, ndm_ = fp16_scale(ndm, e)
            okd &= np.isfinite(nd16) & np.isfinite(nm16)
            E2 = _sub_err(x, w, nd_, ndm_, ls, lm, nmax)
            okd &= _seqsum(E2) < _seqsum(E)
            d16, d = np.where(okd, nd16, d16), np.where(okd, nd_, d)
            m16, dm = np.where(okd, nm16, m16), np.where(okd, ndm_, dm)
            E = np.where(okd[:, None], E2, E)
        L, _, _ = weight_codes(x, d, dm, ls, lm, nmax)
    fin = best_P < INF
    return (np.where(fin, d16, np.float16(np.inf)), np.where(fin, m16, np.float16(np.inf)),
            ls, lm, L)


def encode_affine_k(x: np.ndarray, p: AffineKParams, qw: np.ndarray | None = None):
    """x float32 (nb, 256) -> (d16, dmin16 (nb,), ls, lm uint8 (nb, ns), L uint8 (nb, 256)).

    qw: optional importance (nb, 256), finite and >= 0; a sub-block whose importance sums to
    0 is weighted uniformly. A super-block whose float16 scales overflow gets d16/dmin16 = Inf
    (the caller refuses it)."""
    nb = x.shape[0]
    ns, n = p.ns, p.n
    xn, e = pow2_normalize(np.ascontiguousarray(x, F))
    xs = xn.reshape(-1, n)
    if qw is None:
        w = np.ones_like(xs)
    else:
        w = np.ascontiguousarray(qw, F).reshape(-1, n)
        w = np.where((_seqsum(w) > 0)[:, None], w, F(1))
    a, m, haa, hab, sw = sub_search(xs, w, p)
    sh = (nb, ns)
    d16, m16, ls, lm, L = super_search(xn.reshape(nb, ns, n), w.reshape(nb, ns, n),
                                       a.reshape(sh), m.reshape(sh), haa.reshape(sh),
                                       hab.reshape(sh), sw.reshape(sh), e, p)
    return (d16, m16, ls.astype(np.uint8), lm.astype(np.uint8),
            L.reshape(nb, 256).astype(np.uint8))

"""The Q3_K / Q6_K quantizer: a searched scale per sub-block, then a search on the stored
sub-block scale codes and the float16 super-scale themselves.

    w = d * s_j * q        (sub-block j of 16 weights, q in -nmax..nmax-1, s_j in -S..S-1)

The objective is the (importance-)weighted squared error sum_i w_i (x_i - y_i)^2 of the
weights as llama.cpp decodes them: w_i = 1 without an imatrix, w_i = qw_i (the per-input-
channel E[x^2] of an imatrix: the diagonal of the layer-output error) with one. float32
throughout, every sum in index order, so that kernels/kquant_sym.py reproduces it bit for bit:

1. Per sub-block: mx = the weight of largest magnitude; candidate inverse steps c / mx for
   every c of `cands` (negative c map mx to the long end -nmax of the code range, positive c
   to +nmax-1); codes q = clip(rint(x c / mx)); for each code set the least-squares scale
   a = sum w x q / sum w q^2 and its explained energy a * sum w x q (the error is
   sum w x^2 minus it); the largest wins. `iters` rounds re-round with the winner and refit.
   The error of another scale a' for the winning codes is the winner's + haa (a' - a)^2,
   haa = sum w q^2.
2. Per super-block: (a) screening: for each divisor dv of `divs`, d = float16(top / -dv)
   (top: the sub-block scale of largest magnitude) and s_j = clip(rint(a_j / d)); scored by
   the quadratic model sum_j haa_j (d s_j - a_j)^2 (no pass over the weights); the least
   wins. (b) `rounds` times: each sub-block tries s_j - 1 and s_j + 1 with its weights
   re-rounded against the stored d * s_j, keeping the least error; then the weighted
   least-squares d for the fixed integer s_j and codes, rounded to float16, is kept when
   the re-rounded super-block error drops.

llama.cpp (make_qx_quants) weights the search by x^2 (Q6_K) or rms + |x| (Q3_K), tries 19
candidates mapping the largest weight to the long end only, and rounds the winning scales
to the sub-block grid once.

Inputs are normalized per super-block by a power of two (common.pow2_normalize); the float16
rounding is done on the denormalized values.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.schemes.ggml.common import pow2_normalize
from workbench.schemes.ggml.affine_k import fp16_scale

F = np.float32
INF = F(np.inf)
#: a sub-block whose largest |x| (normalized: the super-block max is in [0.5, 1)) is below
#: this is quantized to zeros
SUB_EPS = F(1e-30)
MAGIC = F(12582912.0)


@dataclass(frozen=True)
class SymKParams:
    nmax: int               # weight codes -nmax..nmax-1
    levels: int             # sub-block scale codes -levels..levels-1
    cands: tuple            # candidate numerators c (iscale = c / mx), float32 values
    iters: int              # re-round + refit rounds after the candidates
    divs: tuple             # super-scale divisors tried (d = top / -div)
    rounds: int             # neighbour search + super-scale refit rounds

    def layout(self) -> dict:
        """The parameters as plain data, for the kernel layer (kernels.spec)."""
        return {"cands": list(self.cands), "divs": list(self.divs), "iters": self.iters,
                "rounds": self.rounds}


def _cands(nmax, ts):
    return tuple(float(F(c)) for t in ts for c in (-(nmax + t), nmax - 1 + t))


# Candidates (measured on MiniLM's FFN weights, plain and imatrix-weighted): Q6_K wants
# integer offsets, mostly coarser steps than the range mapping (the refit re-centres them);
# Q3_K wants candidates that clip the largest weight hard (offset +4: the largest weight at
# code -8 before the clip), which matters most with an imatrix. More candidates or rounds
# gain < 0.5 % in error for twice the time; a second refit round gains nothing.
# Q3_K: offsets (0, 1, 4); adding 2 left the plain error ratio to ggml at 0.9515 and moved
# the imatrix-weighted one 0.9514 -> 0.9491 for 4/3 of the candidate passes; (0, 4) alone
# gave 0.958 / 0.971. No re-round + refit round after the candidates (iters 0): 0.9515 ->
# 0.9520 plain, 0.9514 -> 0.9522 weighted, for one pass of five fewer.
Q6_K_PARAMS = SymKParams(32, 128, _cands(32, (-8, -4, -2, -1, 0, 1)), 1,
                         (128.0, 127.5, 127.0, 126.5), 1)
Q3_K_PARAMS = SymKParams(4, 32, _cands(4, (0, 1, 4)), 0, (32.0, 31.5, 31.0, 30.5), 1)


def _rc(v, nmax):
    """clip(rint(v), -nmax, nmax-1), NaN -> -nmax, -0 -> +0 (the kernel's magic-number
    rounding and compare-and-select)."""
    q = (v + MAGIC) - MAGIC
    q = np.where(q > F(-nmax), q, F(-nmax))
    return np.where(q < F(nmax - 1), q, F(nmax - 1))


def _seqsum(p: np.ndarray) -> np.ndarray:
    """Sum over the last axis in index order, starting from +0 (float32)."""
    acc = np.zeros(p.shape[:-1], F)
    for i in range(p.shape[-1]):
        acc = acc + p[..., i]
    return acc


def _argabsmax(v: np.ndarray) -> np.ndarray:
    """The element of largest magnitude along the last axis (first on ties)."""
    best = v[..., 0].copy()
    ba = np.abs(best)
    for i in range(1, v.shape[-1]):
        a = np.abs(v[..., i])
        bt = a > ba
        best = np.where(bt, v[..., i], best)
        ba = np.where(bt, a, ba)
    return best


def sub_search(x: np.ndarray, w: np.ndarray, p: SymKParams):
    """x, w float32 (B, 16) -> (scale a, haa = sum w q^2 of its codes) float32 (B,)."""
    nmax = p.nmax
    mx = _argabsmax(x)
    zero = ~(np.abs(mx) >= SUB_EPS)
    mxs = np.where(zero, F(1), mx)
    wx = w * x
    best_s = np.full(x.shape[0], F(-1))
    best_a = np.zeros(x.shape[0], F)
    haa = np.zeros(x.shape[0], F)

    def consider(isc):
        nonlocal best_s, best_a, haa
        L = _rc(x * isc[:, None], nmax)
        sxl = _seqsum(wx * L)
        sl2 = _seqsum((w * L) * L)
        ok = sl2 > 0
        a = sxl / np.where(ok, sl2, F(1))
        score = a * sxl
        bt = ok & (score > best_s)
        best_s = np.where(bt, score, best_s)
        best_a = np.where(bt, a, best_a)
        haa = np.where(bt, sl2, haa)

    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for c in np.array(p.cands, F):
            consider(c / mxs)
        for _ in range(p.iters):
            nz = best_a != 0
            consider(np.where(nz, F(1) / np.where(nz, best_a, F(1)), F(0)))
    return np.where(zero, F(0), best_a), np.where(zero, F(0), haa)


def _scodes(a, d, levels):
    """clip(rint(a / d), -levels, levels-1); 0 where d == 0. a (nb, 16), d (nb,)."""
    nz = d != 0
    q = _rc(a / np.where(nz, d, F(1))[:, None], levels)
    return np.where(nz[:, None], q, F(0))


def weight_codes(x, d, s, nmax):
    """Codes (nb, 16, 16) of x given the stored d (nb,) and s (nb, 16); sc = d * s."""
    sc = d[:, None] * s
    nz = sc != 0
    iv = np.where(nz, F(1) / np.where(nz, sc, F(1)), F(0))
    return _rc(x * iv[..., None], nmax), sc


def _sub_err(x, w, d, s, nmax):
    L, sc = weight_codes(x, d, s, nmax)
    r = x - sc[..., None] * L
    return _seqsum(w * (r * r))


def super_search(x, w, a, haa, e, p: SymKParams):
    """x, w (nb, 16, 16) normalized; a, haa (nb, 16); e (nb,) exponents.
    Returns (d16 float16 (nb,), s float32 (nb, 16), L float32 (nb, 16, 16))."""
    nb = x.shape[0]
    S, nmax = p.levels, p.nmax
    top = _argabsmax(a)
    best_P = np.full(nb, INF)
    d16 = np.full(nb, np.float16(np.inf))
    d = np.zeros(nb, F)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for dv in np.array(p.divs, F):
            c16, c = fp16_scale(top / -dv, e)
            da = c[:, None] * _scodes(a, c, S) - a
            P = _seqsum(haa * (da * da))
            bt = np.isfinite(c16) & (P < best_P)
            best_P = np.where(bt, P, best_P)
            d16 = np.where(bt, c16, d16)
            d = np.where(bt, c, d)
        s = _scodes(a, d, S)
        E = _sub_err(x, w, d, s, nmax)
        for _ in range(p.rounds):
            for delta in (F(-1), F(1)):
                s2 = _rc(s + delta, S)
                E2 = _sub_err(x, w, d, s2, nmax)
                bt = E2 < E
                E = np.where(bt, E2, E)
                s = np.where(bt, s2, s)
            L, _ = weight_codes(x, d, s, nmax)
            A = s[..., None] * L
            wa = w * A
            saa = _seqsum(_seqsum(wa * A))
            sax = _seqsum(_seqsum(wa * x))
            ok = saa > 0
            nd = sax / np.where(ok, saa, F(1))
            n16, nd_ = fp16_scale(np.where(ok, nd, F(0)), e)
            ok &= np.isfinite(n16) & (nd_ != 0)
            E2 = _sub_err(x, w, nd_, s, nmax)
            ok &= _seqsum(E2) < _seqsum(E)
            d16 = np.where(ok, n16, d16)
            d = np.where(ok, nd_, d)
            E = np.where(ok[:, None], E2, E)
        L, _ = weight_codes(x, d, s, nmax)
    fin = best_P < INF
    return np.where(fin, d16, np.float16(np.inf)), s, L


def encode_sym_k(x: np.ndarray, p: SymKParams, qw: np.ndarray | None = None):
    """x float32 (nb, 256) -> (d16 float16 (nb,), s int16 (nb, 16), L int16 (nb, 256)) with
    L in -nmax..nmax-1 and s in -levels..levels-1.

    qw: optional importance (nb, 256), finite and >= 0; a sub-block whose importance sums
    to 0 is weighted uniformly. A super-block whose float16 scale overflows gets d16 = Inf
    (the caller refuses it)."""
    nb = x.shape[0]
    xn, e = pow2_normalize(np.ascontiguousarray(x, F))
    xs = xn.reshape(-1, 16)
    if qw is None:
        w = np.ones_like(xs)
    else:
        w = np.ascontiguousarray(qw, F).reshape(-1, 16)
        w = np.where((_seqsum(w) > 0)[:, None], w, F(1))
    a, haa = sub_search(xs, w, p)
    d16, s, L = super_search(xn.reshape(nb, 16, 16), w.reshape(nb, 16, 16),
                             a.reshape(nb, 16), haa.reshape(nb, 16), e, p)
    return d16, s.astype(np.int16), L.reshape(nb, 256).astype(np.int16)

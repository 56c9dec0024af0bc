"""IQ1_S and IQ1_M (GGML types 19 and 29): llama.cpp's 1-bit lattice types. Each group of 8
weights is one point of a 2048-point grid of {-1, 0, 1}^8 (kernels/iq1_grids.py) plus a shift
delta = +-0.125 shared by a "unit" of weights, times a sub-block scale:

    w = d * (2l + 1) * (grid byte + delta)        (l: 3 bits per sub-block, d: float16)

Layouts (ggml-common.h):

* ``block_iq1_s``, 50 bytes, 1.5625 bits/weight: d (fp16) | qs[32] (low 8 bits of the 11-bit
  grid index of group k of sub-block ib at 4 ib + k) | qh[8] uint16, one per 32-weight
  sub-block: bits 3k..3k+2 the high 3 bits of group k's index, bits 12..14 l, bit 15 the shift
  sign (set: delta = -0.125). Sub-block = unit = 32 weights.
* ``block_iq1_m``, 56 bytes, 1.75 bits/weight: qs[32] (as IQ1_S) | qh[16], one byte per
  16-weight sub-block: bits 0..2 / 4..6 the high index bits of its groups 0 / 1, bit 3 / 7
  their shift signs | scales[8] = 4 uint16: l of sub-block ib at bits 3 (ib % 4) of
  scales16[ib / 4], the float16 d in the top nibbles (bits 12..15 of scales16[i] hold bits
  4i..4i+3 of d). Sub-block 16 weights, unit 8 weights.

Quantize: the workbench's own search, built on ggml's (``quantize_row_iq1_s_impl`` /
``quantize_row_iq1_m_impl``), with ggml's weights w = qw sqrt(2 sum(x^2)/256 + x^2) (qw: the
importance; qw = 1 without one: llama.cpp refuses IQ1_S without an imatrix, and weighs IQ1_M by
x^2 then):

* each super-block is first scaled by a power of two (max |x| in [0.5, 1); exact); a
  super-block below 1e-15 is zeros;
* per sub-block (largest |x| below 1e-8: scale 0, all levels 0 = grid byte 0, shift +), ggml's
  exhaustive split: x sorted ascending (stable), two cut points i1 <= i2 give the levels
  -1 / 0 / 1, each unit its shift sign (IQ1_S 2, IQ1_M 4 combinations), from per-unit prefix
  sums of w x and w; the split and signs of largest (sum w x v)^2 / sum w v^2 win (the first
  of equal ones; ggml compares sequentially). A negative scale flips levels and signs;
* groups of 8 off the grid take the neighbour (``iq_lattice.lattice("iq1")``: ggml's lists,
  nwant 3) of least sum w (scale v - x)^2; then the least-squares scale sum w x v / sum w v^2;
* d and l (ggml: fp16(1.125 max scale / 15), l = rint((15 s / max scale - 1) / 2)): here the
  float16 d of least importance-weighted error sum qw (x - y)^2 among max scale / 15 times
  D_FACTORS (ggml's 1.125 first) and the least-squares d for the best one's l, each
  sub-block taking its best l for each candidate d;
* last, at each sub-block's final scale d (2l + 1), every unit's groups are chosen again for
  both shift signs (each weight rounded to the nearest of -1, 0, 1, off-grid groups their
  best neighbour by sum qw (scale v - x)^2), kept where the unit's error drops, and each
  sub-block's l chosen again.

Every sum is float32 in index order, so the numba kernel kernels/iq1_quant.py gives the same
bytes.
"""

from __future__ import annotations

import gguf
import numpy as np

from kernels import iq1_grids
from kernels.iq_lattice import lattice
from workbench.schemes.ggml.common import GGMLScheme, ScaleOverflow, block_dtype, fp16_field, \
    to_fp16, FP16_MAX
from workbench.schemes.ggml.iq3 import normalize, search_weights

F = np.float32
EPS_SUB = F(1e-8)
DELTA = iq1_grids.DELTA
GRIDF = iq1_grids.GRID.astype(F)
GRIDF.setflags(write=False)
#: d candidates: max scale / 15 times these (ggml stores max scale / 15 * 1.125)
D_FACTORS = tuple(F(1.125 * (1 + 0.04 * c)) for c in (0, -1, 1, -2, 2, -3, -4))
#: (sub-block size, units per sub-block) of each type
GEOMETRY = {"s": (32, 1), "m": (16, 2)}
_SH8 = 2 * np.arange(8)
SPLIT_ROWS = 2048                 # sub-blocks per split_search call


def _vals(sign: int):
    """The three values level - 1 + delta for shift sign 0 (+) / 1 (-), and their squares."""
    dl = -DELTA if sign else DELTA
    v = (F(-1) + dl, dl, F(1) + dl)
    return v, tuple(F(a * a) for a in v)


def split_search(xs: np.ndarray, ws: np.ndarray, units: int):
    """ggml's exhaustive 3-level split per row of xs, ws (m, S) with `units` shift units.
    -> (levels (m, S) int64 0..2, shift signs (m, units) int64 (1: minus), scale (m,))."""
    m, S = xs.shape
    U = S // units
    order = np.argsort(xs, axis=1, kind="stable")
    xo = np.take_along_axis(xs, order, axis=1)
    wo = np.take_along_axis(ws, order, axis=1)
    half = order // U
    px = np.zeros((m, units, S + 1), F)
    pw = np.zeros((m, units, S + 1), F)
    for j in range(S):
        px[:, :, j + 1] = px[:, :, j]
        pw[:, :, j + 1] = pw[:, :, j]
        for h in range(units):
            sel = half[:, j] == h
            px[sel, h, j + 1] = px[sel, h, j] + wo[sel, j] * xo[sel, j]
            pw[sel, h, j + 1] = pw[sel, h, j] + wo[sel, j]
    i1, i2 = np.triu_indices(S + 1)               # (i1, i2) with i1 <= i2, i1 major
    qx = {}
    q2 = {}
    for h in range(units):
        a1, a2, at = px[:, h, i1], px[:, h, i2], px[:, h, S:S + 1]
        b1, b2, bt = pw[:, h, i1], pw[:, h, i2], pw[:, h, S:S + 1]
        for s in (0, 1):
            v, c = _vals(s)
            qx[h, s] = a1 * v[0] + (a2 - a1) * v[1] + (at - a2) * v[2]
            q2[h, s] = b1 * c[0] + (b2 - b1) * c[1] + (bt - b2) * c[2]
    ncomb = 1 << units
    sc = np.empty((m, i1.size, ncomb), F)
    sx = np.empty((m, i1.size, ncomb), F)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for k in range(ncomb):
            sg = [(k >> (units - 1 - h)) & 1 for h in range(units)]
            tx, t2 = qx[0, sg[0]], q2[0, sg[0]]
            for h in range(1, units):
                tx = tx + qx[h, sg[h]]
                t2 = t2 + q2[h, sg[h]]
            s_ = tx * tx / t2
            sc[:, :, k] = np.where((t2 > 0) & ~np.isnan(s_), s_, -np.inf)
            sx[:, :, k] = tx / np.where(t2 > 0, t2, F(1))
    flat = sc.reshape(m, -1)
    best = flat.argmax(axis=1)
    ok = flat[np.arange(m), best] > -np.inf
    pair, k = best // ncomb, best % ncomb
    scale = sx.reshape(m, -1)[np.arange(m), best]
    pos = np.arange(S)[None, :]
    lvs = np.where(pos < i1[pair][:, None], 0, np.where(pos < i2[pair][:, None], 1, 2))
    lv = np.empty((m, S), np.int64)
    np.put_along_axis(lv, order, lvs, axis=1)
    sg = (k[:, None] >> (units - 1 - np.arange(units))) & 1
    flip = scale < 0
    lv = np.where(flip[:, None], 2 - lv, lv)
    sg = np.where(flip[:, None], 1 - sg, sg)
    scale = np.where(flip, -scale, scale)
    dead = ~ok | ~(np.abs(xs).max(axis=1) >= EPS_SUB) | ~np.isfinite(scale)
    lv[dead] = 1
    sg[dead] = 0
    return lv, sg, np.where(dead, F(0), scale).astype(F)


def values(gi: np.ndarray, sg: np.ndarray) -> np.ndarray:
    """grid byte + delta (float32) of grid indices gi (..., G) with the groups' shift signs
    (..., G) -> (..., 8 G)."""
    v = GRIDF[gi] + np.where(sg == 1, -DELTA, DELTA)[..., None].astype(F)
    return v.reshape(*gi.shape[:-1], 8 * gi.shape[-1])


def assign(lv: np.ndarray, x: np.ndarray, wt: np.ndarray, scale: np.ndarray,
           sg: np.ndarray) -> np.ndarray:
    """Grid index of every group of 8: lv, x, wt (m, G, 8), scale (m,), sg (m, G) -> (m, G):
    the rounded point when on the grid, else its neighbour of least sum wt (scale v - x)^2."""
    lat = lattice("iq1")
    m, G = lv.shape[:2]
    gi = lat.kmap[(lv << _SH8).sum(axis=2)].astype(np.int64)
    off = gi < 0
    if off.any():
        cand = lat.neighbours[-gi[off] - 1].astype(np.int64)          # (k, W)
        dl = np.where(sg[off] == 1, -DELTA, DELTA).astype(F)
        cv = GRIDF[np.maximum(cand, 0)] + dl[:, None, None]             # (k, W, 8)
        xo, wo = x[off], wt[off]
        so = np.broadcast_to(scale[:, None], (m, G))[off]
        d2 = np.zeros(cand.shape, F)
        with np.errstate(over="ignore", invalid="ignore"):
            for i in range(8):
                diff = so[:, None] * cv[:, :, i] - xo[:, None, i]
                d2 = d2 + wo[:, None, i] * diff * diff
        d2[(cand < 0) | np.isnan(d2)] = np.inf
        gi[off] = cand[np.arange(cand.shape[0]), d2.argmin(axis=1)]
    return gi


def _ab(x, q, v):
    """(sum q x v, sum q v v) per row, index order."""
    a = np.zeros(x.shape[0], F)
    b = np.zeros(x.shape[0], F)
    for j in range(x.shape[1]):
        qv = q[:, j] * v[:, j]
        a = a + qv * x[:, j]
        b = b + qv * v[:, j]
    return a, b


def best_levels(dn: np.ndarray, a: np.ndarray, b: np.ndarray):
    """Per sub-block the 3-bit l of least error db^2 B - 2 db A (db = dn (2l + 1)), and the
    super-block's total. dn (n,), a, b (n, NSB) -> (l (n, NSB), total (n,))."""
    e_min = np.full(a.shape, np.inf, F)
    l_min = np.zeros(a.shape, np.int64)
    with np.errstate(over="ignore", invalid="ignore"):
        for lv in range(8):
            db = (dn * F(2 * lv + 1))[:, None]
            e = db * db * b - F(2) * db * a
            better = e < e_min
            e_min = np.where(better, e, e_min)
            l_min = np.where(better, lv, l_min)
    tot = np.zeros(a.shape[0], F)
    for ib in range(a.shape[1]):
        tot = tot + e_min[:, ib]
    return l_min, tot


def _d_of(dn, e):
    """float16 of ldexp(dn, e) and its normalized value (NaN where not finite)."""
    with np.errstate(over="ignore", invalid="ignore"):
        dh = to_fp16(np.ldexp(dn.astype(F), e).astype(F))
        dhn = np.ldexp(dh.astype(F), -e).astype(F)
    return dh, np.where(np.isfinite(dh), dhn, F(np.nan))


def pick_d(max_scale, e, a, b):
    """The float16 d and the levels l (module docstring). -> (dh (n,), l (n, NSB))."""
    n = a.shape[0]
    dh0, _ = _d_of(max_scale / F(15) * D_FACTORS[0], e)
    best_h, best_l = dh0, np.zeros(a.shape, np.int64)
    best_t = np.full(n, np.inf, F)
    cands = [max_scale / F(15) * f for f in D_FACTORS] + [None]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for dn in cands:
            if dn is None:                              # least squares for the best l
                k = (2 * best_l + 1).astype(F)
                num = np.zeros(n, F)
                den = np.zeros(n, F)
                for ib in range(a.shape[1]):
                    num = num + k[:, ib] * a[:, ib]
                    den = den + (k[:, ib] * k[:, ib]) * b[:, ib]
                okls = (num > 0) & (den > 0)
                dn = np.where(okls, num / np.where(okls, den, F(1)), F(np.nan)).astype(F)
            dh, dhn = _d_of(dn, e)
            ok = np.isfinite(dhn)
            lv, tot = best_levels(np.where(ok, dhn, F(0)), a, b)
            better = ok & (tot < best_t)
            best_t = np.where(better, tot, best_t)
            best_h = np.where(better, dh, best_h)
            best_l = np.where(better[:, None], lv, best_l)
    return best_h, best_l


def _unit_err(x, q, v):
    """sum q (v - x)^2 per row in index order (v already scaled)."""
    t = np.zeros(x.shape[0], F)
    for j in range(x.shape[1]):
        diff = v[:, j] - x[:, j]
        t = t + q[:, j] * diff * diff
    return t


def repick(xs, qs, gi, sg, sf, units):
    """The last step: every unit's groups chosen again at the sub-block's final scale sf for
    both shift signs, kept where the unit's error drops. xs, qs (m, S), gi (m, G), sg (m,
    units), sf (m,) -> (gi, sg)."""
    m, S = xs.shape
    U = S // units
    gpu = U // 8
    live = sf > 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        isf = F(1) / np.where(live, sf, F(1))
        gi, sg = gi.copy(), sg.copy()
        for u in range(units):
            cols = slice(u * U, (u + 1) * U)
            grp = slice(u * gpu, (u + 1) * gpu)
            xu, qu = xs[:, cols], qs[:, cols]
            sgu = np.repeat(sg[:, u:u + 1], gpu, axis=1)
            e_best = _unit_err(xu, qu, sf[:, None] * values(gi[:, grp], sgu))
            for flip in (0, 1):
                s_new = sg[:, u] ^ flip
                dl = np.where(s_new == 1, -DELTA, DELTA).astype(F)
                t = xu * isf[:, None] - dl[:, None]
                r = np.clip(np.nan_to_num(np.rint(t), nan=0.0), -1, 1).astype(np.int64) + 1
                s_g = np.repeat(s_new[:, None], gpu, axis=1)
                g_new = assign(r.reshape(m, gpu, 8), xu.reshape(m, gpu, 8),
                               qu.reshape(m, gpu, 8), sf, s_g)
                e = _unit_err(xu, qu, sf[:, None] * values(g_new, s_g))
                take = live & (e < e_best)
                e_best = np.where(take, e, e_best)
                gi[:, grp] = np.where(take[:, None], g_new, gi[:, grp])
                sg[:, u] = np.where(take, s_new, sg[:, u])
    return gi, sg


def encode_fields(x: np.ndarray, qw: np.ndarray | None, which: str):
    """x (n, 256) -> (d float16 (n,), grid indices (n, 32), shift signs (n, NU), l (n, NSB))."""
    S, units = GEOMETRY[which]
    nsb = 256 // S
    n = x.shape[0]
    if n == 0:
        z = np.zeros((0, nsb), np.int64)
        return np.zeros(0, np.float16), np.zeros((0, 32), np.int64), np.zeros((0, nsb * units),
                                                                          np.int64), z
    xn, e = normalize(np.asarray(x, F))
    w = search_weights(xn, qw)
    q = np.ones_like(xn) if qw is None else np.asarray(qw, F)
    m = n * nsb
    xs, ws, qs = xn.reshape(m, S), w.reshape(m, S), q.reshape(m, S)
    parts = [split_search(xs[i:i + SPLIT_ROWS], ws[i:i + SPLIT_ROWS], units)
             for i in range(0, m, SPLIT_ROWS)]           # bounded temporaries (m x pairs)
    lv, sg, scale = (np.concatenate([p_[k] for p_ in parts]) for k in range(3))
    G = S // 8
    sgg = np.repeat(sg, G // units, axis=1)
    with np.errstate(over="ignore", invalid="ignore"):
        gi = assign(lv.reshape(m, G, 8), xs.reshape(m, G, 8), ws.reshape(m, G, 8), scale, sgg)
        a, b = _ab(xs, ws, values(gi, sgg))
        r = a / np.where(b > 0, b, F(1))
        ls = (scale > 0) & (a > 0) & (b > 0) & np.isfinite(r)
        scale = np.where(ls, r, scale).astype(F)
    max_scale = scale.reshape(n, nsb).max(axis=1)
    zero = ~(max_scale > 0)
    a, b = _ab(xs, qs, values(gi, sgg))
    dh, lvl = pick_d(np.where(zero, F(1), max_scale), e, a.reshape(n, nsb), b.reshape(n, nsb))
    dhn = np.ldexp(dh.astype(F), -e).astype(F)
    with np.errstate(over="ignore", invalid="ignore"):
        sf = (np.where(np.isfinite(dhn), dhn, F(0))[:, None] * (2 * lvl + 1).astype(F)).reshape(m)
    gi, sg = repick(xs, qs, gi, sg, sf, units)
    sgg = np.repeat(sg, G // units, axis=1)
    a, b = _ab(xs, qs, values(gi, sgg))
    lv2, _ = best_levels(np.where(np.isfinite(dhn), dhn, F(0)), a.reshape(n, nsb),
                         b.reshape(n, nsb))
    gi, sg, lv2 = gi.reshape(n, nsb * G), sg.reshape(n, nsb * units), lv2
    dh = np.where(zero, np.float16(0), dh)
    gi[zero] = 0
    sg[zero] = 0
    lv2[zero] = 0
    return dh, gi, sg, lv2


def decode_values(gi: np.ndarray, sg: np.ndarray, d: np.ndarray, lv: np.ndarray) -> np.ndarray:
    """w (n, 256) from grid indices (n, 32), per-group shift signs (n, 32), d (n,), l (n, 32
    groups)."""
    v = GRIDF[gi] + np.where(sg == 1, -DELTA, DELTA)[..., None].astype(F)   # (n, 32, 8)
    dl = d[:, None] * (2 * lv + 1).astype(F)
    return (dl[:, :, None] * v).reshape(gi.shape[0], 256)


class IQ1_S(GGMLScheme):
    name = "iq1_s"
    nominal_bits = 1
    ggml_type = gguf.GGMLQuantizationType.IQ1_S
    llama_fallback = "iq4_nl"
    low_bit_only = True
    quant_kernel = "iq1"
    weighted_encoder = ("iq4_xs", "iq1_blocks")
    block_dtype = block_dtype([("d", "<f2"), ("qs", "u1", (32,)), ("qh", "<u2", (8,))], 50)

    def encode(self, x, qw=None):
        """qw: optional importance (n_blocks, 256), finite and >= 0 (methods/ggml_weighted)."""
        dh, gi, sg, lv = encode_fields(np.asarray(x, F), qw, "s")
        n = x.shape[0]
        out = np.empty(n, self.block_dtype)
        out["d"] = dh
        out["qs"] = (gi & 255).astype(np.uint8)
        hi = (gi >> 8).reshape(n, 8, 4) << (3 * np.arange(4))
        out["qh"] = (hi.sum(axis=2) | (lv << 12) | (sg << 15)).astype(np.uint16)
        return out

    def decode(self, b):
        n = b.shape[0]
        qh = b["qh"].astype(np.int64)                                       # (n, 8)
        gi = b["qs"].astype(np.int64) | (((qh[:, :, None] >> (3 * np.arange(4))) & 7)
                                         .reshape(n, 32) << 8)
        sg = np.repeat(qh >> 15, 4, axis=1)
        lv = np.repeat((qh >> 12) & 7, 4, axis=1)
        return decode_values(gi, sg, fp16_field(b["d"]), lv)


def iq1m_d_bits(sc: np.ndarray) -> np.ndarray:
    """The float16 d's bits from the 4 uint16 scales (n, 4) of IQ1_M blocks."""
    return ((sc[:, 0] >> 12) | ((sc[:, 1] >> 8) & 0x00F0) | ((sc[:, 2] >> 4) & 0x0F00)
            | (sc[:, 3] & 0xF000)).astype(np.uint16)


class IQ1_M(GGMLScheme):
    name = "iq1_m"
    nominal_bits = 1
    ggml_type = gguf.GGMLQuantizationType.IQ1_M
    llama_fallback = "iq4_nl"
    low_bit_only = True
    quant_kernel = "iq1"
    weighted_encoder = ("iq4_xs", "iq1_blocks")
    kernel_family = "iq1_s"
    block_dtype = block_dtype([("qs", "u1", (32,)), ("qh", "u1", (16,)),
                               ("scales", "<u2", (4,))], 56)
    scale_fields = ("scales",)      # d lives in their top nibbles (_check_scales unpacks it)

    def encode(self, x, qw=None):
        """qw: optional importance (n_blocks, 256), finite and >= 0 (methods/ggml_weighted)."""
        dh, gi, sg, lv = encode_fields(np.asarray(x, F), qw, "m")
        n = x.shape[0]
        out = np.empty(n, self.block_dtype)
        out["qs"] = (gi & 255).astype(np.uint8)
        hi = (gi >> 8).reshape(n, 16, 2)
        s2 = sg.reshape(n, 16, 2)
        out["qh"] = (hi[:, :, 0] | (s2[:, :, 0] << 3) | (hi[:, :, 1] << 4)
                     | (s2[:, :, 1] << 7)).astype(np.uint8)
        sc = (lv.reshape(n, 4, 4) << (3 * np.arange(4))).sum(axis=2)
        u = dh.astype(np.float16).view(np.uint16).astype(np.int64)
        sc = sc | (((u[:, None] >> (4 * np.arange(4))) & 15) << 12)
        out["scales"] = sc.astype(np.uint16)
        return out

    def decode(self, b):
        n = b.shape[0]
        d = iq1m_d_bits(b["scales"]).view(np.float16).astype(F)
        qh = b["qh"].astype(np.int64)                                       # (n, 16)
        gi = b["qs"].astype(np.int64) | (np.stack([qh & 7, (qh >> 4) & 7], 2).reshape(n, 32) << 8)
        sg = np.stack([(qh >> 3) & 1, qh >> 7], 2).reshape(n, 32)
        sc = b["scales"].astype(np.int64)
        lv = ((sc[:, :, None] >> (3 * np.arange(4))) & 7).reshape(n, 16)
        return decode_values(gi, sg, d, np.repeat(lv, 2, axis=1))

    def _check_scales(self, enc, x):
        d = iq1m_d_bits(enc["scales"]).view(np.float16)
        if not np.isfinite(d).all():
            raise ScaleOverflow(
                f"cannot quantize with {self.name}: weights too large (max |w| = "
                f"{float(np.abs(x).max()):.4g}); the float16 block scale 'd' overflows "
                f"(limit {FP16_MAX:g})")

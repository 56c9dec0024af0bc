"""llama.cpp's 2-bit lattice i-quants: IQ2_XXS (GGML type 16, 2.0625 bits/weight), IQ2_XS
(17, 2.3125) and IQ2_S (22, 2.5625). IQ2_XXS is described here; IQ2_XS and IQ2_S (16-weight
sub-blocks, ggml's quantize_row_iq2_xs_impl / _s_impl searches) at search_xs / encode_iq2_s.

Layout (66 bytes, ggml ``block_iq2_xxs``): d (fp16), then per 32-weight sub-block ib two
little-endian uint32 words: qs[2ib] = four grid indices (byte k: the 8 weights 8k..8k+7, an
entry of the 256-point grid kernels/iq_grids.KGRID_2BIT_256), qs[2ib+1] = four 7-bit sign
groups (bits 7k..7k+6; the 8th sign is their parity, ggml's ksigns_iq2xs) and the 4-bit
sub-block scale s in bits 28..31:

    w = d * (0.5 + s) * 0.25 * grid_byte * (-1 if the sign bit is set else 1)   (float32)

with grid bytes 8, 25, 43 (kernels/iq_lattice.py). Everything is numpy; the numba kernel
kernels/iq2_quant.py gives the same bytes.

Quantize: ggml's ``quantize_row_iq2_xxs_impl`` in float32, operation for operation (sums in
index order from 0), with weights qw * sqrt(sigma2 + x^2), sigma2 = sum(x^2)/256 over the
super-block (qw: the importance, 1 without one; llama.cpp refuses IQ2_XXS without an imatrix):
signs taken out (an odd count of negatives flips the least important weight of the 8), then
``make_qp_quants(32, 4)`` (ggml's uint8 store of a negative code included) for a first scale,
13 trial scales, each rounding to levels 0..2 and, off the grid, the best of the key's
neighbours (weighted by sqrt(weight), as ggml), a least-squares rescale, d = max scale / 31.
Then the workbench's own last step (ggml rounds 0.5 * (scale / d - 1)): each sub-block's
4-bit s is the one of least importance-weighted error sum qw (x - y)^2 with the decoder's
own values (grid bytes 8, 25, 43, where ggml's search assumes 1, 3, 5 times 8) and the
float16 d, and d itself the best of a few candidates around max scale / 31.
"""

from __future__ import annotations

import gguf
import numpy as np

from kernels.iq_lattice import KSIGNS, find_best_neighbour, grid_values, lattice
from workbench.schemes.ggml.common import GGMLScheme, block_dtype, fp16_field, to_fp16
from workbench.schemes.ggml.search import _seqsum

F = np.float32
EPS = F(1e-15)
KMAXQ = 3
#: d candidates of the last step: max scale / 31 times these (the first one is ggml's)
D_FACTORS = tuple(F(1.0 + 0.02 * c) for c in (0, -1, 1, -2, 2, -3, -4))


def weights_of(x: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    """ggml's search weights per super-block row x (n, 256): qw * sqrt(sigma2 + x^2)."""
    sigma2 = _seqsum(x, x) / F(x.shape[1])
    q = np.ones_like(x) if qw is None else np.asarray(qw, F)
    return (q * np.sqrt(sigma2[:, None] + x * x)).astype(F)


def take_signs(x: np.ndarray, w: np.ndarray, parity: bool = True
               ) -> tuple[np.ndarray, np.ndarray]:
    """x, w (m, 8G) -> xval (m, 8G) (|x|, one weight of an odd group negated) and the 7-bit
    sign groups (m, G) uint8 (ggml: the least important weight w x^2 of a group with an odd
    count of negatives takes the flip). parity False (IQ2_S): xval = |x|, 8 sign bits."""
    m, ng = x.shape[0], x.shape[1] // 8
    neg = ~(x >= 0)
    if not parity:
        s = (neg.reshape(m * ng, 8).astype(np.uint16) << np.arange(8, dtype=np.uint16)).sum(1)
        return np.where(neg, -x, x), s.astype(np.uint8).reshape(m, ng)
    xval = np.where(neg, -x, x).reshape(m * ng, 8)
    negg = neg.reshape(m * ng, 8).copy()
    odd = (negg.sum(axis=1) & 1).astype(bool)
    imin = np.argmin((w * x * x).reshape(m * ng, 8), axis=1)
    r = np.nonzero(odd)[0]
    xval[r, imin[r]] = -xval[r, imin[r]]
    negg[r, imin[r]] ^= True
    s = (negg[:, :7].astype(np.uint8) << np.arange(7, dtype=np.uint8)).sum(axis=1)
    return xval.reshape(m, 8 * ng), s.astype(np.uint8).reshape(m, ng)


def _ni(v: np.ndarray) -> np.ndarray:
    """ggml's nearest_int (half to even) as int64; NaN -> 0 and magnitudes capped at 2^30
    (where ggml's float trick gives garbage; the kernel does the same)."""
    r = np.rint(np.asarray(v, F))
    return np.clip(np.where(np.isnan(r), F(0), r), F(-2 ** 30), F(2 ** 30)).astype(np.int64)


def _rint_clamp(v: np.ndarray, lo: int, hi: int) -> np.ndarray:
    return np.clip(_ni(v), lo, hi)


def make_qp_quants(x: np.ndarray, w: np.ndarray, nmax: int) -> np.ndarray:
    """ggml's make_qp_quants(32, nmax, x, L, w) per row, returning the scale; its codes L
    are uint8 (a negative code is stored as 256 + code and read back so)."""
    m, n = x.shape
    mx = np.maximum(F(0), x.max(axis=1))
    live = mx >= EPS
    mxs = np.where(live, mx, F(1))
    iscale = F(nmax) / mxs
    li = _ni(iscale[:, None] * x)
    lu = (li & 255).astype(F)
    scale = F(1) / iscale
    best = np.zeros(m, F)
    for i in range(n):
        diff = x[:, i] - scale * lu[:, i]
        best = best + w[:, i] * diff * diff
    for is_ in range(-4, 5):
        if is_ == 0:
            continue
        isc = (F(0.1) * F(is_) + F(nmax)) / mxs
        sc = F(1) / isc
        mse = np.zeros(m, F)
        for i in range(n):
            lv = np.minimum(nmax, _ni(isc * x[:, i])).astype(F)
            diff = x[:, i] - sc * lv
            mse = mse + w[:, i] * diff * diff
        better = mse < best
        best = np.where(better, mse, best)
        iscale = np.where(better, isc, iscale)
    L = np.minimum(nmax, _ni(iscale[:, None] * x))
    sumlx = np.zeros(m, F)
    suml2 = np.zeros(m, F)
    for i in range(n):
        sumlx = sumlx + w[:, i] * x[:, i] * L[:, i].astype(F)
        suml2 = suml2 + w[:, i] * L[:, i].astype(F) * L[:, i].astype(F)
    L = L & 255                                           # ggml stores L as uint8
    active = live.copy()
    for _ in range(5):
        changed = np.zeros(m, bool)
        for i in range(n):
            wi, xi, li_ = w[:, i], x[:, i], L[:, i].astype(F)
            slx = sumlx - wi * xi * li_
            sl2 = suml2 - wi * li_ * li_
            ok = active & (slx > 0) & (sl2 > 0)
            with np.errstate(divide="ignore", invalid="ignore"):
                nl = np.minimum(nmax, _ni(np.where(ok, xi * sl2 / np.where(ok, slx, F(1)), F(0))))
            ok &= nl != L[:, i]
            nlf = nl.astype(F)
            slx = slx + wi * xi * nlf
            sl2 = sl2 + wi * nlf * nlf
            ok &= slx * slx * suml2 > sumlx * sumlx * sl2
            L[:, i] = np.where(ok, nl & 255, L[:, i])
            sumlx = np.where(ok, slx, sumlx)
            suml2 = np.where(ok, sl2, suml2)
            changed |= ok
        active &= changed
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(suml2 > 0, sumlx / np.where(suml2 > 0, suml2, F(1)), F(0))
    return np.where(live, out, F(0)).astype(F)


def grid_codes(lat, xval, waux, iscale, scale):
    """Levels 0..2 of rint(0.5 (iscale x - 1)); an off-grid group of 8 takes the best
    neighbour at `scale`. -> (levels (m, 8G) int64, grid indices (m, G) int64, on the grid
    before the neighbour search (m, G) bool)."""
    m, ng = xval.shape[0], xval.shape[1] // 8
    with np.errstate(over="ignore", invalid="ignore"):
        lv = _rint_clamp(F(0.5) * (iscale[:, None] * xval - F(1)), 0, KMAXQ - 1)
    lv = lv.reshape(m * ng, 8)
    g = lat.kmap[(lv << (2 * np.arange(8))).sum(axis=1)].astype(np.int64)
    on = g >= 0
    off = np.nonzero(~on)[0]
    if off.size:
        sc = np.repeat(scale, ng)[off]
        g[off] = find_best_neighbour(lat, -g[off] - 1, xval.reshape(m * ng, 8)[off],
                                     waux.reshape(m * ng, 8)[off], sc)
    lv = (lat.points[g].astype(np.int64) - 1) // 2
    return lv.reshape(m, 8 * ng), g.reshape(m, ng), on.reshape(m, ng)


def _qsums(w, xval, lv):
    q = (2 * lv + 1).astype(F)
    sqx = np.zeros(w.shape[0], F)
    sq2 = np.zeros(w.shape[0], F)
    for i in range(w.shape[1]):
        sqx = sqx + w[:, i] * xval[:, i] * q[:, i]
        sq2 = sq2 + w[:, i] * q[:, i] * q[:, i]
    return sqx, sq2


def search(lat, xval: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ggml's IQ2 sub-block search (kMaxQ 3): xval, w (m, 32) -> (scale (m,), grid indices
    (m, 4), flip (m,) bool: the scale came out negative and was negated)."""
    m = xval.shape[0]
    waux = np.sqrt(w).astype(F)
    live = xval.max(axis=1) >= EPS
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        scale = make_qp_quants(xval, w, KMAXQ + 1)
        eff = scale * F(KMAXQ)
        live &= eff > 0
        effs = np.where(live, eff, F(1))
        best = np.zeros(m, F)
        g = np.zeros((m, 4), np.int64)
        for is_ in range(-6, 7):
            iscale = (F(2 * KMAXQ - 1) + F(is_) * F(0.1)) / effs
            lv, ga, _ = grid_codes(lat, xval, waux, iscale, F(1) / iscale)
            sqx, sq2 = _qsums(w, xval, lv)
            ok = live & (sq2 > 0) & (sqx * sqx > best * sq2)
            sn = sqx / np.where(ok, sq2, F(1))
            scale = np.where(ok, sn, scale)
            best = np.where(ok, sn * sqx, best)
            g = np.where(ok[:, None], ga, g)
        pos = live & (scale > 0)
        iscale = F(1) / np.where(pos, scale, F(1))
        lv, ga, _ = grid_codes(lat, xval, waux, iscale, scale)
        sqx, sq2 = _qsums(w, xval, lv)
        scale = np.where(pos & (sq2 > 0), sqx / np.where(sq2 > 0, sq2, F(1)), scale)
        g = np.where(pos[:, None], ga, g)
    flip = live & (scale < 0)
    scale = np.where(flip, -scale, scale)
    return np.where(live, scale, F(0)).astype(F), np.where(live[:, None], g, 0), flip


def signed_values(values, g: np.ndarray, signs: np.ndarray, parity: bool = True) -> np.ndarray:
    """The decoder's grid byte times its sign, float32 (m, 8G), for grid indices (m, G) and
    7-bit sign groups (m, G)."""
    m, ng = g.shape
    v = values[g].astype(F).reshape(m, 8 * ng)
    sb = (KSIGNS[signs] if parity else signs).reshape(m * ng, 1) >> np.arange(8, dtype=np.uint8)
    neg = (sb & 1).astype(bool).reshape(m, 8 * ng)
    return np.where(neg, -v, v)


def pick_scales(x, qw, gv, max_scale, factors=None):
    """The last step: per super-block (n rows of S sub-blocks) the float16 d among
    D_FACTORS * max_scale / 31 and per sub-block the 4-bit s of least sum qw (x - y)^2,
    y = d (0.5 + s) 0.25 gv. x, qw, gv (n*S, 256/S); max_scale (n,). -> (d16 (n,), s (n, S))."""
    n = max_scale.shape[0]
    ns = x.shape[0] // n
    a = _seqsum(qw * x, gv).reshape(n, ns)
    b = _seqsum(qw * gv, gv).reshape(n, ns)
    best_e = np.full(n, np.inf, F)
    factors = D_FACTORS if factors is None else factors
    best_d = to_fp16(max_scale / F(31) * factors[0])
    best_s = np.zeros((n, ns), np.int64)
    for f in factors:
        d16 = to_fp16(max_scale / F(31) * f)
        d = d16.astype(F)
        e_min = np.full((n, ns), np.inf, F)
        s_min = np.zeros((n, ns), np.int64)
        for s in range(16):
            db = d[:, None] * (F(0.5) + F(s)) * F(0.25)
            e = db * db * b - F(2) * db * a
            better = e < e_min
            e_min = np.where(better, e, e_min)
            s_min = np.where(better, s, s_min)
        tot = np.zeros(n, F)
        for ib in range(ns):
            tot = tot + e_min[:, ib]
        better = (tot < best_e) & np.isfinite(d)
        best_e = np.where(better, tot, best_e)
        best_d = np.where(better, d16, best_d)
        best_s = np.where(better[:, None], s_min, best_s)
    first = to_fp16(max_scale / F(31) * factors[0])
    best_d = np.where(np.isfinite(first.astype(F)), best_d, first)   # overflow: refused later
    return best_d, best_s


def encode_iq2_xxs(x: np.ndarray, qw: np.ndarray | None, dtype: np.dtype) -> np.ndarray:
    lat = lattice("iq2_xxs")
    n = x.shape[0]
    w = weights_of(x, qw)
    xs = x.reshape(n * 8, 32)
    ws = w.reshape(n * 8, 32)
    xval, signs = take_signs(xs, ws)
    scale, g, flip = search(lat, xval, ws)
    signs = np.where(flip[:, None], (~signs) & np.uint8(127), signs)
    live = scale > 0
    g = np.where(live[:, None], g, 0)
    signs = np.where(live[:, None], signs, 0).astype(np.uint32)
    max_scale = scale.reshape(n, 8).max(axis=1)
    q = np.ones_like(xs) if qw is None else np.asarray(qw, F).reshape(n * 8, 32)
    d16, s = pick_scales(xs, q, signed_values(lat.values, g, signs.astype(np.uint8)),
                         max_scale)
    zero = max_scale == 0
    d16 = np.where(zero, np.float16(0), d16)
    # weights whose squares overflow float32: refused (as a float16 d that overflows)
    d16 = np.where(np.isfinite(_seqsum(x, x)), d16, np.float16(np.inf))
    out = np.zeros(n, dtype)
    out["d"] = d16
    g32 = g.astype(np.uint32)
    w0 = g32[:, 0] | (g32[:, 1] << 8) | (g32[:, 2] << 16) | (g32[:, 3] << 24)
    w1 = (signs[:, 0] | (signs[:, 1] << 7) | (signs[:, 2] << 14) | (signs[:, 3] << 21)
          | (s.reshape(-1).astype(np.uint32) << 28))
    qs = np.stack([w0, w1], axis=1).reshape(n, 16)
    out["qs"] = np.where(zero[:, None], np.uint32(0), qs)
    return out


def decode_iq2_xxs(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    qs = b["qs"].reshape(n, 8, 2)
    d = fp16_field(b["d"])
    db = d[:, None] * (F(0.5) + (qs[:, :, 1] >> np.uint32(28)).astype(F)) * F(0.25)
    k = np.arange(4, dtype=np.uint32)
    g = (qs[:, :, 0:1] >> (8 * k)) & np.uint32(255)                    # (n, 8, 4)
    sg = (qs[:, :, 1:2] >> (7 * k)) & np.uint32(127)
    gv = signed_values(grid_values("iq2_xxs"), g.reshape(n * 8, 4),
                       sg.reshape(n * 8, 4).astype(np.uint8))
    return (db.reshape(n * 8, 1) * np.abs(gv) * np.where(gv < 0, F(-1), F(1))).reshape(n, 256)


class IQ2_XXS(GGMLScheme):
    name = "iq2_xxs"
    nominal_bits = 2
    ggml_type = gguf.GGMLQuantizationType.IQ2_XXS
    llama_fallback = "iq4_nl"
    low_bit_only = True
    quant_kernel = "iq2"
    weighted_encoder = ("iq4_xs", "iq2_blocks")
    block_dtype = block_dtype([("d", "<f2"), ("qs", "<u4", (16,))], 66)

    def encode(self, x, qw=None):
        """qw: optional importance (n_blocks, 256), finite and >= 0 (llama.cpp's imatrix)."""
        return encode_iq2_xxs(np.asarray(x, F), qw, self.block_dtype)

    def decode(self, b):
        return decode_iq2_xxs(b)


def search_xs(lat, xval: np.ndarray, w: np.ndarray, eps=EPS
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ggml's IQ2_XS sub-block search (16 weights, kMaxQ 3): first scale max/5, 19 trial
    scales (5 + 0.1 is)/max, and at the end only the groups that were off the grid re-rounded
    at the final scale. xval, w (m, 16) -> (scale (m,), grid indices (m, 2), flip (m,))."""
    m = xval.shape[0]
    waux = np.sqrt(w).astype(F)
    mx = xval.max(axis=1)
    live = mx >= eps
    mxs = np.where(live, mx, F(1))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        scale = mxs / F(2 * KMAXQ - 1)
        best = np.zeros(m, F)
        lv = np.zeros((m, 16), np.int64)
        g = np.zeros((m, 2), np.int64)
        on = np.ones((m, 2), bool)
        for is_ in range(-9, 10):
            iscale = (F(2 * KMAXQ - 1) + F(is_) * F(0.1)) / mxs
            la, ga, oa = grid_codes(lat, xval, waux, iscale, F(1) / iscale)
            sqx, sq2 = _qsums(w, xval, la)
            ok = live & (sq2 > 0) & (sqx * sqx > best * sq2)
            sn = sqx / np.where(ok, sq2, F(1))
            scale = np.where(ok, sn, scale)
            best = np.where(ok, sn * sqx, best)
            lv = np.where(ok[:, None], la, lv)
            g = np.where(ok[:, None], ga, g)
            on = np.where(ok[:, None], oa, on)
        redo = live & (~on).any(axis=1) & (scale > 0)
        iscale = F(1) / np.where(redo, scale, F(1))
        la, ga, _ = grid_codes(lat, xval, waux, iscale, scale)
        grp = redo[:, None] & ~on
        lv = np.where(np.repeat(grp, 8, axis=1), la, lv)
        g = np.where(grp, ga, g)
        sqx, sq2 = _qsums(w, xval, lv)
        scale = np.where(redo & (sq2 > 0), sqx / np.where(sq2 > 0, sq2, F(1)), scale)
    flip = live & (scale < 0)
    scale = np.where(flip, -scale, scale)
    return np.where(live, scale, F(0)).astype(F), np.where(live[:, None], g, 0), flip


def encode_iq2_xs(x: np.ndarray, qw: np.ndarray | None, dtype: np.dtype) -> np.ndarray:
    lat = lattice("iq2_xs")
    n = x.shape[0]
    w = weights_of(x, qw)
    xs = x.reshape(n * 16, 16)
    ws = w.reshape(n * 16, 16)
    xval, signs = take_signs(xs, ws)
    scale, g, flip = search_xs(lat, xval, ws)
    signs = np.where(flip[:, None], (~signs) & np.uint8(127), signs)
    live = scale > 0
    g = np.where(live[:, None], g, 0)
    signs = np.where(live[:, None], signs, 0).astype(np.uint8)
    max_scale = scale.reshape(n, 16).max(axis=1)
    q = np.ones_like(xs) if qw is None else np.asarray(qw, F).reshape(n * 16, 16)
    d16, s = pick_scales(xs, q, signed_values(lat.values, g, signs), max_scale)
    zero = max_scale == 0
    d16 = np.where(zero, np.float16(0), d16)
    d16 = np.where(np.isfinite(_seqsum(x, x)), d16, np.float16(np.inf))
    out = np.zeros(n, dtype)
    out["d"] = d16
    qs = (g.astype(np.uint16) | (signs.astype(np.uint16) << np.uint16(9))).reshape(n, 32)
    out["qs"] = np.where(zero[:, None], np.uint16(0), qs)
    s = s.astype(np.uint8)
    out["scales"] = np.where(zero[:, None], np.uint8(0), s[:, 0::2] | (s[:, 1::2] << np.uint8(4)))
    return out


def decode_iq2_xs(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    d = fp16_field(b["d"])
    sc = b["scales"].astype(np.int64)
    s = np.stack([sc & 15, sc >> 4], axis=2).reshape(n, 16)
    db = d[:, None] * (F(0.5) + s.astype(F)) * F(0.25)
    qs = b["qs"].reshape(n * 16, 2)
    gv = signed_values(grid_values("iq2_xs"), (qs & np.uint16(511)).astype(np.int64),
                       (qs >> np.uint16(9)).astype(np.uint8))
    return (db.reshape(n * 16, 1) * np.abs(gv) * np.where(gv < 0, F(-1), F(1))).reshape(n, 256)


class IQ2_XS(GGMLScheme):
    name = "iq2_xs"
    nominal_bits = 2
    ggml_type = gguf.GGMLQuantizationType.IQ2_XS
    llama_fallback = "iq4_nl"
    low_bit_only = True
    quant_kernel = "iq2"
    weighted_encoder = ("iq4_xs", "iq2_blocks")
    kernel_family = "iq2_xxs"
    block_dtype = block_dtype([("d", "<f2"), ("qs", "<u2", (32,)), ("scales", "u1", (8,))], 74)

    def encode(self, x, qw=None):
        """qw: optional importance (n_blocks, 256), finite and >= 0 (llama.cpp's imatrix)."""
        return encode_iq2_xs(np.asarray(x, F), qw, self.block_dtype)

    def decode(self, b):
        return decode_iq2_xs(b)


#: IQ2_S stores d = max scale / 31 * 0.9875 (ggml); the candidates start there
D_FACTORS_S = tuple(F(F(0.9875) * f) for f in D_FACTORS)
EPS_S = F(1e-8)


def encode_iq2_s(x: np.ndarray, qw: np.ndarray | None, dtype: np.dtype) -> np.ndarray:
    """ggml's quantize_row_iq2_s_impl search (sigma2 = 2 sum x^2 / 256; without importance the
    weights 0.25 sigma2 + x^2, as ggml, which quantizes IQ2_S without an imatrix too), then
    the workbench's d and 4-bit scales."""
    lat = lattice("iq2_s")
    n = x.shape[0]
    sigma2 = F(2) * _seqsum(x, x) / F(256)
    if qw is None:
        w = (F(0.25) * sigma2[:, None] + x * x).astype(F)
    else:
        w = (np.asarray(qw, F) * np.sqrt(sigma2[:, None] + x * x)).astype(F)
    xs = x.reshape(n * 16, 16)
    ws = w.reshape(n * 16, 16)
    xval, signs = take_signs(xs, ws, parity=False)
    scale, g, flip = search_xs(lat, xval, ws, EPS_S)
    signs = np.where(flip[:, None], ~signs, signs)
    live = scale > 0
    g = np.where(live[:, None], g, 0)
    signs = np.where(live[:, None], signs, 0).astype(np.uint8)
    max_scale = scale.reshape(n, 16).max(axis=1)
    q = np.ones_like(xs) if qw is None else np.asarray(qw, F).reshape(n * 16, 16)
    d16, s = pick_scales(xs, q, signed_values(lat.values, g, signs, parity=False), max_scale,
                         D_FACTORS_S)
    zero = max_scale == 0
    d16 = np.where(zero, np.float16(0), d16)
    d16 = np.where(np.isfinite(_seqsum(x, x)), d16, np.float16(np.inf))
    out = np.zeros(n, dtype)
    out["d"] = d16
    g = g.reshape(n, 32)
    out["qs"] = np.concatenate([(g & 255).astype(np.uint8), signs.reshape(n, 32)], axis=1)
    hi = (g >> 8).astype(np.uint8).reshape(n, 8, 4) << (2 * np.arange(4, dtype=np.uint8))
    out["qh"] = hi.sum(axis=2).astype(np.uint8)
    s = s.astype(np.uint8)
    out["scales"] = s[:, 0::2] | (s[:, 1::2] << np.uint8(4))
    for f in ("qs", "qh", "scales"):
        out[f] = np.where(zero[:, None], np.uint8(0), out[f])
    return out


def decode_iq2_s(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    d = fp16_field(b["d"])
    sc = b["scales"].astype(np.int64)
    s = np.stack([sc & 15, sc >> 4], axis=2).reshape(n, 16)
    db = d[:, None] * (F(0.5) + s.astype(F)) * F(0.25)
    qs = b["qs"].astype(np.int64)
    hi = (b["qh"].astype(np.int64)[:, :, None] >> (2 * np.arange(4))) & 3
    g = qs[:, :32] | (hi.reshape(n, 32) << 8)
    gv = signed_values(grid_values("iq2_s"), g.reshape(n * 16, 2),
                       b["qs"][:, 32:].reshape(n * 16, 2), parity=False)
    return (db.reshape(n * 16, 1) * np.abs(gv) * np.where(gv < 0, F(-1), F(1))).reshape(n, 256)


class IQ2_S(GGMLScheme):
    name = "iq2_s"
    nominal_bits = 2
    ggml_type = gguf.GGMLQuantizationType.IQ2_S
    llama_fallback = "iq4_nl"
    low_bit_only = True
    quant_kernel = "iq2"
    weighted_encoder = ("iq4_xs", "iq2_blocks")
    kernel_family = "iq2_xxs"
    block_dtype = block_dtype([("d", "<f2"), ("qs", "u1", (64,)), ("qh", "u1", (8,)),
                               ("scales", "u1", (8,))], 82)

    def encode(self, x, qw=None):
        """qw: optional importance (n_blocks, 256), finite and >= 0 (llama.cpp's imatrix)."""
        return encode_iq2_s(np.asarray(x, F), qw, self.block_dtype)

    def decode(self, b):
        return decode_iq2_s(b)

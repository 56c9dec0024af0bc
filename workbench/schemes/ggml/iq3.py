"""IQ3_XXS and IQ3_S (GGML types 18 and 21): llama.cpp's 3-bit lattice types. Each group of 4
weights is one point of a fixed grid of magnitudes (kernels/iq3_grids.py) with its own signs;
each 32-weight sub-block has a 4-bit scale l, each 256-weight super-block a float16 d:

    w = d * (2l + 1) * v * sign      (v = grid byte / 4 for IQ3_XXS: 1, 3, ..., 13, 15.5;
                                      grid byte for IQ3_S: 1, 3, ..., 15)

(ggml decodes IQ3_XXS as d * (0.5 + l) * 0.5 * byte: the same value.)

Layouts (ggml-common.h):

* ``block_iq3_xxs``, 98 bytes, 3.0625 bits/weight: d (fp16) | qs[64] (grid index of group g
  of sub-block ib at 8 ib + g, 256 points) | u32[8] per sub-block: bits 7k..7k+6 the signs of
  weights 8k..8k+7 (bit i: weight i negative), the eighth sign the parity of the seven
  (``ksigns_iq2xs``), bits 28..31 the scale l.
* ``block_iq3_s``, 110 bytes, 3.4375 bits/weight: d | qs[64] (low 8 bits of the 9-bit index
  into 512 points) | qh[8] (bit g of qh[ib]: bit 8 of group g's index) | signs[32] (byte
  4 ib + k: one bit per weight 8k..8k+7) | scales[4] (l of sub-block 2i in the low nibble of
  byte i, 2i + 1 in the high one).

Quantize: the workbench's own search, built on ggml's (``quantize_row_iq3_xxs_impl``,
``quantize_row_iq3_s_impl``) with ggml's weights given an importance, qw * sqrt(2 sum(x^2)/256
+ x^2), and those with qw = 1 without one (ggml: x^2), made to lose less:

* each super-block is first scaled by a power of two (max |x| in [0.5, 1); exact), so no sum
  overflows or underflows; a super-block below 1e-15 is zeros;
* signs: x < 0; IQ3_XXS's parity (an odd count of negatives in 8 weights) flips the sign of
  the weight of least w x^2 (ggml's rule); magnitudes then xv = |x| (that one -|x|);
* per sub-block (largest xv below 1e-8: scale 0), 31 trial inverse scales
  id = (15 + 0.2 t) / max xv, t = -15..15, and a 32nd, 1 / max xv (ggml's miss constant
  groups, whose level-7 diagonal is off the IQ3_XXS grid): each xv rounded to level clamp(rint((id xv - 1)/2),
  0, 7); a group whose four levels are a grid point takes it, else the grid point among its
  neighbours (``iq3_grids.neighbours``, ggml's sets) of least sum w (v/id - xv)^2 (ggml weighs
  this by sqrt(w); the first of equal ones); least-squares scale sum w xv v / sum w v^2, the
  trial of largest (sum w xv v)^2 / sum w v^2 wins (the first on ties). Then once more at the
  winner's scale, kept if better;
* d: ggml stores fp16(1.0125 max_scale / 31) (IQ3_S 1.033) and l = rint((31 s / max_scale
  - 1) / 2). Here, from ggml's l, two rounds of: d = the least-squares super-scale for those l
  (sum (2l+1) A / sum (2l+1)^2 B, A = sum w xv v, B = sum w v^2 of each sub-block), l = the
  level nearest each sub-block's own scale for that d. d is stored as float16 and l chosen
  again for the stored d;
* last, each sub-block's groups are chosen again at its final scale d (2l + 1), kept if its
  weighted error drops.

Every sum is float32 in index order from 0, so the numba kernel kernels/iq3_quant.py gives the
same bytes. For the same importance the weighted error is below ggml's (docs/schemes.md).
"""

from __future__ import annotations

import gguf
import numpy as np

from kernels import iq3_grids
from workbench.schemes.ggml.common import GGMLScheme, block_dtype, fp16_field, to_fp16
from workbench.schemes.ggml.search import _seqsum

F = np.float32
EPS_SUB = F(1e-8)           # a sub-block whose largest |x| (normalized) is below: scale 0
EPS_SUPER = F(1e-15)        # a super-block whose largest |x| is below: zeros
NTRIAL = 15
_SHIFT = np.array([0, 3, 6, 9])

# true decoded magnitudes (units of d (2l + 1)) of each grid point, float32 (points, 4)
VALUES = {"xxs": (iq3_grids.IQ3XXS_GRID.astype(F) / F(4)),
          "s": iq3_grids.IQ3S_GRID.astype(F)}
for _v in VALUES.values():
    _v.setflags(write=False)


def normalize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x (n, 256) -> (x * 2^-e with max |x| in [0.5, 1) per row, e int32); rows below
    EPS_SUPER -> zeros, e 0."""
    amax = np.abs(x).max(axis=1)
    _, e = np.frexp(amax)
    e = np.where(amax < EPS_SUPER, 0, e).astype(np.int32)
    xn = np.ldexp(x, -e[:, None]).astype(F)
    xn[amax < EPS_SUPER] = 0
    return xn, e


def search_weights(xn: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    """qw * sqrt(2 sum(x^2)/256 + x^2) per super-block (rows of xn); without qw, qw = 1 (ggml
    weighs by x^2 there: on SmolLM2's weights that costs ~1.6x the squared error)."""
    sigma2 = _seqsum(xn, xn) * F(2.0 / 256)
    r = np.sqrt(sigma2[:, None] + xn * xn)
    return r if qw is None else np.asarray(qw, F) * r


def signs_and_magnitudes(xs: np.ndarray, w: np.ndarray, parity: bool):
    """xs, w (m, 32) -> (xv (m, 32) magnitudes, neg bool (m, 32): the stored sign bits)."""
    neg = xs < 0
    xv = np.abs(xs)
    if parity:
        m = xs.shape[0]
        n8 = neg.reshape(m * 4, 8)
        odd = (n8.sum(axis=1) % 2) == 1
        wx = (w * xs * xs).reshape(m * 4, 8)          # (w x) x, as the kernel
        imin = wx.argmin(axis=1)
        rows = np.nonzero(odd)[0]
        n8[rows, imin[rows]] ^= True
        xv8 = xv.reshape(m * 4, 8)
        xv8[rows, imin[rows]] = -xv8[rows, imin[rows]]
    return xv, neg


def assign(xv: np.ndarray, w: np.ndarray, iscale: np.ndarray, scale: np.ndarray,
           which: str) -> np.ndarray:
    """Grid index of every group of 4 (m, 8): the rounded point when on the grid, else its
    neighbour of least weighted error at `scale` (m,)."""
    kmap, nbr = iq3_grids.neighbours(which)
    vals = VALUES[which]
    m = xv.shape[0]
    with np.errstate(invalid="ignore", over="ignore"):
        lv = np.rint(F(0.5) * (iscale[:, None] * xv - F(1)))
    lv = np.clip(np.nan_to_num(lv, nan=0.0), 0, 7).astype(np.int64)
    u = (lv.reshape(m, 8, 4) << _SHIFT).sum(axis=2)
    gi = kmap[u]
    off = gi < 0
    if off.any():
        cand = nbr[u[off]]                                    # (k, M)
        xo = xv.reshape(m, 8, 4)[off]                         # (k, 4)
        wo = w.reshape(m, 8, 4)[off]
        so = np.broadcast_to(scale[:, None], (m, 8))[off]     # (k,)
        cv = vals[np.maximum(cand, 0)]                        # (k, M, 4)
        d2 = np.zeros(cand.shape, F)
        with np.errstate(over="ignore", invalid="ignore"):
            for i in range(4):
                diff = so[:, None] * cv[:, :, i] - xo[:, None, i]
                d2 = d2 + wo[:, None, i] * diff * diff
        d2[cand < 0] = np.inf
        d2[np.isnan(d2)] = np.inf
        gi[off] = cand[np.arange(cand.shape[0]), d2.argmin(axis=1)]
    return gi


def group_sums(xv: np.ndarray, w: np.ndarray, gi: np.ndarray, which: str):
    """(sum w xv v, sum w v v) per row, index order (v: the grid magnitudes of gi)."""
    q = VALUES[which][gi].reshape(xv.shape)
    a = np.zeros(xv.shape[0], F)
    b = np.zeros(xv.shape[0], F)
    for j in range(xv.shape[1]):
        wq = w[:, j] * q[:, j]
        a = a + wq * xv[:, j]
        b = b + wq * q[:, j]
    return a, b


def sub_block_search(xv: np.ndarray, w: np.ndarray, which: str):
    """Per sub-block (rows of xv, w (m, 32)): (grid indices (m, 8), scale, A, B)."""
    m = xv.shape[0]
    mx = xv.max(axis=1)
    tiny = mx < EPS_SUB
    mxs = np.where(tiny, F(1), mx)
    gi = np.zeros((m, 8), np.int64)
    scale = mxs / F(15)
    best = np.zeros(m, F)
    a_best = np.zeros(m, F)
    b_best = np.zeros(m, F)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for t in range(-NTRIAL, NTRIAL + 2):
            # the last trial: every level 0 (v = 1: constants, which ggml's trials miss)
            iscale = (F(15) + F(t) * F(0.2)) / mxs if t <= NTRIAL else F(1) / mxs
            g = assign(xv, w, iscale, F(1) / iscale, which)
            a, b = group_sums(xv, w, g, which)
            better = (b > 0) & (a > 0) & (a * a > best * b)
            sc = a / np.where(better, b, F(1))
            scale = np.where(better, sc, scale)
            best = np.where(better, sc * a, best)
            a_best = np.where(better, a, a_best)
            b_best = np.where(better, b, b_best)
            gi[better] = g[better]
        ok = scale > 0
        g = assign(xv, w, F(1) / np.where(ok, scale, F(1)), scale, which)
        a, b = group_sums(xv, w, g, which)
        better = ok & (b > 0) & (a > 0) & (a * a > best * b)
        scale = np.where(better, a / np.where(better, b, F(1)), scale)
        a_best = np.where(better, a, a_best)
        b_best = np.where(better, b, b_best)
        gi[better] = g[better]
    gi[tiny] = 0
    return gi, np.where(tiny, F(0), scale), np.where(tiny, F(0), a_best), \
        np.where(tiny, F(0), b_best), tiny


def _levels(d: np.ndarray, s: np.ndarray) -> np.ndarray:
    """The 4-bit l nearest each scale s (n, 8) for super-scale d (n,): rint((s/d - 1)/2)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        idd = np.where(d > 0, F(1) / np.where(d > 0, d, F(1)), F(0)).astype(F)
        lv = np.rint(F(0.5) * (idd[:, None] * s - F(1)))
    return np.clip(np.nan_to_num(lv), 0, 15).astype(np.int64)


def super_scale(s: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ggml's d = max s / 31, then two least-squares rounds (module docstring); (n,) float32."""
    d = s.max(axis=1) / F(31)
    for _ in range(2):
        k = (2 * _levels(d, s) + 1).astype(F)
        num = np.zeros(s.shape[0], F)
        den = np.zeros(s.shape[0], F)
        for ib in range(8):
            num = num + k[:, ib] * a[:, ib]
            den = den + (k[:, ib] * k[:, ib]) * b[:, ib]
        ok = (num > 0) & (den > 0)
        d = np.where(ok, num / np.where(ok, den, F(1)), d).astype(F)
    return d


def encode_fields(x: np.ndarray, qw: np.ndarray | None, which: str):
    """x (n, 256) float32 -> (d float16 (n,), grid indices (n, 8, 8), neg (n, 256), l (n, 8))."""
    n = x.shape[0]
    xn, e = normalize(x)
    w = search_weights(xn, qw)
    xs = xn.reshape(n * 8, 32)
    ws = w.reshape(n * 8, 32)
    xv, neg = signs_and_magnitudes(xs, ws, which == "xxs")
    gi, s, a, b, tiny = sub_block_search(xv, ws, which)
    gi = gi.reshape(n, 8, 8)
    s, a, b = s.reshape(n, 8), a.reshape(n, 8), b.reshape(n, 8)
    zero = s.max(axis=1) <= 0
    dn = np.where(zero, F(0), super_scale(s, a, b)).astype(F)
    dh = to_fp16(np.ldexp(dn, e).astype(F))
    dhn = np.ldexp(dh.astype(F), -e).astype(F)           # the stored d, normalized
    lv = _levels(dhn, s)
    # the groups once more at each sub-block's final scale, kept when its error drops
    sf = (dhn[:, None] * (2 * lv + 1).astype(F)).reshape(-1)
    ok = sf > 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        g2 = assign(xv, ws, np.where(ok, F(1) / np.where(ok, sf, F(1)), F(0)), sf, which)
        a2, b2 = group_sums(xv, ws, g2, which)
        a1, b1 = a.reshape(-1), b.reshape(-1)
        keep = ok & (sf * (sf * b2 - F(2) * a2) < sf * (sf * b1 - F(2) * a1))
    gi = gi.reshape(-1, 8)
    gi[keep] = g2[keep]
    gi = gi.reshape(n, 8, 8)
    gi[zero] = 0
    lv[zero] = 0
    neg = neg.reshape(n, 256)
    neg[zero] = False
    return dh, gi, neg, lv


def _sign_bytes(neg: np.ndarray) -> np.ndarray:
    """neg (n, 256) -> (n, 32) bytes: bit i of byte k = weight 8k + i negative."""
    bits = neg.reshape(neg.shape[0], 32, 8).astype(np.uint8)
    return (bits << np.arange(8, dtype=np.uint8)).sum(axis=2).astype(np.uint8)


def _grid_magnitudes(idx: np.ndarray, which: str) -> np.ndarray:
    grid = iq3_grids.IQ3XXS_GRID if which == "xxs" else iq3_grids.IQ3S_GRID
    return grid[idx].astype(F)


class IQ3_XXS(GGMLScheme):
    name = "iq3_xxs"
    nominal_bits = 3
    ggml_type = gguf.GGMLQuantizationType.IQ3_XXS
    llama_fallback = "iq4_nl"
    low_bit_only = True
    quant_kernel = "iq3"
    weighted_encoder = ("iq3",)
    block_dtype = block_dtype([("d", "<f2"), ("qs", "u1", (64,)), ("ss", "<u4", (8,))], 98)

    def encode(self, x, qw=None):
        """qw: optional importance (n_blocks, 256), finite and >= 0 (methods/ggml_weighted)."""
        dh, gi, neg, lv = encode_fields(np.asarray(x, F), qw, "xxs")
        n = x.shape[0]
        sb = _sign_bytes(neg).reshape(n, 8, 4).astype(np.uint32) & np.uint32(127)
        ss = (sb[:, :, 0] | (sb[:, :, 1] << 7) | (sb[:, :, 2] << 14) | (sb[:, :, 3] << 21)
              | (lv.astype(np.uint32) << 28))
        out = np.empty(n, self.block_dtype)
        out["d"] = dh
        out["qs"] = gi.reshape(n, 64).astype(np.uint8)
        out["ss"] = ss
        return out

    def decode(self, b):
        n = b.shape[0]
        d = fp16_field(b["d"])
        ss = b["ss"].astype(np.uint32)                                   # (n, 8)
        db = d[:, None] * (F(0.5) + (ss >> 28).astype(F)) * F(0.5)      # (n, 8)
        s7 = (ss[:, :, None] >> np.array([0, 7, 14, 21], np.uint32)) & np.uint32(127)
        sgn = iq3_grids.KSIGNS_IQ2XS[s7]                                 # (n, 8, 4)
        bits = (sgn[..., None] >> np.arange(8, dtype=np.uint8)) & 1      # (n, 8, 4, 8)
        g = _grid_magnitudes(b["qs"].reshape(n, 8, 8), "xxs").reshape(n, 8, 32)
        v = db[:, :, None] * g
        return np.where(bits.reshape(n, 8, 32) == 1, -v, v).reshape(n, 256)


class IQ3_S(GGMLScheme):
    name = "iq3_s"
    nominal_bits = 3
    ggml_type = gguf.GGMLQuantizationType.IQ3_S
    llama_fallback = "iq4_nl"
    low_bit_only = True
    quant_kernel = "iq3"
    weighted_encoder = ("iq3",)
    kernel_family = "iq3_xxs"
    block_dtype = block_dtype([("d", "<f2"), ("qs", "u1", (64,)), ("qh", "u1", (8,)),
                               ("signs", "u1", (32,)), ("scales", "u1", (4,))], 110)

    def encode(self, x, qw=None):
        """qw: optional importance (n_blocks, 256), finite and >= 0 (methods/ggml_weighted)."""
        dh, gi, neg, lv = encode_fields(np.asarray(x, F), qw, "s")
        n = x.shape[0]
        out = np.empty(n, self.block_dtype)
        out["d"] = dh
        out["qs"] = (gi.reshape(n, 64) & 255).astype(np.uint8)
        hi = ((gi >> 8) & 1).astype(np.uint8)                            # (n, 8, 8)
        out["qh"] = (hi << np.arange(8, dtype=np.uint8)).sum(axis=2).astype(np.uint8)
        out["signs"] = _sign_bytes(neg)
        lo = lv.astype(np.uint8)
        out["scales"] = lo[:, 0::2] | (lo[:, 1::2] << np.uint8(4))
        return out

    def decode(self, b):
        n = b.shape[0]
        d = fp16_field(b["d"])
        sc = b["scales"].astype(np.int32)
        lv = np.stack([sc & 15, sc >> 4], axis=2).reshape(n, 8)
        db = d[:, None] * (1 + 2 * lv).astype(F)
        hi = (b["qh"][:, :, None].astype(np.int64) >> np.arange(8)) & 1   # (n, 8, 8)
        idx = b["qs"].reshape(n, 8, 8).astype(np.int64) | (hi << 8)
        g = _grid_magnitudes(idx, "s").reshape(n, 8, 32)
        bits = (b["signs"].reshape(n, 8, 4)[..., None] >> np.arange(8, dtype=np.uint8)) & 1
        v = db[:, :, None] * g
        return np.where(bits.reshape(n, 8, 32) == 1, -v, v).reshape(n, 256)

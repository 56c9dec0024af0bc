"""numba quantize kernel for IQ4_XS (256-weight super-blocks of IQ4_NL's codebook with 6-bit
sub-block scales), bit-identical to ``workbench.schemes.ggml.iq4_xs`` and so to llama.cpp's
``quantize_iq4_xs`` with and without an importance matrix (float32 operation for operation,
sums in index order from 0, no FMA contraction).

Per super-block: the search weights (x^2, or qw * sqrt(sigma2 + x^2), sigma2 = 2 * sum(x^2) /
256), then for its eight sub-blocks the 16 candidate inverse scales side by side (128 vector
lanes, one per sub-block and candidate, each lane's two sums still sequential over its 32
weights), each sub-block's winner picked in ggml's order, the float32 super-scale d = -(the
sub-block scale of largest magnitude) / 32, the 6-bit codes rint(scale / d) and the indices
re-rounded with 1/(d * l).

``iq4xs_encode`` flags per row: 1 the float16 d overflows, 2 NaN/Inf in the row, 4 a
reciprocal scale that is not finite (the reference decides). Imports nothing from
``workbench``.
"""

from __future__ import annotations

from . import _numba_prelude  # noqa: F401  (before numba: cheaper start)

import numpy as np
from numba import njit, prange

from .cpu_common import _f32_to_f16_bits, _row_flag
from .host import readonly
from .iq4nl_quant import KVALUES, MIDS, _nearest, _nearest_value

_J = dict(cache=True, nogil=True)
_P = dict(cache=True, nogil=True, parallel=True)

F32 = np.float32
NC = 16                              # candidates: 1/(-max/-127), then (t - 127)/max, t = -7..7
LANES = 8 * NC
EPS = np.float32(1e-15)


@njit(**_J)
def _enc_super(x, qrow, o, weighted, kv, mids, xr, wr, iscale, sqx, sq2, scales, out, p):
    """The super-block x[o:o+256] -> out[p:p+136]; returns its flags."""
    sigma2 = F32(0.0)
    if weighted:
        for j in range(256):
            sigma2 = sigma2 + x[o + j] * x[o + j]
        sigma2 = sigma2 * F32(2.0 / 256)
    tiny = np.zeros(8, np.bool_)
    for ib in range(8):
        b = o + 32 * ib
        amax = F32(0.0)
        mx = F32(0.0)
        for j in range(32):
            a = abs(x[b + j])
            if a > amax:
                amax = a
                mx = x[b + j]
        tiny[ib] = amax < EPS
        if tiny[ib]:
            mx = F32(1.0)
        iscale[ib * NC] = F32(1.0) / (-mx / kv[0])
        for c in range(1, NC):
            iscale[ib * NC + c] = F32(c - 135) / mx            # (t - 127)/max, t = c - 8
        for j in range(32):
            v = x[b + j]
            if weighted:
                wv = qrow[b + j] * np.sqrt(sigma2 + v * v)
            else:
                wv = v * v
            for c in range(NC):
                xr[j * LANES + ib * NC + c] = v
                wr[j * LANES + ib * NC + c] = wv
    for l in range(LANES):
        sqx[l] = F32(0.0)
        sq2[l] = F32(0.0)
    for j in range(32):
        base = j * LANES
        for l in range(LANES):
            v = xr[base + l]
            q = _nearest_value(iscale[l] * v)
            wq = wr[base + l] * q
            sqx[l] = sqx[l] + wq * v
            sq2[l] = sq2[l] + wq * q
    amax_s = F32(0.0)
    max_s = F32(0.0)
    for ib in range(8):
        l0 = ib * NC
        d = sqx[l0] / sq2[l0] if sq2[l0] > 0 else F32(0.0)
        best = d * sqx[l0]
        for c in range(1, NC):
            a = sqx[l0 + c]
            s2 = sq2[l0 + c]
            if s2 > 0 and a * a > best * s2:
                d = a / s2
                best = d * a
        if tiny[ib]:
            d = F32(0.0)
        if not (abs(d) < np.inf):
            return 4                         # sums overflowed: the reference decides
        scales[ib] = d
        if abs(d) > amax_s:
            amax_s = abs(d)
            max_s = d
    d = -max_s / F32(32.0)
    h = _f32_to_f16_bits(d)
    out[p] = np.uint8(h & 255)
    out[p + 1] = np.uint8(h >> 8)
    if (h & 0x7C00) == 0x7C00:               # Inf or NaN
        return 1
    inv = F32(0.0)
    if d != 0:
        inv = F32(1.0) / d
        if not (abs(inv) < np.inf):
            return 4
    sh = 0
    for ib in range(8):
        l = np.int64(np.rint(inv * scales[ib]))
        l = min(max(l, -32), 31)
        dl = d * F32(l)
        idl = F32(0.0)
        if dl != 0:
            idl = F32(1.0) / dl
            if not (abs(idl) < np.inf):
                return 4
        b = o + 32 * ib
        for j in range(16):
            lo = _nearest(idl * x[b + j], mids)
            hi = _nearest(idl * x[b + j + 16], mids)
            out[p + 8 + 16 * ib + j] = np.uint8(lo | (hi << 4))
        u = l + 32
        if ib % 2 == 0:
            out[p + 4 + ib // 2] = np.uint8(u & 15)
        else:
            out[p + 4 + ib // 2] |= np.uint8((u & 15) << 4)
        sh |= (u >> 4) << (2 * ib)
    out[p + 2] = np.uint8(sh & 255)
    out[p + 3] = np.uint8(sh >> 8)
    return 0


@njit(**_P)
def iq4xs_encode(w, qw, weighted, kv, mids, blocks, flags):
    """IQ4_XS blocks of w (rows, cols % 256 == 0) into blocks (rows, cols/256*136); with
    `weighted`, qw (rows or 1, cols) is the importance (finite, >= 0)."""
    rows, cols = w.shape
    nb = cols // 256
    nch = min(rows, 256)                     # chunks of rows: one scratch set each
    for ch in prange(nch):
        xr = np.empty(32 * LANES, np.float32)
        wr = np.empty(32 * LANES, np.float32)
        iscale = np.empty(LANES, np.float32)
        sqx = np.empty(LANES, np.float32)
        sq2 = np.empty(LANES, np.float32)
        scales = np.empty(8, np.float32)
        for r in range(ch * rows // nch, (ch + 1) * rows // nch):
            row = w[r]
            qrow = qw[r if qw.shape[0] > 1 else 0]
            out = blocks[r]
            f = _row_flag(row)
            if f == 0:
                for b in range(nb):
                    f |= _enc_super(row, qrow, b * 256, weighted, kv, mids, xr, wr, iscale,
                                    sqx, sq2, scales, out, b * 136)
            flags[r] = f


def encode_blocks(w2d: np.ndarray, blocks: np.ndarray, flags: np.ndarray,
                  qw: np.ndarray | None = None) -> None:
    """Fill blocks (rows, cols/256*136 uint8) and flags (rows uint8) from float32 w2d; qw:
    optional importance (rows or 1, cols), finite and >= 0."""
    weighted = qw is not None
    q = readonly(np.ascontiguousarray(qw, np.float32).reshape(-1, w2d.shape[1]) if weighted
                 else np.ones((1, 1), np.float32))
    iq4xs_encode(readonly(w2d), q, weighted, KVALUES, MIDS, blocks, flags)

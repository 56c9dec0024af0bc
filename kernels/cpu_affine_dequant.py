"""numba CPU kernels of the packed-code (affine) family, decoding: every integer scheme,
NF4, ternary and FP8 codes through a lookup table -- dequantize and the fused error (each
row decoded into a scratch buffer and folded into the error sums). Imports nothing from
``workbench``."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .cpu_common import F0, NO_ACC, NO_OUT, NO_W, _J, _P, _acc_row

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
def affine_rows(codes, bits, lut, scales, zeros, has_zero, gs, bpr, w, out, acc):
    """Decode each row into out's row; or, where out has no rows, compare it with w's row and
    put the error sums in acc's (_acc_row). One kernel for both entries, so that the row
    decoder is compiled once (as cpu_ggml.ggml_rows)."""
    write = out.shape[0] > 0
    rows = out.shape[0] if write else w.shape[0]
    cols = out.shape[1] if write else w.shape[1]
    for r in prange(rows):
        buf = out[r] if write else np.empty(cols, np.float32)
        _affine_row(codes, bits, lut, scales, zeros, has_zero, cols, gs, bpr, np.int64(r),
                    buf)
        if not write:
            _acc_row(w[r], buf, acc[r])


def affine_dequant(codes, bits, lut, scales, zeros, has_zero, gs, bpr, out):
    """out (rows, cols) float32 = the codes decoded."""
    affine_rows(codes, bits, lut, scales, zeros, has_zero, gs, bpr, NO_W, out, NO_ACC)


def affine_error(codes, bits, lut, scales, zeros, has_zero, gs, bpr, w, acc):
    """acc (rows, 5) float64 = per row the error sums of the decoded codes against w."""
    affine_rows(codes, bits, lut, scales, zeros, has_zero, gs, bpr, w, NO_OUT, acc)

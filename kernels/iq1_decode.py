"""numba CPU block decoders of IQ1_S and IQ1_M (layouts: workbench/schemes/ggml/iq1.py), called
by cpu_ggml's row dispatcher; the same float32 values as the numpy decoders:
w = (d (2l + 1)) (grid byte + delta). Imports nothing from ``workbench``."""

from __future__ import annotations

import numpy as np
from numba import njit

from .cpu_common import _J
from .iq1_grids import DELTA, GRID

_G1 = GRID.astype(np.float32)         # numba freezes the global table as a constant


@njit(**_J)
def _u16(src, p):
    return np.int64(src[p]) | (np.int64(src[p + 1]) << 8)


@njit(**_J)
def iq1_s_row(src, f16, dst):           # d | qs[32] | qh u16[8]: 3 index bits x 4, l << 12, sign
    for b in range(dst.shape[0] // 256):
        p = b * 50
        o = b * 256
        d = f16[_u16(src, p)]
        for ib in range(8):
            qh = _u16(src, p + 34 + 2 * ib)
            dl = d * np.float32(2 * ((qh >> 12) & 7) + 1)
            delta = -DELTA if qh & 0x8000 else DELTA
            for k in range(4):
                gi = np.int64(src[p + 2 + 4 * ib + k]) | (((qh >> (3 * k)) & 7) << 8)
                for j in range(8):
                    dst[o + 32 * ib + 8 * k + j] = dl * (_G1[gi, j] + delta)


@njit(**_J)
def iq1_m_row(src, f16, dst):           # qs[32] | qh[16] | scales u16[4] (l x 4, d's nibble)
    for b in range(dst.shape[0] // 256):
        p = b * 56
        o = b * 256
        h = ((_u16(src, p + 48) >> 12) | ((_u16(src, p + 50) >> 8) & 0xF0)
             | ((_u16(src, p + 52) >> 4) & 0xF00) | (_u16(src, p + 54) & 0xF000))
        d = f16[h]
        for ib in range(16):
            lv = (_u16(src, p + 48 + 2 * (ib // 4)) >> (3 * (ib % 4))) & 7
            dl = d * np.float32(2 * lv + 1)
            qh = np.int64(src[p + 32 + ib])
            for k in range(2):
                gi = np.int64(src[p + 2 * ib + k]) | (((qh >> (4 * k)) & 7) << 8)
                delta = -DELTA if (qh >> (4 * k + 3)) & 1 else DELTA
                for j in range(8):
                    dst[o + 16 * ib + 8 * k + j] = dl * (_G1[gi, j] + delta)

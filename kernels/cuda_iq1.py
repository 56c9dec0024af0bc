"""CUDA element decoders of IQ1_S and IQ1_M (cuda_kernels.py's device-function signature: the
float32 weight at (r, c); layouts: workbench/schemes/ggml/iq1.py), the same values as the
numpy decoders: (d (2l + 1)) (grid byte + delta). Imports nothing from ``workbench``."""

from __future__ import annotations

import numpy as np
from numba import cuda

from .iq1_grids import DELTA, GRID

_G1F = GRID.astype(np.float32)        # a numpy global: a constant array on the device


@cuda.jit(device=True)
def _u16(q, p):
    return np.int32(q[p]) | (np.int32(q[p + 1]) << 8)


@cuda.jit(device=True)
def d_iq1_s(q, s, z, lut, prm, r, c, cols):
    p = r * prm[0] + (c // 256) * 50
    e = c % 256
    ib = e // 32
    k = (e % 32) // 8
    qh = _u16(q, p + 34 + 2 * ib)
    dl = lut[_u16(q, p)] * np.float32(2 * ((qh >> 12) & 7) + 1)
    gi = np.int32(q[p + 2 + 4 * ib + k]) | (((qh >> (3 * k)) & 7) << 8)
    return dl * (_G1F[gi, e % 8] + (-DELTA if qh & 0x8000 else DELTA))


@cuda.jit(device=True)
def d_iq1_m(q, s, z, lut, prm, r, c, cols):
    p = r * prm[0] + (c // 256) * 56
    e = c % 256
    ib = e // 16
    k = (e % 16) // 8
    h = ((_u16(q, p + 48) >> 12) | ((_u16(q, p + 50) >> 8) & 0xF0)
         | ((_u16(q, p + 52) >> 4) & 0xF00) | (_u16(q, p + 54) & 0xF000))
    lv = (_u16(q, p + 48 + 2 * (ib // 4)) >> (3 * (ib % 4))) & 7
    dl = lut[h] * np.float32(2 * lv + 1)
    qh = np.int32(q[p + 32 + ib])
    gi = np.int32(q[p + 2 * ib + k]) | (((qh >> (4 * k)) & 7) << 8)
    return dl * (_G1F[gi, e % 8] + (-DELTA if (qh >> (4 * k + 3)) & 1 else DELTA))

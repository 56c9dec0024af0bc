"""numba CPU block decoders of the lattice i-quants IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S
(layouts: ggml-common.h; workbench/schemes/ggml), called by cpu_ggml's row dispatcher
(``cpu_ggml.iq_rows``); the same float32 values as the numpy decoders. Imports nothing from
``workbench``."""

from __future__ import annotations

import numpy as np
from numba import njit

from .cpu_common import _J, _h, _u32
from .iq3_grids import IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS
from .iq_lattice import KSIGNS, grid_values

_G3XXS = IQ3XXS_GRID.astype(np.float32)      # grid magnitudes (constants of the decoders)
_G3S = IQ3S_GRID.astype(np.float32)
_KS = KSIGNS_IQ2XS.astype(np.int64)
_IQ2XXS_GRID = grid_values("iq2_xxs")        # numba freezes these global tables as constants
_IQ2XS_GRID = grid_values("iq2_xs")
_IQ2S_GRID = grid_values("iq2_s")


@njit(**_J)
def iq3_xxs_row(src, f16, dst):            # d | qs[64] grid indices | u32[8]: 4x7 sign bits, l << 28
    for b in range(dst.shape[0] // 256):
        p = b * 98
        o = b * 256
        d = _h(src, p, f16)
        for ib in range(8):
            aux = _u32(src, p + 66 + 4 * ib)
            db = d * (np.float32(0.5) + np.float32(aux >> 28)) * np.float32(0.5)
            for l in range(4):
                sg = _KS[(aux >> (7 * l)) & 127]
                for h in range(2):
                    gi = np.int64(src[p + 2 + 8 * ib + 2 * l + h])
                    for j in range(4):
                        v = db * _G3XXS[gi, j]
                        dst[o + 32 * ib + 8 * l + 4 * h + j] = -v if (sg >> (4 * h + j)) & 1 else v


@njit(**_J)
def iq3_s_row(src, f16, dst):              # d | qs[64] | qh[8] | signs[32] | scales[4]
    for b in range(dst.shape[0] // 256):
        p = b * 110
        o = b * 256
        d = _h(src, p, f16)
        for ib in range(8):
            ls = (np.int64(src[p + 106 + ib // 2]) >> (4 * (ib % 2))) & 15
            db = d * np.float32(1 + 2 * ls)
            qh = np.int64(src[p + 66 + ib])
            for g in range(8):
                gi = np.int64(src[p + 2 + 8 * ib + g]) | (((qh >> g) & 1) << 8)
                sg = np.int64(src[p + 74 + 4 * ib + g // 2])
                for j in range(4):
                    v = db * _G3S[gi, j]
                    dst[o + 32 * ib + 4 * g + j] = -v if (sg >> (4 * (g % 2) + j)) & 1 else v


@njit(**_J)
def iq2_xxs_row(src, f16, dst):            # d | per 32: u32 4 grid bytes | u32 4x7 signs, 4-bit s
    for b in range(dst.shape[0] // 256):
        p = b * 66
        o = b * 256
        d = _h(src, p, f16)
        for ib in range(8):
            q = p + 2 + 8 * ib
            aux = (np.int64(src[q + 4]) | (np.int64(src[q + 5]) << 8)
                   | (np.int64(src[q + 6]) << 16) | (np.int64(src[q + 7]) << 24))
            db = d * (np.float32(0.5) + np.float32(aux >> 28)) * np.float32(0.25)
            for k in range(4):
                g = np.int64(src[q + k])
                sg = np.int64(KSIGNS[(aux >> (7 * k)) & 127])
                for j in range(8):
                    v = db * np.float32(_IQ2XXS_GRID[g, j])
                    dst[o + 32 * ib + 8 * k + j] = -v if (sg >> j) & 1 else v


@njit(**_J)
def iq2_xs_row(src, f16, dst):             # d | qs u16[32]: 9-bit grid index, 7 signs | scales[8]
    for b in range(dst.shape[0] // 256):
        p = b * 74
        o = b * 256
        d = _h(src, p, f16)
        for ib in range(16):
            s = (np.int64(src[p + 66 + ib // 2]) >> (4 * (ib % 2))) & 15
            db = d * (np.float32(0.5) + np.float32(s)) * np.float32(0.25)
            for k in range(2):
                q = p + 2 + 4 * ib + 2 * k
                v16 = np.int64(src[q]) | (np.int64(src[q + 1]) << 8)
                g = v16 & 511
                sg = np.int64(KSIGNS[v16 >> 9])
                for j in range(8):
                    v = db * np.float32(_IQ2XS_GRID[g, j])
                    dst[o + 16 * ib + 8 * k + j] = -v if (sg >> j) & 1 else v


@njit(**_J)
def iq2_s_row(src, f16, dst):              # d | qs[32] | signs[32] | qh[8] | scales[8]
    for b in range(dst.shape[0] // 256):
        p = b * 82
        o = b * 256
        d = _h(src, p, f16)
        for ib in range(16):
            s = (np.int64(src[p + 74 + ib // 2]) >> (4 * (ib % 2))) & 15
            db = d * (np.float32(0.5) + np.float32(s)) * np.float32(0.25)
            for k in range(2):
                i8 = 2 * ib + k
                hi = (np.int64(src[p + 66 + i8 // 4]) >> (2 * (i8 % 4))) & 3
                g = np.int64(src[p + 2 + i8]) | (hi << 8)
                sg = np.int64(src[p + 34 + i8])
                for j in range(8):
                    v = db * np.float32(_IQ2S_GRID[g, j])
                    dst[o + 16 * ib + 8 * k + j] = -v if (sg >> j) & 1 else v

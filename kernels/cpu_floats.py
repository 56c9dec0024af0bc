"""numba CPU kernels of the float family: fp16/bf16 through a 65536-entry table, fp32.
Imports nothing from ``workbench``."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .cpu_common import _J, _P, _acc_row

# ---------------------------------------------------------------- 16-bit floats, fp32
@njit(**_J)
def _u16_row(data, table, dst):
    for i in range(dst.shape[0]):
        dst[i] = table[data[i]]


@njit(**_P)
def u16_dequant(data, table, out):
    for r in prange(out.shape[0]):
        _u16_row(data[r], table, out[r])


@njit(**_P)
def u16_error(data, table, w, acc):
    rows, cols = w.shape
    for r in prange(rows):
        buf = np.empty(cols, np.float32)
        _u16_row(data[r], table, buf)
        _acc_row(w[r], buf, acc[r])


@njit(**_P)
def f32_copy(src, out):
    for r in prange(out.shape[0]):
        s = src[r]
        d = out[r]
        for i in range(d.shape[0]):
            d[i] = s[i]


@njit(**_P)
def f32_error(src, w, acc):
    for r in prange(w.shape[0]):
        _acc_row(w[r], src[r], acc[r])

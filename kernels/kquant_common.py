"""Scalar numba helpers shared by the searched K-quant kernels (``kquant_affine``,
``kquant_affine_search``, ``kquant_sym``): exact float32 rounding, powers of two and float16
conversions built from bits (no libm call), and the float16 super-scale of a scaled value.
Imports nothing from ``workbench``."""

from __future__ import annotations

import numpy as np
from numba import njit

from .cpu_common import _f32_to_f16_bits

_J = dict(cache=True, nogil=True, error_model="numpy")
_P = dict(cache=True, nogil=True, parallel=True, error_model="numpy")

U = np.uint64
F0 = np.float32(0.0)
F1 = np.float32(1.0)
F2 = np.float32(2.0)
INF = np.float32(np.inf)
MAGIC = np.float32(12582912.0)      # 1.5 * 2**23: (v + MAGIC) - MAGIC == rint(v) for |v| < 2**22
EPS32 = np.float32(1e-15)           # workbench.schemes.ggml.common.GROUP_EPS as numpy compares it


@njit(**_J)
def _rc(v, hi):
    """clip(rint(v), 0, hi); NaN -> 0. Exact for every v (outside +-2**22 the clip decides)."""
    q = (v + MAGIC) - MAGIC
    q = q if q > F0 else F0
    return q if q < hi else hi


@njit(**_J)
def _pow2(e):
    """2.0**e as float64 for -1022 <= e <= 1023 (built from its bits: no libm call)."""
    return np.int64((e + 1023) << 52).view(np.float64)


@njit(**_J)
def _frexp_e(a):
    """math.frexp(a)[1] for a normal, positive float64 a (from its bits)."""
    return ((np.float64(a).view(np.int64) >> 52) & 0x7FF) - 1022


@njit(**_J)
def _f16_to_f32(h):
    s = (h >> 15) & 1
    e = (h >> 10) & 31
    m = h & 1023
    if e == 0:
        v = np.float64(m) * _pow2(-24)
    elif e == 31:
        v = np.inf if m == 0 else np.nan
    else:
        v = np.float64(m + 1024) * _pow2(e - 25)
    return np.float32(-v if s else v)


@njit(**_J)
def _ldexp32(v, e):
    """float32 v * 2**e, rounded once (numpy's ldexp on float32); |e| <= 300."""
    return np.float32(np.float64(v) * _pow2(e))


@njit(**_J)
def _fp16_scale(v, e):
    """(float16 bits of v * 2**e, that float16's value * 2**-e as float32)."""
    h = _f32_to_f16_bits(_ldexp32(v, e))
    return h, _ldexp32(_f16_to_f32(h), -e)


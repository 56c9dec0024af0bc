"""The numba.cuda decoder of Apple MLX's modes: one device function with the common signature
of kernels.cuda_kernels (run by its generic ``dequant_kernel`` / ``error_kernel``), bit for bit
the CPU kernels (kernels.cpu_mlx) and the numpy reference.

    d_mlx(q, s, z, lut, prm, r, c, cols)
        q    uint8   the codes' bit stream (mlx's uint32 words as bytes)
        s    float32 the scales per group, then (affine) the biases per group
        lut  float32 affine: the float16 table (float16 rounding); microscaling: code values
        prm  int64   [bits, group, mode (kernels.spec.MLX_MODES), dtype (MLX_DTYPES), groups]

Affine rounds ``scale · q`` and then ``+ bias`` to the scales' dtype; the product goes through
``_mul`` so that NVVM cannot contract it with the sum into an FMA.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from .cuda_kernels import _fp8_code, _mul


@cuda.jit(device=True)
def _bf16_value(h):
    e = h >> 7
    m = h & 127
    if e == 0:
        return np.float32(math.ldexp(np.float64(m), -133))
    if e == 255:
        return np.float32(math.inf)
    return np.float32(math.ldexp(1.0 + m / 128.0, int(e - 127)))


@cuda.jit(device=True)
def _rnd(x, dt, lut):
    """float32 x rounded (nearest even) to float16 (dt 1) or bfloat16 (dt 2); dt 0: x."""
    if dt == 0:
        return x
    a = abs(np.float64(x))
    neg = math.copysign(1.0, np.float64(x)) < 0
    if dt == 1:
        h = _fp8_code(a, 10, 15, 0x7C00)
        return -lut[h] if neg else lut[h]
    v = _bf16_value(_fp8_code(a, 7, 127, 0x7F80))
    return -v if neg else v


@cuda.jit(device=True)
def d_mlx(q, s, z, lut, prm, r, c, cols):
    bits = prm[0]
    i = np.int64(r) * cols + c
    p = i * bits
    b = p >> 3
    sh = p & 7
    v = np.int32(q[b]) >> sh
    if sh + bits > 8:
        v |= np.int32(q[b + 1]) << (8 - sh)
    code = v & ((1 << bits) - 1)
    g = i // prm[1]
    if prm[2] == 0:
        dt = prm[3]
        y = _rnd(_mul(s[g], np.float32(code)), dt, lut)
        return _rnd(np.float32(y + s[prm[4] + g]), dt, lut)
    return np.float32(lut[code] * s[g])

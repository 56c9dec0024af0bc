"""Widening conversions of stored weights to float32, in parallel (numba; the GIL released).

``f16_to_f32`` moves the float16 fields into float32 ones with integer operations that
vectorize (a subnormal float16 is its 10-bit code times 2**-24, exact in float32; Inf and NaN
keep their payload, as numpy's conversion does), so the result is numpy's bit for bit, which
tests/kernels/test_convert.py checks on all 65,536 codes; twice the speed of the 65,536-entry
table gather it replaces, and F16 sources are widened once per weight on every export.
``bf16_to_f32`` shifts the bits. Both are exact conversions. Imports nothing from
``workbench``.
"""

from __future__ import annotations

from . import _numba_prelude  # noqa: F401  (before numba: cheaper start)
import numpy as np
from numba import njit, prange

@njit(inline="always", cache=True, nogil=True)
def _f16_bits_to_f32_bits(h):
    em = np.uint32(h) & np.uint32(0x7FFF)                     # exponent and mantissa
    sign = (np.uint32(h) & np.uint32(0x8000)) << np.uint32(16)
    sub = np.float32(np.int32(em)) * np.float32(2.0 ** -24)   # zero or subnormal: exact
    norm = (em << np.uint32(13)) + np.uint32(0x38000000)      # rebias 15 -> 127
    norm = norm + np.uint32(0x38000000) if em >= np.uint32(0x7C00) else norm   # Inf / NaN
    return sign | (np.float32(sub).view(np.uint32) if em < np.uint32(0x400) else norm)


@njit(cache=True, nogil=True, parallel=True)
def _widen_f16(src, dst):
    for i in prange(src.size):
        dst[i] = _f16_bits_to_f32_bits(src[i])


@njit(cache=True, nogil=True, parallel=True)
def _shift16(src, dst):
    for i in prange(src.size):
        dst[i] = np.uint32(src[i]) << np.uint32(16)


def _flat_u16(a: np.ndarray) -> np.ndarray:
    from .host import readonly
    return readonly(np.ascontiguousarray(a).reshape(-1).view(np.uint16))


def _out(a: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    if out is None:
        return np.empty(a.shape, np.float32)
    if out.dtype != np.float32 or out.size != a.size or not out.flags.c_contiguous:
        raise ValueError("out must be a C-contiguous float32 array of the input's size")
    return out


def f16_to_f32(a: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float16 (or its uint16 bits) -> float32 of the same shape (into `out` when given: a
    C-contiguous float32 array of the same size, e.g. a reused scratch buffer)."""
    out = _out(a, out)
    _widen_f16(_flat_u16(a), out.reshape(-1).view(np.uint32))
    return out


def bf16_to_f32(a: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """bfloat16 bits (uint16) -> float32 of the same shape (into `out` when given)."""
    out = _out(a, out)
    _shift16(_flat_u16(a), out.reshape(-1).view(np.uint32))
    return out

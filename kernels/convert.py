"""Widening conversions of stored weights to float32, in parallel (numba; the GIL released).

``f16_to_f32`` gathers from a 65,536-entry table made by numpy's own float16 -> float32
conversion, so the result is numpy's bit for bit (NaN payloads and subnormals included);
``bf16_to_f32`` shifts the bits. Both are exact conversions. Imports nothing from
``workbench``.
"""

from __future__ import annotations

from . import _numba_prelude  # noqa: F401  (before numba: cheaper start)
import numpy as np
from numba import njit, prange

_F16_TABLE = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(
    np.float32).view(np.uint32)


@njit(cache=True, nogil=True, parallel=True)
def _gather(src, table, dst):
    for i in prange(src.size):
        dst[i] = table[src[i]]


@njit(cache=True, nogil=True, parallel=True)
def _shift16(src, dst):
    for i in prange(src.size):
        dst[i] = np.uint32(src[i]) << np.uint32(16)


def _flat_u16(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.reshape(-1).view(np.uint16)


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
    _gather(_flat_u16(a), _F16_TABLE, out.reshape(-1).view(np.uint32))
    return out


def bf16_to_f32(a: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """bfloat16 bits (uint16) -> float32 of the same shape (into `out` when given)."""
    out = _out(a, out)
    _shift16(_flat_u16(a), out.reshape(-1).view(np.uint32))
    return out

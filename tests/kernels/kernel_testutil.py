"""Helpers shared by the kernel tests (bit-exact comparisons, test weights)."""

from __future__ import annotations

import os

import numpy as np


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-for-bit equality (dtype, shape and every byte; NaN payloads included)."""
    a = np.ascontiguousarray(a)
    b = np.ascontiguousarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def same_qt(a, b) -> bool:
    return (a.scheme == b.scheme and tuple(a.shape) == tuple(b.shape)
            and set(a.arrays) == set(b.arrays)
            and all(same_bits(a.arrays[k], b.arrays[k]) for k in a.arrays))


def weights(shape, seed=0) -> np.ndarray:
    """Gaussian weights with per-row spread, a few outliers, exact zeros and a -0.0."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(shape).astype(np.float32)
    if w.ndim >= 2:
        w *= rng.uniform(0.01, 3.0, (shape[0],) + (1,) * (w.ndim - 1)).astype(np.float32)
    flat = w.reshape(-1)
    if flat.size > 8:
        flat[rng.integers(0, flat.size, 3)] *= 40
        flat[1] = 0.0
        flat[2] = -0.0
    return w



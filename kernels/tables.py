"""Lookup tables shared by the CPU and CUDA kernels (plain numpy, built once, lazily).

Every table is built *by numpy itself* from the reference decoders, so a kernel that looks a
code up is bit-identical to the reference by construction:

* ``f16_table()``  65536 float32: ``np.arange(65536, uint16).view(float16).astype(float32)``
  (exactly what ``float16_array.astype(np.float32)`` gives, NaN payloads included).
* ``bf16_table()`` 65536 float32: each code's bits shifted into the high half of a float32.
* ``int_lut(offset)`` 256 float32: ``float32(code - offset)`` for integer codes.
* ``IQ4NL_VALUES``: the 16 IQ4_NL levels (llama.cpp ``kvalues_iq4nl``).
* ``MXFP4_VALUES``: the 16 MXFP4 levels (``kvalues_mxfp4``, E2M1 doubled).
* ``ggml_lut()``: what the CUDA GGML decoders look up: the f16 table, IQ4NL_VALUES,
  MXFP4_VALUES, then 2^(e-128) for every E8M0 byte e (ggml_e8m0_to_fp32_half), then
  ``ue4m3_half_table()``.
* ``ue4m3_half_table()`` 256 float32: half the value of every UE4M3 byte (NVFP4's scales,
  ggml_ue4m3_to_fp32: the top bit ignored, 0 for 0x00 and 0x7F).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

IQ4NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10,
                         1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32)

MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12],
                        dtype=np.float32)


@lru_cache(maxsize=None)
def ggml_lut() -> np.ndarray:
    e8h = np.ldexp(np.float32(1), np.arange(256, dtype=np.int32) - 128).astype(np.float32)
    t = np.concatenate([f16_table(), IQ4NL_VALUES, MXFP4_VALUES, e8h, ue4m3_half_table()])
    t.setflags(write=False)
    return t


@lru_cache(maxsize=None)
def ue4m3_half_table() -> np.ndarray:
    b = np.arange(256, dtype=np.int32)
    e, m = (b >> 3) & 15, (b & 7).astype(np.float32)
    raw = np.where(e == 0, np.ldexp(m, -9),
                   np.ldexp((np.float32(1) + m / np.float32(8)).astype(np.float32), e - 7))
    t = np.where((b == 0) | (b == 0x7F), np.float32(0),
                 raw.astype(np.float32) * np.float32(0.5)).astype(np.float32)
    t.setflags(write=False)
    return t


@lru_cache(maxsize=None)
def f16_table() -> np.ndarray:
    t = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    t.setflags(write=False)
    return t


@lru_cache(maxsize=None)
def bf16_table() -> np.ndarray:
    t = (np.arange(65536, dtype=np.uint32) << np.uint32(16)).view(np.float32)
    t.setflags(write=False)
    return t


@lru_cache(maxsize=None)
def int_lut(offset: int) -> np.ndarray:
    t = (np.arange(256, dtype=np.int32) - np.int32(offset)).astype(np.float32)
    t.setflags(write=False)
    return t


def padded_lut(values: np.ndarray) -> np.ndarray:
    """A 256-entry float32 table starting with `values` (codes never exceed their bit width)."""
    t = np.zeros(256, dtype=np.float32)
    v = np.asarray(values, dtype=np.float32).reshape(-1)[:256]
    t[: v.size] = v
    return t

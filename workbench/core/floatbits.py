"""Float formats bit by bit, in numpy: the FP8 (E4M3, E5M2) decode tables and bfloat16 to and
from float32 (round to nearest even). Used by the loaders, the float schemes and the exporters.
"""

from __future__ import annotations

import numpy as np


def _fp8_table(exp_bits: int, man_bits: int, fn: bool) -> np.ndarray:
    """Decode all 256 codes of an FP8 format to float32 (fn: no inf, only 0x7F/0xFF NaN)."""
    bias = (1 << (exp_bits - 1)) - 1
    out = np.empty(256, dtype=np.float32)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        e = (code >> man_bits) & ((1 << exp_bits) - 1)
        m = code & ((1 << man_bits) - 1)
        if fn:
            if e == (1 << exp_bits) - 1 and m == (1 << man_bits) - 1:
                out[code] = np.nan
                continue
        elif e == (1 << exp_bits) - 1:
            out[code] = sign * np.inf if m == 0 else np.nan
            continue
        if e == 0:
            val = m / (1 << man_bits) * 2.0 ** (1 - bias)
        else:
            val = (1 + m / (1 << man_bits)) * 2.0 ** (e - bias)
        out[code] = sign * val
    return out


FP8_E4M3_TABLE = _fp8_table(4, 3, fn=True)
FP8_E5M2_TABLE = _fp8_table(5, 2, fn=False)
FP8_MAX = {"F8_E4M3": 448.0, "F8_E5M2": 57344.0}


def bf16_to_f32(u16: np.ndarray) -> np.ndarray:
    return (np.asarray(u16, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 bits (round to nearest even, NaN kept quiet) as uint16."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))
    out = rounded.astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16)
    return out

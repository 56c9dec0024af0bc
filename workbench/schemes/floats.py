"""Float schemes: keep/convert (fp32, fp16, bf16) and FP8 with a per-output-channel scale.

Range: the casts pass NaN/Inf through (they are values of the target type) but refuse a
*finite* weight that would become Inf: fp16 above 65519.99 (rounds past 65504), bf16 above
3.3961775e38 (rounds past 3.3895314e38; +-FLT_MAX does). FP8 schemes scale each row to the
format, so any |w| <= 1e38 fits (above that the float32 scale * FP8 value may overflow: refused).
"""

from __future__ import annotations

import numpy as np

from workbench.core.floatbits import FP8_E4M3_TABLE, FP8_E5M2_TABLE, bf16_to_f32, f32_to_bf16
from workbench.core.errors import WorkbenchError
from workbench.schemes.base import Scheme, matrix_shape


def _refuse_overflow(name: str, kind: str, largest: float, w: np.ndarray, out: np.ndarray) -> None:
    """A WorkbenchError when finite weights became Inf in the cast."""
    new_inf = np.isinf(out) & np.isfinite(w)
    if new_inf.any():
        v = float(np.abs(w[new_inf]).max())
        n = int(np.count_nonzero(new_inf))
        raise WorkbenchError(f"{name} cannot represent value {v:.3g} ({n} weight(s) beyond "
                             f"{kind}'s largest finite value {largest:.8g}; use fp32 or keep)")


class _Cast(Scheme, register=False):
    accepts_nonfinite = True
    itemsize = 4

    def nbytes(self, shape) -> int:
        r, c = matrix_shape(shape)
        return r * c * self.itemsize


class FP32(_Cast):
    name = "fp32"
    runtimes = ("llama.cpp",)
    llama_type = "f32"
    nominal_bits = 32
    itemsize = 4

    def kernel_layout(self) -> dict:
        return {"family": "f32", "name": self.name}

    def _quantize(self, w):
        return {"data": w.astype(np.float32, copy=True)}

    def _dequantize(self, arrays, rows, cols):
        return arrays["data"].astype(np.float32).reshape(rows, cols)


class FP16(_Cast):
    name = "fp16"
    runtimes = ("llama.cpp",)
    llama_type = "f16"
    nominal_bits = 16
    itemsize = 2

    def kernel_layout(self) -> dict:
        return {"family": "u16", "table": "f16", "name": self.name}

    def _quantize(self, w):
        with np.errstate(over="ignore"):
            data = w.astype(np.float16)
        _refuse_overflow(self.name, "float16", 65504.0, w, data)
        return {"data": data}

    def _dequantize(self, arrays, rows, cols):
        return arrays["data"].astype(np.float32).reshape(rows, cols)


class BF16(_Cast):
    name = "bf16"
    runtimes = ("llama.cpp",)
    llama_type = "bf16"
    kernel_family = "fp16"
    nominal_bits = 16
    itemsize = 2

    def kernel_layout(self) -> dict:
        return {"family": "u16", "table": "bf16", "name": self.name}

    def _quantize(self, w):
        data = f32_to_bf16(w)
        _refuse_overflow(self.name, "bfloat16", 3.3895314e38, w, bf16_to_f32(data))
        return {"data": data}

    def _dequantize(self, arrays, rows, cols):
        return bf16_to_f32(arrays["data"]).reshape(rows, cols)


def _positive_grid(table: np.ndarray) -> np.ndarray:
    """Finite non-negative values of an FP8 table, indexed by code 0..k (monotonic)."""
    vals = table[:128]
    k = int(np.argmax(~np.isfinite(vals))) if not np.isfinite(vals).all() else 128
    return vals[:k].astype(np.float32)


def round_to_fp8(x: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Round float32 to the nearest FP8 code (ties to even code), saturating at the max.

    `grid` is the table of non-negative finite values by code. Returns uint8 codes with the
    sign in bit 7.
    """
    a = np.abs(x).astype(np.float32)
    idx = np.searchsorted(grid, a, side="left")            # grid[idx-1] < a <= grid[idx]
    idx = np.clip(idx, 1, len(grid) - 1)
    lo, hi = grid[idx - 1], grid[idx]
    d_lo, d_hi = a - lo, hi - a
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & ((idx % 2) == 0))
    code = np.where(pick_hi, idx, idx - 1).astype(np.uint8)
    code = np.where(a >= grid[-1], len(grid) - 1, code).astype(np.uint8)
    code[a == 0] = 0
    return code | (np.signbit(x).astype(np.uint8) << 7)


class _FP8(Scheme, register=False):
    """FP8 codes with one float32 scale per output channel: scale = absmax / fp8_max."""

    nominal_bits = 8
    max_abs_weight = 1e38
    table: np.ndarray
    fmax: float

    def kernel_layout(self) -> dict:
        return {"family": "affine", "quant": "fp8", "values": self.table, "fmax": self.fmax,
                "name": self.name}

    def reference_needed(self, qt) -> bool:
        s = qt.arrays["scales"].astype(np.float64)
        return bool(not (s * self.fmax <= self.max_abs_weight).all())

    def nbytes(self, shape) -> int:
        r, c = matrix_shape(shape)
        return r * c + 4 * r

    def _quantize(self, w):
        amax = np.abs(w).max(axis=1) if w.shape[1] else np.zeros(w.shape[0], np.float32)
        scale = (amax / np.float32(self.fmax)).astype(np.float32)
        safe = np.where(scale > 0, scale, np.float32(1.0)).astype(np.float32)
        codes = round_to_fp8(w / safe[:, None], _positive_grid(self.table))
        return {"codes": codes, "scales": scale}

    def _dequantize(self, arrays, rows, cols):
        vals = self.table[arrays["codes"].reshape(rows, cols)]
        return (vals * arrays["scales"].astype(np.float32)[:, None]).astype(np.float32)


class FP8E4M3(_FP8):
    name = "fp8-e4m3"
    table = FP8_E4M3_TABLE
    fmax = 448.0


class FP8E5M2(_FP8):
    name = "fp8-e5m2"
    table = FP8_E5M2_TABLE
    fmax = 57344.0

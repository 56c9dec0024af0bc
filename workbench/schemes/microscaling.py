"""The microscaling FP4 schemes and block-scaled FP8 of vLLM's compressed-tensors checkpoints.

| scheme          | values | scales                                             | bits/weight |
|-----------------|--------|----------------------------------------------------|-------------|
| ``nvfp4-g16``   | E2M1   | FP8 E4M3 per 16 weights of a row, one FP32 global  | 4.5         |
| ``mxfp4-g32``   | E2M1   | E8M0 (a power of two) per 32 weights of a row      | 4.25        |
| ``fp8-e4m3-b128`` | E4M3 | FP32 per 128x128 block of the matrix               | ~8          |

The arrays are the compressed-tensors tensors as stored (``nvfp4-pack-quantized``,
``mxfp4-pack-quantized``, ``float-quantized`` with ``strategy: block``), so the export writes
them as they are and a source opens them as they are:

* FP4 ``packed`` uint8 (rows, cols/2): weight 2k in the low nibble of byte k, 2k+1 in the high
  one; a code is the E2M1 magnitude index (0 0.5 1 1.5 2 3 4 6) | sign << 3.
* NVFP4 ``scales`` uint8 (rows, cols/16): float8_e4m3fn bytes; ``global_scale`` float32 (1,):
  w = e2m1 * float32(scale / global_scale), what the package's ``dequantize`` and vLLM compute.
  Quantize as llm-compressor does: global = 448*6 / max|w| (float32), scale = e4m3(max|w_g|/6
  * global) rounded to nearest even, codes = E2M1 nearest of w / (scale/global), ties to the
  even index (the package's ``_round_to_fp4``), saturating at 6.
* MXFP4 ``scales`` uint8 (rows, cols/32): the E8M0 byte e, w = e2m1 * 2^(e-127); the shared
  exponent of the OCP MX spec, e = floor(log2 max|w_g|) - 2 + 127 (clamped to 0..254), codes as
  NVFP4's (values up to 8x the scale saturate at 6).
* FP8 block ``codes`` uint8 (rows, cols) E4M3FN bytes, ``scales`` float32 (ceil(rows/128),
  ceil(cols/128)): scale = max|w| of the block / 448, w = e4m3 * scale.
"""

from __future__ import annotations

import math

import numpy as np

from workbench.core.floatbits import FP8_E4M3_TABLE
from workbench.schemes.base import Scheme, matrix_shape
from workbench.schemes.floats import _positive_grid, round_to_fp8

F = np.float32
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], F)
#: float32 value of every FP4 code (magnitude index | sign << 3)
FP4_CODE_VALUES = np.concatenate([E2M1, -E2M1]).astype(F)
_E4M3_GRID = _positive_grid(FP8_E4M3_TABLE)


def fp4_codes(x: np.ndarray) -> np.ndarray:
    """Nearest E2M1 codes of float32 x (ties to the even index, saturating at 6; -0 keeps its
    sign bit, as the package's packer does)."""
    c = round_to_fp8(np.asarray(x, F), E2M1)
    return ((c & 7) | ((c >> 7) << 3)).astype(np.uint8)


def pack_fp4(codes: np.ndarray) -> np.ndarray:
    """(rows, cols) 4-bit codes -> (rows, cols/2) bytes: weight 2k low nibble, 2k+1 high."""
    c = np.asarray(codes, np.uint8)
    return (c[:, 0::2] | (c[:, 1::2] << 4)).astype(np.uint8)


def unpack_fp4(packed: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Float32 E2M1 values (rows, cols) of packed FP4 bytes."""
    p = np.asarray(packed, np.uint8).reshape(rows, cols // 2)
    out = np.empty((rows, cols), F)
    out[:, 0::2] = FP4_CODE_VALUES[p & 15]
    out[:, 1::2] = FP4_CODE_VALUES[p >> 4]
    return out


def e4m3_values(b: np.ndarray) -> np.ndarray:
    return FP8_E4M3_TABLE[np.asarray(b, np.uint8)].astype(F)


def e8m0_values(b: np.ndarray) -> np.ndarray:
    """2^(e-127) of E8M0 bytes (255, E8M0's NaN, gives inf as the package's decoder does)."""
    e = np.asarray(b, np.int32)
    with np.errstate(over="ignore"):
        return np.where(e == 255, F(np.inf), np.ldexp(F(1), e - 127)).astype(F)


def nvfp4_effective_scales(scales: np.ndarray, global_scale) -> np.ndarray:
    """float32(scale / global_scale) per group (the package divides in float32)."""
    g = np.asarray(global_scale, F).reshape(-1)[0]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return (e4m3_values(scales) / g).astype(F)


class _FP4(Scheme, register=False):
    nominal_bits = 4
    max_abs_weight = 1e38
    group: int = 16
    scale_decode = ""

    def kernel_layout(self) -> dict:
        return {"family": "affine", "quant": "fp4", "values": FP4_CODE_VALUES, "gran": self.group,
                "scale_decode": self.scale_decode, "scale_values": FP8_E4M3_TABLE,
                "name": self.name}

    def _codes(self, w: np.ndarray, eff: np.ndarray) -> np.ndarray:
        rows, cols = w.shape
        x = w.reshape(rows, cols // self.group, self.group)
        e = eff.reshape(rows, cols // self.group, 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            y = np.where(e > 0, x / np.where(e > 0, e, F(1)), F(0)).astype(F)
        return fp4_codes(y.reshape(rows, cols))


class NVFP4CT(_FP4):
    name = "nvfp4-g16"
    group = block_size = 16
    row_local = False                         # one global scale per tensor
    scale_decode = "e4m3g"

    def nbytes(self, shape) -> int:
        r, c = matrix_shape(shape)
        return r * c // 2 + r * (c // 16) + 4

    def _quantize(self, w):
        rows, cols = w.shape
        amax = F(np.abs(w).max()) if w.size else F(0)
        with np.errstate(divide="ignore", over="ignore"):
            g = F(448.0 * 6.0) / amax if amax > 0 else F(1)
        if not np.isfinite(g):
            g = F(2.0 ** 126)                 # max|w| below ~2e-35: every scale underflows
        ga = np.abs(w.reshape(rows, cols // 16, 16)).max(axis=2) if w.size else \
            np.zeros((rows, 0), F)
        s = round_to_fp8((ga / F(6) * g).astype(F), _E4M3_GRID)
        eff = nvfp4_effective_scales(s, g)
        return {"packed": pack_fp4(self._codes(w, eff)), "scales": s,
                "global_scale": np.array([g], F)}

    def _dequantize(self, arrays, rows, cols):
        v = unpack_fp4(arrays["packed"], rows, cols).reshape(rows, cols // 16, 16)
        eff = nvfp4_effective_scales(arrays["scales"], arrays["global_scale"])
        with np.errstate(over="ignore", invalid="ignore"):
            return (v * eff.reshape(rows, cols // 16, 1)).astype(F).reshape(rows, cols)


class MXFP4CT(_FP4):
    name = "mxfp4-g32"
    group = block_size = 32
    scale_decode = "e8m0"

    def nbytes(self, shape) -> int:
        r, c = matrix_shape(shape)
        return r * c // 2 + r * (c // 32)

    def _quantize(self, w):
        rows, cols = w.shape
        ga = np.abs(w.reshape(rows, cols // 32, 32)).max(axis=2) if w.size else \
            np.zeros((rows, 0), F)
        with np.errstate(divide="ignore"):
            _, ex = np.frexp(ga)                         # ga = m * 2^ex, m in [0.5, 1)
        e = np.where(ga > 0, np.clip(ex.astype(np.int32) - 1 - 2 + 127, 0, 254), 0)
        e = e.astype(np.uint8)
        return {"packed": pack_fp4(self._codes(w, e8m0_values(e))), "scales": e}

    def _dequantize(self, arrays, rows, cols):
        v = unpack_fp4(arrays["packed"], rows, cols).reshape(rows, cols // 32, 32)
        with np.errstate(over="ignore", invalid="ignore"):
            s = e8m0_values(arrays["scales"]).reshape(rows, cols // 32, 1)
            return (v * s).astype(F).reshape(rows, cols)


class FP8Block(Scheme):
    name = "fp8-e4m3-b128"
    nominal_bits = 8
    max_abs_weight = 1e38
    row_local = False                         # a scale covers 128 rows
    bs = 128

    def kernel_layout(self) -> dict:
        return {"family": "affine", "quant": "fp8-block", "values": FP8_E4M3_TABLE,
                "name": self.name}

    def nbytes(self, shape) -> int:
        r, c = matrix_shape(shape)
        return r * c + 4 * math.ceil(r / self.bs) * math.ceil(c / self.bs)

    def _blocks(self, a: np.ndarray, rows: int, cols: int) -> np.ndarray:
        """(rows, cols) -> (R, 128, C, 128) padded with zeros."""
        R, C = -(-rows // self.bs), -(-cols // self.bs)
        p = np.zeros((R * self.bs, C * self.bs), a.dtype)
        p[:rows, :cols] = a
        return p.reshape(R, self.bs, C, self.bs)

    def _expand(self, s: np.ndarray, rows: int, cols: int) -> np.ndarray:
        return np.repeat(np.repeat(s, self.bs, 0), self.bs, 1)[:rows, :cols]

    def _quantize(self, w):
        rows, cols = w.shape
        if not w.size:
            return {"codes": np.zeros((rows, cols), np.uint8),
                    "scales": np.zeros((-(-rows // self.bs), -(-cols // self.bs)), F)}
        amax = np.abs(self._blocks(w, rows, cols)).max(axis=(1, 3))
        scale = (amax / F(448.0)).astype(F)
        safe = self._expand(np.where(scale > 0, scale, F(1)).astype(F), rows, cols)
        codes = round_to_fp8((w / safe).astype(F), _E4M3_GRID)
        return {"codes": codes, "scales": scale}

    def _dequantize(self, arrays, rows, cols):
        v = e4m3_values(arrays["codes"]).reshape(rows, cols)
        s = self._expand(np.asarray(arrays["scales"], F), rows, cols)
        with np.errstate(over="ignore", invalid="ignore"):
            return (v * s).astype(F)

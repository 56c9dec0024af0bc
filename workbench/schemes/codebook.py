"""Codebook schemes: NF4 (QLoRA / bitsandbytes) and ternary, both in blocks of 64 along the input.

nf4-g64:     4-bit codes into the 16-value NF4 codebook; one float32 absmax per block.
             code = index of the nearest codebook value to w/absmax (ties to the lower index).
ternary-g64: codes {-1, 0, +1} (stored as 2-bit code+1); one float16 scale per block,
             scale = mean |w| of the block (BitNet b1.58 absmean); q = clip(rint(w/scale), -1, 1).

Range: nf4 refuses |w| > 1e38 (float32 headroom); a block whose absmax is so small that its
float32 inverse overflows (< 2.9e-39) is normalised by division instead (no NaN). ternary
refuses a block whose mean |w| exceeds its float16 scale's 65504 (instead of clamping it);
a mean below float16's smallest step stores the block as zeros.
"""

from __future__ import annotations

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.schemes.base import Scheme, matrix_shape
from workbench.schemes.packing import pack_bits, packed_nbytes, unpack_bits

NF4_CODEBOOK = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], dtype=np.float32)
NF4_MIDPOINTS = ((NF4_CODEBOOK[1:] + NF4_CODEBOOK[:-1]) / 2).astype(np.float32)


class NF4(Scheme):
    name = "nf4-g64"
    nominal_bits = 4
    block_size = 64
    max_abs_weight = 1e38

    def nbytes(self, shape) -> int:
        r, c = matrix_shape(shape)
        return packed_nbytes(r * c, 4) + 4 * (r * c // 64)

    def kernel_layout(self) -> dict:
        return {"family": "affine", "quant": "nf4", "values": NF4_CODEBOOK,
                "mids": NF4_MIDPOINTS, "gran": self.block_size, "name": self.name}

    def reference_needed(self, qt) -> bool:
        a = qt.arrays["absmax"]
        tiny = np.float32(1.0) / np.finfo(np.float32).max
        return bool(((a > 0) & (a < tiny)).any() or (a > self.max_abs_weight).any())

    def _quantize(self, w):
        b = w.reshape(-1, 64)
        absmax = np.abs(b).max(axis=1).astype(np.float32) if b.size else np.zeros(0, np.float32)
        with np.errstate(divide="ignore", over="ignore"):
            inv = np.where(absmax > 0, np.float32(1.0) / absmax, np.float32(0.0)).astype(np.float32)
        with np.errstate(invalid="ignore"):
            normed = b * inv[:, None]
        bad = ~np.isfinite(inv)
        if bad.any():   # absmax so small its inverse overflows: divide those blocks instead
            normed[bad] = b[bad] / absmax[bad][:, None]
        codes = np.searchsorted(NF4_MIDPOINTS, normed, side="left").astype(np.uint8)
        return {"codes": pack_bits(codes, 4), "absmax": absmax}

    def _dequantize(self, arrays, rows, cols):
        codes = unpack_bits(arrays["codes"], 4, rows * cols).reshape(-1, 64)
        vals = NF4_CODEBOOK[codes] * arrays["absmax"].astype(np.float32)[:, None]
        return vals.reshape(rows, cols)


class Ternary(Scheme):
    name = "ternary-g64"
    nominal_bits = 1.58
    block_size = 64

    def kernel_layout(self) -> dict:
        return {"family": "affine", "quant": "ternary", "gran": self.block_size,
                "name": self.name}

    def nbytes(self, shape) -> int:
        r, c = matrix_shape(shape)
        return packed_nbytes(r * c, 2) + 2 * (r * c // 64)

    def reference_needed(self, qt) -> bool:
        return bool((qt.arrays["scales"] == np.float16(65504.0)).any())

    def _quantize(self, w):
        b = w.reshape(-1, 64)
        scale = (np.abs(b).astype(np.float64).mean(axis=1) if b.size else np.zeros(0))
        if (scale > 65504.0).any():
            raise WorkbenchError(
                f"{self.name}'s float16 scale cannot represent a block mean |w| of "
                f"{float(scale.max()):.3g} (at most 65504; keep this tensor or use a channel scheme)")
        scale = scale.astype(np.float16)
        s32 = scale.astype(np.float32)
        with np.errstate(divide="ignore"):
            inv = np.where(s32 > 0, np.float32(1.0) / s32, np.float32(0.0)).astype(np.float32)
        q = np.clip(np.rint(b * inv[:, None]), -1, 1)
        return {"codes": pack_bits((q + 1).astype(np.uint8), 2), "scales": scale}

    def _dequantize(self, arrays, rows, cols):
        codes = unpack_bits(arrays["codes"], 2, rows * cols).reshape(-1, 64)
        q = codes.astype(np.float32) - np.float32(1.0)
        return (q * arrays["scales"].astype(np.float32)[:, None]).reshape(rows, cols)

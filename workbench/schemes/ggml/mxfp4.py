"""MXFP4 (OCP microscaling FP4, GGML type 39): 32-weight blocks, one E8M0 power-of-two scale
and 32 FP4 (E2M1) codes, 4.25 bits/weight.

Layout (17 bytes, ggml ``block_mxfp4``): e (uint8, E8M0), qs[16] (nibbles as Q4_0: byte j =
code j | code j+16 << 4).

    w = 2^(e - 128) * KVALUES[code]

KVALUES (ggml ``kvalues_mxfp4``, the E2M1 values doubled, a format fact): 0 1 2 3 4 6 8 12
0 -1 -2 -3 -4 -6 -8 -12. ggml decodes with half the E8M0 scale (``GGML_E8M0_TO_FP32_HALF``):
2^(e-127) / 2 = 2^(e-128) for every e (e < 2 are float32 subnormals, exact).

Quantize (ggml ``quantize_row_mxfp4_ref``, deterministic, no importance): e = floor(log2 max|w|)
- 2 + 127 (0 for an all-zero block), each code the first of the 16 with the least
|KVALUES[i] * d - w| in float32 (ties: the lower index, so +0 before -0 and the smaller
magnitude). Blocks with max|w| < 2^-125 give e < 0, which ggml casts to uint8 modulo 256 on
x86 (a huge scale, every code 0): done alike here, so the bytes stay llama.cpp's. No float16
field: nothing overflows. The numba kernel kernels/ggml_rtn_quant.py is bit-identical.
"""

from __future__ import annotations

import gguf
import numpy as np

from workbench.schemes.ggml.common import GGMLScheme, block_dtype, pack_nibbles, unpack_nibbles

F = np.float32
KVALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)
_KV = KVALUES.astype(F)


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """float32 2^(e - 128) of E8M0 bytes (ggml_e8m0_to_fp32_half)."""
    return np.ldexp(F(1), np.asarray(e, np.int32) - 128).astype(F)


def mxfp4_exponent(amax: np.ndarray) -> np.ndarray:
    """E8M0 byte of each block's max |w|: floor(log2f(amax)) - 2 + 127 modulo 256, 0 for 0.
    log2f as the float32 rounding of the float64 log2 (its floor equals glibc log2f's on every
    float within 300 ulps of each power of two, the only ones where they could differ;
    checked against libggml)."""
    amax = np.asarray(amax, F)
    pos = amax > 0
    a = np.where(pos, amax, F(1)).astype(np.float64)
    fl = np.floor(np.log2(a).astype(F)).astype(np.int64)
    return np.where(pos, (fl + 125) & 255, 0).astype(np.uint8)


def nearest_fp4(x: np.ndarray, d: np.ndarray) -> np.ndarray:
    """ggml best_index_mxfp4: per weight the first index of least float32 |KV[i]*d - x|."""
    best = np.zeros(x.shape, np.uint8)
    err = np.abs(_KV[0] * d[:, None] - x)
    for i in range(1, 16):
        e = np.abs(_KV[i] * d[:, None] - x)
        better = e < err
        best[better] = i
        err = np.where(better, e, err)
    return best


class MXFP4(GGMLScheme):
    name = "mxfp4"
    nominal_bits = 4
    ggml_type = gguf.GGMLQuantizationType.MXFP4
    quant_kernel = "rtn"
    scale_fields = ()
    block_dtype = block_dtype([("e", "u1"), ("qs", "u1", (16,))], 17)

    def encode(self, x):
        e = mxfp4_exponent(np.abs(x).max(axis=1))
        idx = nearest_fp4(x, e8m0_half(e))
        out = np.empty(x.shape[0], self.block_dtype)
        out["e"] = e
        out["qs"] = pack_nibbles(idx[:, :16], idx[:, 16:])
        return out

    def decode(self, b):
        lo, hi = unpack_nibbles(b["qs"])
        v = _KV[np.concatenate([lo, hi], axis=1)]
        return v * e8m0_half(b["e"])[:, None]

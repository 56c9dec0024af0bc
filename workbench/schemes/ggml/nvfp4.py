"""NVFP4 (GGML type 40): 64-weight blocks of four 16-weight sub-blocks, each with one unsigned
E4M3 (UE4M3) scale, and 64 FP4 (E2M1) codes, 4.5 bits/weight.

Layout (36 bytes, ggml ``block_nvfp4``): d[4] (UE4M3 bytes, one per sub-block), qs[32]
(sub-block s owns qs[8s .. 8s+8): byte j = code j | code j+8 << 4 of that sub-block).

    w = ue4m3_half(d[s]) * KVALUES[code]

KVALUES are MXFP4's (ggml ``kvalues_fp4``: the E2M1 values doubled), so ggml's decoder
``ggml_ue4m3_to_fp32`` returns half the UE4M3 value: exp = (b >> 3) & 15, man = b & 7,
raw = man * 2^-9 (exp 0) or (1 + man/8) * 2^(exp-7); 0 for b == 0 and b == 0x7F (its NaN); the
top bit is ignored. Every value is exact in float32.

Quantize (ggml ``quantize_row_nvfp4_ref``, deterministic, no importance): per sub-block
ue = ggml_fp32_to_ue4m3(float32(max|w| / 6)) (448 clamp, mantissa rounded half-up on the
fourth bit, 0x7E for exponents >= 15, subnormals man = int(x*512 + 0.5) capped at 7), then each
code the first of the 16 with the least float32 |KVALUES[i] * d - w| (as MXFP4). A sub-block
whose max|w|/6 exceeds 448 (max|w| > 2688) is refused ("weights too large", like the float16
scale overflow of the other types): ggml would clamp its scale to 448 and clip the weights.

llama.cpp also loads an optional per-tensor float32 ``<name>.scale`` of shape {1} (NVFP4's
"scale2") and multiplies the matmul output by it; ggml's own quantizer assumes none (1), and
so does this scheme: the GGUF holds the blocks only, which llama.cpp runs as is. The numba
kernel kernels/ggml_rtn_quant.py is bit-identical.
"""

from __future__ import annotations

import gguf
import numpy as np

from workbench.schemes.ggml.common import (GGMLScheme, ScaleOverflow, block_dtype, pack_nibbles,
                                           unpack_nibbles)
from workbench.schemes.ggml.mxfp4 import nearest_fp4

F = np.float32
_KV = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=F)
SUB = 16


def ue4m3_half(b: np.ndarray) -> np.ndarray:
    """float32 half value of UE4M3 bytes (ggml_ue4m3_to_fp32)."""
    b = np.asarray(b, np.uint8)
    e = (b.astype(np.int32) >> 3) & 15
    m = (b & 7).astype(np.int32)
    raw = np.where(e == 0, np.ldexp(m.astype(F), -9),
                   np.ldexp((F(1) + m.astype(F) / F(8)).astype(F), e - 7)).astype(F)
    return np.where((b == 0) | (b == 0x7F), F(0), raw * F(0.5)).astype(F)


def fp32_to_ue4m3(x: np.ndarray) -> np.ndarray:
    """ggml_fp32_to_ue4m3 of float32 x (x > 0 expected; <= 0 and NaN give 0)."""
    x = np.asarray(x, F)
    with np.errstate(invalid="ignore"):
        pos = x > 0
    x = np.where(pos, np.minimum(x, F(448)), F(1)).astype(F)
    bits = x.view(np.uint32)
    ex = ((bits >> 23) & 0xFF).astype(np.int32) - 127 + 7
    man = ((bits >> 20) & 7).astype(np.int32) + ((bits >> 19) & 1).astype(np.int32)
    carry = man > 7
    man = np.where(carry, 0, man)
    ex2 = np.where(carry, ex + 1, ex)
    normal = np.where(ex2 >= 15, 0x7E, (ex2 << 3) | man)
    sub = np.minimum((x * F(512) + F(0.5)).astype(np.int32), 7)   # C's (int) truncates
    sub = np.where(sub < 1, 0, sub)
    out = np.where(ex <= 0, sub, np.where(ex >= 15, 0x7E, normal))
    return np.where(pos, out, 0).astype(np.uint8)


class NVFP4(GGMLScheme):
    name = "nvfp4"
    nominal_bits = 4
    ggml_type = gguf.GGMLQuantizationType.NVFP4
    llama_fallback = "mxfp4"
    quant_kernel = "rtn"
    kernel_family = "mxfp4"
    scale_fields = ()
    block_dtype = block_dtype([("d", "u1", (4,)), ("qs", "u1", (32,))], 36)

    def encode(self, x):
        n = x.shape[0]
        xs = x.reshape(n * 4, SUB)
        amax = np.abs(xs).max(axis=1)
        ue = fp32_to_ue4m3((amax / F(6)).astype(F))
        idx = nearest_fp4(xs, ue4m3_half(ue))
        out = np.empty(n, self.block_dtype)
        out["d"] = ue.reshape(n, 4)
        out["qs"] = pack_nibbles(idx[:, :8], idx[:, 8:]).reshape(n, 32)
        return out

    def _check_scales(self, enc, x):
        amax = np.abs(x.reshape(-1, SUB)).max(axis=1) if x.size else np.zeros(0, F)
        if (amax / F(6) > F(448)).any():
            raise ScaleOverflow(
                f"cannot quantize with {self.name}: weights too large (max |w| = "
                f"{float(amax.max()):.4g}); the UE4M3 sub-block scale max|w|/6 exceeds 448 "
                "(limit max|w| = 2688; llama.cpp's quantizer would clip them)")

    def decode(self, b):
        n = b.shape[0]
        lo, hi = unpack_nibbles(b["qs"].reshape(n * 4, 8))
        v = _KV[np.concatenate([lo, hi], axis=1)]
        return (v * ue4m3_half(b["d"].reshape(n * 4))[:, None]).reshape(n, 64)

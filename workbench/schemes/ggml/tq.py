"""TQ1_0 and TQ2_0 (GGML types 34 and 35): llama.cpp's ternary types for BitNet b1.58 and
TriLM weights, 256-weight blocks of {-1, 0, +1} times one float16 scale.

    w = d * (t - 1),  t in {0, 1, 2}

Layouts (ggml-common.h ``block_tq2_0`` / ``block_tq1_0``):

* TQ2_0, 66 bytes, 2.0625 bits/weight: qs[64], d (fp16). Byte 32*h + m holds the trits of
  weights 128*h + m + 32*n in bits 2n..2n+1 (n = 0..3; any 2-bit value t decodes as t - 1).
* TQ1_0, 54 bytes, 1.6875 bits/weight: qs[48], qh[4], d (fp16). Five trits per byte as a
  base-3 fraction of 256: a byte holding trits t0..t4 (t0 the most significant) is
  ceil((sum t_k 3^(4-k)) * 256 / 243); trit k comes back as ((byte * 3^k mod 256) * 3) >> 8.
  qs[m] (m < 32) holds weights m + 32k, qs[32 + m] (m < 16) weights 160 + m + 16k, and qh[j]
  four trits of weights 240 + j + 4k (k = 0..3) then a fifth trit 0.

Quantize (ggml ``quantize_row_tq{1,2}_0_ref``, deterministic, no importance): d = max|w| of
the block in float32, t = lroundf(w * (1/d)) + 1 (half away from zero), the float16 of d
stored. A block whose 1/d overflows float32 (max|w| < 2^-128) gets t = 1 everywhere (ggml
computes lroundf of inf/NaN there, which glibc returns as LONG_MIN, whose low 32 bits + 1 are
1 again). The numba kernel kernels/ggml_rtn_quant.py is bit-identical.
"""

from __future__ import annotations

import gguf
import numpy as np

from workbench.schemes.ggml.common import GGMLScheme, block_dtype, fp16_field, safe_recip, to_fp16
from workbench.schemes.ggml.legacy import round_half_away

F = np.float32
_POW3 = np.array([1, 3, 9, 27, 81, 243], np.uint16)


def ternary_trits(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(float32 max|w| per block, trits uint8 (n, 256) in {0, 1, 2})."""
    amax = np.abs(x).max(axis=1)
    t = round_half_away(x * safe_recip(amax)[:, None]) + F(1)
    return amax, np.clip(t, 0, 2).astype(np.uint8)


def _pack5(t: np.ndarray, first: int) -> np.ndarray:
    """Bytes of trit planes t (n, P, M): byte m = ceil(sum_k t[k, m] 3^(first-k) * 256 / 243)."""
    q = np.zeros((t.shape[0], t.shape[2]), np.uint16)
    for k in range(t.shape[1]):
        q += t[:, k, :].astype(np.uint16) * _POW3[first - k]
    return ((q * 256 + 242) // 243).astype(np.uint8)


def _unpack5(b: np.ndarray, planes: int) -> np.ndarray:
    """Trit planes (n, planes, M) of bytes b (n, M)."""
    q = (b[:, None, :].astype(np.uint16) * _POW3[:planes, None]) & 255
    return ((q * 3) >> 8).astype(np.uint8)


class TQ2_0(GGMLScheme):
    name = "tq2_0"
    nominal_bits = 2
    ggml_type = gguf.GGMLQuantizationType.TQ2_0
    llama_fallback = "q4_0"
    quant_kernel = "rtn"
    kernel_family = "mxfp4"
    block_dtype = block_dtype([("qs", "u1", (64,)), ("d", "<f2")], 66)

    def encode(self, x):
        amax, t = ternary_trits(x)
        planes = t.reshape(-1, 2, 4, 32)                      # [block, h, k, m]
        qs = np.zeros((x.shape[0], 2, 32), np.uint8)
        for k in range(4):
            qs |= planes[:, :, k, :] << np.uint8(2 * k)
        out = np.empty(x.shape[0], self.block_dtype)
        out["qs"] = qs.reshape(-1, 64)
        out["d"] = to_fp16(amax)
        return out

    def decode(self, b):
        qs = b["qs"].reshape(-1, 2, 1, 32)
        t = (qs >> np.arange(0, 8, 2, dtype=np.uint8).reshape(1, 1, 4, 1)) & np.uint8(3)
        v = t.reshape(-1, 256).astype(np.int8) - np.int8(1)
        return v.astype(F) * fp16_field(b["d"])[:, None]


class TQ1_0(GGMLScheme):
    name = "tq1_0"
    nominal_bits = 2
    ggml_type = gguf.GGMLQuantizationType.TQ1_0
    llama_fallback = "q4_0"
    quant_kernel = "rtn"
    kernel_family = "mxfp4"
    block_dtype = block_dtype([("qs", "u1", (48,)), ("qh", "u1", (4,)), ("d", "<f2")], 54)

    def encode(self, x):
        amax, t = ternary_trits(x)
        out = np.empty(x.shape[0], self.block_dtype)
        out["qs"] = np.concatenate([_pack5(t[:, :160].reshape(-1, 5, 32), 4),
                                    _pack5(t[:, 160:240].reshape(-1, 5, 16), 4)], axis=1)
        out["qh"] = _pack5(t[:, 240:].reshape(-1, 4, 4), 4)   # 4 trits, then a 0 (x 3)
        out["d"] = to_fp16(amax)
        return out

    def decode(self, b):
        qs, qh = b["qs"], b["qh"]
        t = np.concatenate([_unpack5(qs[:, :32], 5).reshape(-1, 160),
                            _unpack5(qs[:, 32:], 5).reshape(-1, 80),
                            _unpack5(qh, 4).reshape(-1, 16)], axis=1)
        v = t.astype(np.int8) - np.int8(1)
        return v.astype(F) * fp16_field(b["d"])[:, None]

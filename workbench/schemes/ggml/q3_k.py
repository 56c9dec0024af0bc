"""Q3_K: 256-weight super-blocks of sixteen 16-weight sub-blocks, signed 3-bit codes,
3.4375 bits/weight.

Layout (110 bytes): hmask[32] (bit e//32 of byte e%32 is the high bit of code e), qs[64]
(low 2 bits, packed as Q2_K), scales[12] (sixteen 6-bit scales: low nibbles in bytes 0-7,
sub-block j<8 low / j>=8 high nibble of byte j%8; bits 4-5 of scale j at bits 2*(j//4) of
byte 8 + j%4; stored +32), d (fp16).

    w = d * (s_j - 32) * (q - 4)          (q = low | high << 2, in 0..7)

Quantize: sym_k.encode_sym_k (a searched scale per sub-block, then a search on the stored
6-bit sub-block scales and the float16 super-scale; plain or importance-weighted squared
error), see sym_k.py. The numba kernel kernels/kquant_sym.py is bit-identical to it.
"""

from __future__ import annotations

import gguf
import numpy as np

from workbench.schemes.ggml import kcommon as kc
from workbench.schemes.ggml.common import GGMLScheme, block_dtype, fp16_field
from workbench.schemes.ggml.sym_k import Q3_K_PARAMS, encode_sym_k

F = np.float32


def pack_scales_q3(s: np.ndarray) -> np.ndarray:
    s = s.astype(np.uint8)
    out = np.empty((s.shape[0], 12), np.uint8)
    out[:, :8] = (s[:, :8] & np.uint8(15)) | ((s[:, 8:] & np.uint8(15)) << np.uint8(4))
    hi = (s >> np.uint8(4)).reshape(-1, 4, 4)  # (n, group j//4, j%4)
    out[:, 8:] = hi[:, 0] | (hi[:, 1] << np.uint8(2)) | (hi[:, 2] << np.uint8(4)) | (hi[:, 3] << np.uint8(6))
    return out


def unpack_scales_q3(b: np.ndarray) -> np.ndarray:
    lo = np.concatenate([b[:, :8] & np.uint8(15), b[:, :8] >> np.uint8(4)], axis=1)
    shifts = (2 * np.arange(4, dtype=np.uint8)).reshape(1, 4, 1)
    hi = ((b[:, None, 8:] >> shifts) & np.uint8(3)).reshape(-1, 16)
    return lo | (hi << np.uint8(4))


class Q3_K(GGMLScheme):
    name = "q3_k"
    nominal_bits = 3
    ggml_type = gguf.GGMLQuantizationType.Q3_K
    llama_fallback = "q4_0"
    family = "K-quants"
    quant_kernel = "sym_k"
    weighted_encoder = ("searched_k", "sym_k_blocks")
    block_dtype = block_dtype([("hmask", "u1", (32,)), ("qs", "u1", (64,)),
                               ("scales", "u1", (12,)), ("d", "<f2")], 110)
    params = Q3_K_PARAMS

    def kernel_layout(self) -> dict:
        return dict(super().kernel_layout(), search=self.params.layout())

    def encode(self, x, qw=None):
        """Blocks of x (nb, 256); qw: optional importance weights of the same shape."""
        nb = x.shape[0]
        d16, codes, L = encode_sym_k(x, self.params, qw)
        L = L + 4
        out = np.empty(nb, self.block_dtype)
        out["hmask"] = kc.pack_high_bits(L, 2)
        out["qs"] = kc.pack_2bit(L & 3)
        out["scales"] = pack_scales_q3(codes + 32)
        out["d"] = d16
        return out

    def decode(self, b):
        s = unpack_scales_q3(b["scales"]).astype(np.int8) - np.int8(32)
        dl = (fp16_field(b["d"])[:, None] * s.astype(F))[:, :, None]
        L = kc.unpack_2bit(b["qs"]) | (kc.unpack_high_bits(b["hmask"]) << np.uint8(2))
        q = (L.astype(np.int8) - np.int8(4)).reshape(-1, 16, 16).astype(F)
        return (dl * q).reshape(-1, 256)

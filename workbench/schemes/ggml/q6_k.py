"""Q6_K: 256-weight super-blocks of sixteen 16-weight sub-blocks, 6-bit codes, 6.5625 bits/weight.

Layout (210 bytes): ql[128] (low nibbles), qh[64] (high 2 bits), scales[16] (int8), d (fp16).
For half h (128 weights) and l < 32, codes h*128 + 32*k + l (k = 0..3) are:
    k=0: ql[h*64+l] & 15,  k=1: ql[h*64+32+l] & 15,  k=2: ql[h*64+l] >> 4,  k=3: ql[h*64+32+l] >> 4
with bits 4-5 from qh[h*32+l] >> 2k.

    w = d * scales_j * (q - 32)            (q in 0..63)

Quantize: sym_k.encode_sym_k (a searched scale per sub-block, then a search on the stored
int8 sub-block scales and the float16 super-scale; plain or importance-weighted squared
error), see sym_k.py. The numba kernel kernels/kquant_sym.py is bit-identical to it.
"""

from __future__ import annotations

import gguf
import numpy as np

from workbench.schemes.ggml.common import GGMLScheme, block_dtype, fp16_field
from workbench.schemes.ggml.sym_k import Q6_K_PARAMS, encode_sym_k

F = np.float32


class Q6_K(GGMLScheme):
    name = "q6_k"
    nominal_bits = 6
    ggml_type = gguf.GGMLQuantizationType.Q6_K
    llama_fallback = "q8_0"
    family = "K-quants"
    quant_kernel = "sym_k"
    weighted_encoder = ("searched_k", "sym_k_blocks")
    kernel_family = "q3_k"
    block_dtype = block_dtype([("ql", "u1", (128,)), ("qh", "u1", (64,)), ("scales", "i1", (16,)),
                               ("d", "<f2")], 210)

    params = Q6_K_PARAMS

    def kernel_layout(self) -> dict:
        return dict(super().kernel_layout(), search=self.params.layout())

    def encode(self, x, qw=None):
        """Blocks of x (nb, 256); qw: optional importance weights of the same shape."""
        nb = x.shape[0]
        d16, codes, L = encode_sym_k(x, self.params, qw)
        L = (L + 32).astype(np.uint8).reshape(nb, 2, 4, 32)
        lo = L & np.uint8(15)
        out = np.empty(nb, self.block_dtype)
        ql = np.concatenate([lo[:, :, 0] | (lo[:, :, 2] << np.uint8(4)),
                             lo[:, :, 1] | (lo[:, :, 3] << np.uint8(4))], axis=2)
        out["ql"] = ql.reshape(nb, 128)
        hi = L >> np.uint8(4)
        out["qh"] = (hi[:, :, 0] | (hi[:, :, 1] << np.uint8(2)) | (hi[:, :, 2] << np.uint8(4))
                     | (hi[:, :, 3] << np.uint8(6))).reshape(nb, 64)
        out["scales"] = codes.astype(np.int8)
        out["d"] = d16
        return out

    def decode(self, b):
        nb = b.shape[0]
        ql = b["ql"].reshape(nb, 2, 2, 32)      # (half, first/second 32 bytes, l)
        qh = b["qh"].reshape(nb, 2, 1, 32)
        lo = np.stack([ql[:, :, 0] & np.uint8(15), ql[:, :, 1] & np.uint8(15),
                       ql[:, :, 0] >> np.uint8(4), ql[:, :, 1] >> np.uint8(4)], axis=2)
        hi = (qh >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)) & np.uint8(3)
        q = ((lo | (hi << np.uint8(4))).astype(np.int8) - np.int8(32)).reshape(nb, 16, 16)
        dl = (fp16_field(b["d"])[:, None] * b["scales"].astype(F))[:, :, None]
        return (dl * q.astype(F)).reshape(nb, 256)

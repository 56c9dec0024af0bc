"""Q2_K: 256-weight super-blocks of sixteen 16-weight sub-blocks, 2-bit codes, 2.625 bits/weight.

Layout (84 bytes): scales[16] (low nibble: 4-bit scale, high nibble: 4-bit min of sub-block
j), qs[64] (byte h*32+l holds codes h*128 + s*32 + l at bits 2s, s = 0..3), d, dmin (fp16).

    w = d * sc_j * q - dmin * m_j        (j = sub-block of 16, q in 0..3)

Quantize: affine_k.encode_affine_k with 4-bit sub-block codes (affine_k.Q2_K_PARAMS; plain
squared error); the numba kernel kernels/kquant_affine.py is bit-identical to it.
"""

from __future__ import annotations

import gguf
import numpy as np

from workbench.schemes.ggml import kcommon as kc
from workbench.schemes.ggml.affine_k import Q2_K_PARAMS, encode_affine_k
from workbench.schemes.ggml.common import GGMLScheme, block_dtype, fp16_field

F = np.float32


class Q2_K(GGMLScheme):
    name = "q2_k"
    zero_when_worse = True
    nominal_bits = 2
    ggml_type = gguf.GGMLQuantizationType.Q2_K
    llama_fallback = "q4_0"
    family = "K-quants"
    quant_kernel = "affine_k"
    weighted_encoder = ("searched_k", "affine_k_blocks")
    scale_fields = ("d", "dmin")
    block_dtype = block_dtype([("scales", "u1", (16,)), ("qs", "u1", (64,)), ("d", "<f2"),
                               ("dmin", "<f2")], 84)

    params = Q2_K_PARAMS

    def kernel_layout(self) -> dict:
        return dict(super().kernel_layout(), search=self.params.layout())

    def encode(self, x, qw=None):
        """Blocks of x (nb, 256); qw: optional importance weights of the same shape."""
        nb = x.shape[0]
        d16, dmin16, ls, lm, L = encode_affine_k(x, self.params, qw)
        out = np.empty(nb, self.block_dtype)
        out["scales"] = ls | (lm << np.uint8(4))
        out["qs"] = kc.pack_2bit(L)
        out["d"], out["dmin"] = d16, dmin16
        return out

    def decode(self, b):
        sc = b["scales"]
        dl = (fp16_field(b["d"])[:, None] * (sc & np.uint8(15)).astype(F))[:, :, None]
        ml = (fp16_field(b["dmin"])[:, None] * (sc >> np.uint8(4)).astype(F))[:, :, None]
        q = kc.unpack_2bit(b["qs"]).reshape(-1, 16, 16).astype(F)
        return (dl * q - ml).reshape(-1, 256)

"""Q5_K: like Q4_K with a fifth code bit, 5.5 bits/weight.

Layout (176 bytes): d, dmin (fp16), scales[12] (as Q4_K), qh[32] (bit 4 of code e is bit
e//32 of byte e%32), qs[128] (low nibbles, as Q4_K).

    w = d * sc_j * q - dmin * m_j        (q in 0..31)

Quantize: as Q4_K with codes 0..31 (affine_k.Q5_K_PARAMS).
"""

from __future__ import annotations

import gguf
import numpy as np

from workbench.schemes.ggml import kcommon as kc
from workbench.schemes.ggml.affine_k import Q5_K_PARAMS
from workbench.schemes.ggml.common import block_dtype
from workbench.schemes.ggml.q4_k import AffineK


class Q5_K(AffineK):
    name = "q5_k"
    nominal_bits = 5
    ggml_type = gguf.GGMLQuantizationType.Q5_K
    llama_fallback = "q5_1"
    family = "K-quants"
    quant_kernel = "affine_k"
    weighted_encoder = ("searched_k", "affine_k_blocks")
    kernel_family = "q4_k"
    nmax = 31
    params = Q5_K_PARAMS
    block_dtype = block_dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (12,)),
                               ("qh", "u1", (32,)), ("qs", "u1", (128,))], 176)

    def _pack_codes(self, out, L):
        out["qs"] = kc.pack_4bit_k(L)
        out["qh"] = kc.pack_high_bits(L, 4)

    def _unpack_codes(self, b):
        return kc.unpack_4bit_k(b["qs"]) | (kc.unpack_high_bits(b["qh"]) << np.uint8(4))

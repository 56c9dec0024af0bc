"""Q4_K: 256-weight super-blocks of eight 32-weight sub-blocks, 4-bit codes, 4.5 bits/weight.

Layout (144 bytes): d (fp16), dmin (fp16), scales[12] (eight 6-bit scales + eight 6-bit
mins, see kcommon.pack_scales_k4), qs[128] (nibbles: byte c*32+l = code c*64+l in the low
nibble, code c*64+32+l in the high nibble).

    w = d * sc_j * q - dmin * m_j        (j = sub-block, q in 0..15)

Quantize: affine_k.encode_affine_k (a searched scale/min per sub-block, then a search on the
stored 6-bit codes and the float16 super-scales; plain squared error), see affine_k.py.
The numba kernel kernels/kquant_affine.py is bit-identical to it.
"""

from __future__ import annotations

import gguf
import numpy as np

from workbench.schemes.ggml import kcommon as kc
from workbench.schemes.ggml.affine_k import Q4_K_PARAMS, encode_affine_k
from workbench.schemes.ggml.common import GGMLScheme, block_dtype, fp16_field

F = np.float32


class AffineK(GGMLScheme, register=False):
    """Q4_K and Q5_K share everything but the code width and the search grid."""

    scale_fields = ("d", "dmin")
    zero_when_worse = True
    nmax = 15
    params = Q4_K_PARAMS

    def kernel_layout(self) -> dict:
        return dict(super().kernel_layout(), search=self.params.layout())

    def encode(self, x, qw=None):
        """Blocks of x (nb, 256); qw: optional importance weights of the same shape."""
        nb = x.shape[0]
        d16, dmin16, ls, lm, L = encode_affine_k(x, self.params, qw)
        out = np.empty(nb, self.block_dtype)
        out["d"], out["dmin"] = d16, dmin16
        out["scales"] = kc.pack_scales_k4(ls, lm)
        self._pack_codes(out, L)
        return out

    def decode(self, b):
        ls, lm = kc.unpack_scales_k4(b["scales"])
        dl = (fp16_field(b["d"])[:, None] * ls.astype(F))[:, :, None]
        ml = (fp16_field(b["dmin"])[:, None] * lm.astype(F))[:, :, None]
        q = self._unpack_codes(b).reshape(-1, 8, 32).astype(F)
        return (dl * q - ml).reshape(-1, 256)

    def _pack_codes(self, out, L):
        out["qs"] = kc.pack_4bit_k(L)

    def _unpack_codes(self, b):
        return kc.unpack_4bit_k(b["qs"])


class Q4_K(AffineK):
    name = "q4_k"
    nominal_bits = 4
    ggml_type = gguf.GGMLQuantizationType.Q4_K
    llama_fallback = "q5_0"
    family = "K-quants"
    quant_kernel = "affine_k"
    weighted_encoder = ("searched_k", "affine_k_blocks")
    block_dtype = block_dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (12,)),
                               ("qs", "u1", (128,))], 144)

"""Q4_K: 256-weight super-blocks of eight 32-weight sub-blocks, 4-bit codes, 4.5 bits/weight.

Layout (144 bytes): d (fp16), dmin (fp16), scales[12] (eight 6-bit scales + eight 6-bit
mins, see kcommon.pack_scales_k4), qs[128] (nibbles: byte c*32+l = code c*64+l in the low
nibble, code c*64+32+l in the high nibble).

    w = d * sc_j * q - dmin * m_j        (j = sub-block, q in 0..15)

Quantize: per sub-block an affine search (search.affine_search, weights rms + |w|, candidate
scales (15 - 1 + 0.1k)/range, k = 0..20) gives a scale and a min; the largest of each in the
super-block sets d and dmin (/63); the 6-bit codes are rounded; the weights are re-rounded
with the stored scales.
"""

from __future__ import annotations

import gguf
import numpy as np

from . import kcommon as kc
from .common import GGMLScheme, block_dtype, fp16_field, pow2_normalize
from .search import affine_search

F = np.float32


class AffineK(GGMLScheme, register=False):
    """Q4_K and Q5_K share everything but the code width and the search grid."""

    block_size = 256
    scale_fields = ("d", "dmin")
    zero_when_worse = True
    nmax = 15
    rmin, rdelta, nstep = -1.0, 0.1, 20

    def encode(self, x):
        nb = x.shape[0]
        xn, e = pow2_normalize(x)
        sub = kc.sub_blocks(xn, 32)
        scale, mins, _ = affine_search(sub, kc.k4_weights(sub), self.nmax, self.rmin,
                                       self.rdelta, self.nstep, use_abs=False)
        d16, d_eff, ls = kc.super_scale_codes(scale.reshape(nb, 8), e, 63)
        dmin16, m_eff, lm = kc.super_scale_codes(mins.reshape(nb, 8), e, 63)
        L = kc.requantize(xn.reshape(nb, 8, 32), d_eff[:, None] * ls, 0, self.nmax,
                          offset=m_eff[:, None] * lm).reshape(nb, 256)
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
    block_dtype = block_dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (12,)),
                               ("qs", "u1", (128,))], 144)

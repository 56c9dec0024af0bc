"""Q2_K: 256-weight super-blocks of sixteen 16-weight sub-blocks, 2-bit codes, 2.625 bits/weight.

Layout (84 bytes): scales[16] (low nibble: 4-bit scale, high nibble: 4-bit min of sub-block
j), qs[64] (byte h*32+l holds codes h*128 + s*32 + l at bits 2s, s = 0..3), d, dmin (fp16).

    w = d * sc_j * q - dmin * m_j        (j = sub-block of 16, q in 0..3)

Quantize: per sub-block an affine search (weights |w|, weighted absolute error, candidate
scales (3 - 0.5 + 0.1k)/range, k = 0..15); d and dmin = the largest scale / min over 15.
"""

from __future__ import annotations

import gguf
import numpy as np

from . import kcommon as kc
from .common import GGMLScheme, block_dtype, fp16_field, pow2_normalize
from .search import affine_search

F = np.float32


class Q2_K(GGMLScheme):
    name = "q2_k"
    zero_when_worse = True
    nominal_bits = 2
    block_size = 256
    ggml_type = gguf.GGMLQuantizationType.Q2_K
    scale_fields = ("d", "dmin")
    block_dtype = block_dtype([("scales", "u1", (16,)), ("qs", "u1", (64,)), ("d", "<f2"),
                               ("dmin", "<f2")], 84)

    def encode(self, x):
        nb = x.shape[0]
        xn, e = pow2_normalize(x)
        sub = kc.sub_blocks(xn, 16)
        scale, mins, _ = affine_search(sub, np.abs(sub), 3, -0.5, 0.1, 15, use_abs=True)
        d16, d_eff, ls = kc.super_scale_codes(scale.reshape(nb, 16), e, 15)
        dmin16, m_eff, lm = kc.super_scale_codes(mins.reshape(nb, 16), e, 15)
        ls, lm = ls.astype(np.uint8), lm.astype(np.uint8)
        L = kc.requantize(xn.reshape(nb, 16, 16), d_eff[:, None] * ls, 0, 3,
                          offset=m_eff[:, None] * lm).reshape(nb, 256)
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

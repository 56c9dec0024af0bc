"""IQ4_NL: 32-weight blocks, 4-bit indices into a fixed non-linear codebook, 4.5 bits/weight.

Layout (18 bytes): d (fp16), qs[16] (nibbles as Q4_0: byte j = index j | index j+16 << 4).

    w = d * KVALUES[index]

KVALUES (ggml ``kvalues_iq4nl``, a format fact): -127 -104 -83 -65 -49 -35 -22 -10 1 13 25
38 53 69 89 113.

Quantize: codebook search (weights w^2; 16 candidate scales mapping the weight of largest
magnitude near -127; least-squares scale per candidate, its sums in index order); indices =
nearest codebook value to w / d with the stored float16 d. The numba kernel
kernels/iq4nl_quant.py is bit-identical to it.
"""

from __future__ import annotations

import gguf
import numpy as np

from workbench.schemes.ggml.common import (GGMLScheme, NearestIndex, block_dtype, denormalize, fp16_field, pack_nibbles,
                     pow2_normalize, renormalize, to_fp16, unpack_nibbles)
from workbench.schemes.ggml.search import _seqsum, codebook_search

F = np.float32
KVALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                   dtype=np.int8)
NEAREST = NearestIndex(KVALUES)


class IQ4_NL(GGMLScheme):
    name = "iq4_nl"
    nominal_bits = 4
    ggml_type = gguf.GGMLQuantizationType.IQ4_NL
    quant_kernel = "iq4_nl"
    weighted_encoder = ("iq4_nl",)
    block_dtype = block_dtype([("d", "<f2"), ("qs", "u1", (16,))], 18)

    def encode(self, x, qw=None):
        """qw: optional importance (n_blocks, 32), finite and >= 0 (methods/ggml_weighted):
        the search weights become qw * sqrt(sigma2 + xn^2), sigma2 = 2 * sum(xn^2) / 32, as
        llama.cpp's quantize_row_iq4_nl_impl weighs them (on the normalized block; the sums
        in index order, as the kernel computes them)."""
        xn, e = pow2_normalize(x)
        if qw is None:
            w = xn * xn
        else:
            sigma2 = F(2) * _seqsum(xn, xn) / F(32)
            w = np.asarray(qw, F) * np.sqrt(sigma2[:, None] + xn * xn)
        d = codebook_search(xn, w, KVALUES, 7, NEAREST)
        d16 = to_fp16(denormalize(d, e))
        d_eff = renormalize(d16.astype(F), e)
        ok = d_eff != 0
        inv = np.where(ok, F(1) / np.where(ok, d_eff, F(1)), F(0))
        idx = NEAREST(xn * inv[:, None])
        out = np.empty(x.shape[0], self.block_dtype)
        out["d"] = d16
        out["qs"] = pack_nibbles(idx[:, :16], idx[:, 16:])
        return out

    def decode(self, b):
        lo, hi = unpack_nibbles(b["qs"])
        v = KVALUES[np.concatenate([lo, hi], axis=1)].astype(F)
        return fp16_field(b["d"])[:, None] * v

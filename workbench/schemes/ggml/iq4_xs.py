"""IQ4_XS (GGML type 23): IQ4_NL's codebook in 256-weight super-blocks, eight 32-weight
sub-blocks with 6-bit scales, 4.25 bits/weight.

Layout (136 bytes, ggml ``block_iq4_xs``): d (fp16), scales_h (uint16: 2 high bits of the
sub-block scale ib at bits 2ib..2ib+1), scales_l[4] (4 low bits: sub-block 2i in the low
nibble of byte i, 2i+1 in the high one), qs[128] (sub-block ib at qs[16ib:16ib+16], nibbles as
IQ4_NL: byte j = index j | index j+16 << 4).

    w = d * (ls_ib - 32) * KVALUES[index]        (KVALUES: iq4_nl.KVALUES)

Quantize: ggml's ``quantize_row_iq4_nl_impl(QK_K, 32, ..., ntry=7)``, the one deterministic
given the importance, float32 operation for operation (sums in index order from 0, no FMA,
as libggml-base is built), so the bytes are llama.cpp's with and without an imatrix:

* weights per sub-block: x^2, or with importance qw * sqrt(sigma2 + x^2), sigma2 =
  2 * sum(x^2) / 256 over the super-block;
* per sub-block (all-|x| < 1e-15: scale 0): the first x of largest |x| is max; candidate
  inverse scales 1/(-max/-127) and (t - 127)/max for t = -7..7; codes = nearest codebook
  entry (ties to the larger, as ggml's best_index_int8); the least-squares scale of the first
  candidate, then each later one whose sumqx^2 > best * sumq2 replaces it;
* d = -(the sub-block scale of largest magnitude) / 32 (float32), stored as float16; each
  sub-block's l = rint(scale / d) clamped to -32..31 (ggml's nearest_int: half to even), and
  its codes re-rounded with 1/(d * l) in float32 (the float32 d, not the stored float16).

The numba kernel kernels/iq4xs_quant.py is bit-identical.
"""

from __future__ import annotations

import gguf
import numpy as np

from workbench.schemes.ggml.common import GGMLScheme, block_dtype, fp16_field, pack_nibbles, to_fp16
from workbench.schemes.ggml.iq4_nl import KVALUES, NEAREST
from workbench.schemes.ggml.search import _seqsum

F = np.float32
_KV = KVALUES.astype(F)
EPS = F(1e-15)
NTRY = 7


def _nearest(v: np.ndarray) -> np.ndarray:
    """Codebook indices of v; non-finite v (only from weights whose squares overflow float32,
    refused afterwards by the float16 check of d) taken as 0."""
    return NEAREST(np.where(np.isfinite(v), v, F(0)))


def _sums(x: np.ndarray, w: np.ndarray, iscale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """sum w q x and sum w q q in index order from 0 (q = the codebook value nearest
    iscale * x), per row of x (sub-blocks of 32)."""
    q = _KV[_nearest(iscale[:, None] * x)]
    sqx = np.zeros(x.shape[0], F)
    sq2 = np.zeros(x.shape[0], F)
    for j in range(x.shape[1]):
        wq = w[:, j] * q[:, j]
        sqx = sqx + wq * x[:, j]
        sq2 = sq2 + wq * q[:, j]
    return sqx, sq2


def sub_block_scales(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """ggml's per-sub-block scale search: x, w float32 (n, 32) -> scale (n,) float32."""
    idx = np.abs(x).argmax(axis=1)
    mx = x[np.arange(x.shape[0]), idx]
    amax = np.abs(mx)
    tiny = amax < EPS
    mx = np.where(tiny, F(1), mx)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d0 = -mx / _KV[0]
        sqx, sq2 = _sums(x, w, F(1) / d0)
        pos = sq2 > 0
        d = np.where(pos, sqx / np.where(pos, sq2, F(1)), F(0))
        best = d * sqx
        for t in range(-NTRY, NTRY + 1):
            sqx, sq2 = _sums(x, w, F(t + int(KVALUES[0])) / mx)
            better = (sq2 > 0) & (sqx * sqx > best * sq2)
            dn = sqx / np.where(better, sq2, F(1))
            d = np.where(better, dn, d)
            best = np.where(better, dn * sqx, best)
    return np.where(tiny, F(0), d).astype(F)


class IQ4_XS(GGMLScheme):
    name = "iq4_xs"
    nominal_bits = 4
    ggml_type = gguf.GGMLQuantizationType.IQ4_XS
    llama_fallback = "iq4_nl"
    quant_kernel = "iq4_xs"
    weighted_encoder = ("iq4_xs",)
    block_dtype = block_dtype([("d", "<f2"), ("scales_h", "<u2"), ("scales_l", "u1", (4,)),
                               ("qs", "u1", (128,))], 136)

    def encode(self, x, qw=None):
        """qw: optional importance (n_blocks, 256), finite and >= 0 (methods/ggml_weighted),
        as llama.cpp's imatrix argument."""
        n = x.shape[0]
        if qw is None:
            w = x * x
        else:
            sigma2 = _seqsum(x, x) * F(2.0 / 256)
            w = np.asarray(qw, F) * np.sqrt(sigma2[:, None] + x * x)
        xs = x.reshape(-1, 32)
        scales = sub_block_scales(xs, w.reshape(-1, 32)).reshape(n, 8)
        # the sub-block scale of largest magnitude (the first one on ties)
        top = scales[np.arange(n), np.abs(scales).argmax(axis=1)]
        top = np.where(top != 0, top, F(0))        # none above 0: ggml keeps its +0
        d = -top / F(32)
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            inv = np.where(d != 0, F(1) / np.where(d != 0, d, F(1)), F(0)).astype(F)
            ls = np.clip(np.rint(inv[:, None] * scales), -32, 31).astype(np.int32)
            dl = d[:, None] * ls.astype(F)
            idl = np.where(dl != 0, F(1) / np.where(dl != 0, dl, F(1)), F(0)).astype(F)
            idx = _nearest(idl.reshape(-1, 1) * xs)
        u = (ls + 32).astype(np.uint16)
        out = np.empty(n, self.block_dtype)
        out["d"] = to_fp16(d)
        out["scales_h"] = ((u >> 4) << (2 * np.arange(8, dtype=np.uint16))).sum(axis=1)
        lo = (u & 15).astype(np.uint8)
        out["scales_l"] = lo[:, 0::2] | (lo[:, 1::2] << np.uint8(4))
        out["qs"] = pack_nibbles(idx[:, :16], idx[:, 16:]).reshape(n, 128)
        return out

    def decode(self, b):
        n = b.shape[0]
        sh = (b["scales_h"].astype(np.int32)[:, None] >> (2 * np.arange(8))) & 3
        sl = b["scales_l"].astype(np.int32)
        lo = np.stack([sl & 15, sl >> 4], axis=2).reshape(n, 8)
        dl = fp16_field(b["d"])[:, None] * ((lo | (sh << 4)) - 32).astype(F)
        qs = b["qs"].reshape(n, 8, 16)
        idx = np.concatenate([qs & np.uint8(15), qs >> np.uint8(4)], axis=2)
        return (dl[:, :, None] * _KV[idx]).reshape(n, 256)

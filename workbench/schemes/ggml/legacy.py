"""The 32-weight GGML blocks: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (ggml ``ggml-common.h``).

Layouts (one float16 scale ``d``, for *_1 also a float16 ``m`` = the block minimum):

    Q4_0  d, qs[16]           18 bytes  4.5 bits/weight   w = d * (q - 8)
    Q4_1  d, m, qs[16]        20 bytes  5.0 bits/weight   w = d * q + m
    Q5_0  d, qh[4], qs[16]    22 bytes  5.5 bits/weight   w = d * (q - 16)
    Q5_1  d, m, qh[4], qs[16] 24 bytes  6.0 bits/weight   w = d * q + m
    Q8_0  d, qs[32] (int8)    34 bytes  8.5 bits/weight   w = d * q

Nibbles: byte j of qs holds weight j (low nibble) and weight j+16 (high nibble). The fifth
bit of weight j of a Q5 block is bit j of the little-endian 32-bit qh.

Quantization follows ggml's reference rules (``quantize_row_*_ref``) operation for operation in
float32 so that the bytes equal the ``gguf`` package's and llama.cpp's:

    Q4_0/Q5_0: m = the weight of largest |w| (first one), d = m / -8 (/-16), id = 1/d,
               q = min(15 (31), trunc(w*id + 8.5 (16.5)))
    Q4_1/Q5_1: d = (max - min) / 15 (31), q = min(15 (31), trunc((w - min)*id + 0.5))
    Q8_0:      d = max|w| / 127, q = round-half-away-from-zero(w*id)

(llama.cpp's C compiler may contract ``w*id + 8.5`` into one fused multiply-add on some
targets, which can move a rounding by one code in rare ties; the numpy reference in the
``gguf`` package never fuses and neither do we.)
"""

from __future__ import annotations

import gguf
import numpy as np

from workbench.schemes.ggml.common import (GGMLScheme, block_dtype, fp16_field, pack_bit_planes, pack_nibbles,
                     safe_recip, to_fp16, unpack_bit_planes, unpack_nibbles)

Q = gguf.GGMLQuantizationType


def _signed_absmax(x: np.ndarray) -> np.ndarray:
    """The value with the largest magnitude in each row (the first one on ties)."""
    idx = np.abs(x).argmax(axis=1)
    return x[np.arange(x.shape[0]), idx]


def _nibbles(q: np.ndarray) -> np.ndarray:
    return pack_nibbles(q[:, :16], q[:, 16:])


def _unnibble(qs: np.ndarray) -> np.ndarray:
    lo, hi = unpack_nibbles(qs)
    return np.concatenate([lo, hi], axis=1)


def _high_bits(q: np.ndarray) -> np.ndarray:
    """Bit 4 of each of 32 codes -> 4 bytes (bit j of the little-endian uint32 = code j)."""
    bits = (q >> np.uint8(4)).reshape(-1, 4, 8).transpose(0, 2, 1)  # (n, bit-in-byte, byte)
    return pack_bit_planes(bits)


def _unhigh_bits(qh: np.ndarray) -> np.ndarray:
    bits = unpack_bit_planes(qh, 8)          # (n, 8 bit, 4 byte)
    return bits.transpose(0, 2, 1).reshape(-1, 32)


def _trunc_codes(v: np.ndarray, qmax: int) -> np.ndarray:
    t = np.trunc(v)
    return np.clip(t, 0, qmax).astype(np.uint8)


class Q4_0(GGMLScheme):
    name = "q4_0"
    nominal_bits = 4
    ggml_type = Q.Q4_0
    family = "GGML legacy"
    quant_kernel = "block32"
    weighted_encoder = ("legacy_sym", 8)
    block_dtype = block_dtype([("d", "<f2"), ("qs", "u1", (16,))], 18)

    def encode(self, x):
        d = _signed_absmax(x) / np.float32(-8)
        q = _trunc_codes(x * safe_recip(d)[:, None] + np.float32(8.5), 15)
        out = np.empty(x.shape[0], self.block_dtype)
        out["d"] = to_fp16(d)
        out["qs"] = _nibbles(q)
        return out

    def decode(self, b):
        q = _unnibble(b["qs"]).astype(np.int8) - np.int8(8)
        return fp16_field(b["d"])[:, None] * q.astype(np.float32)


class Q4_1(GGMLScheme):
    name = "q4_1"
    zero_when_worse = True
    nominal_bits = 4
    ggml_type = Q.Q4_1
    family = "GGML legacy"
    quant_kernel = "legacy"
    weighted_encoder = ("legacy_affine", 15)
    scale_fields = ("d", "m")
    block_dtype = block_dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", (16,))], 20)

    def encode(self, x):
        lo, hi = x.min(axis=1), x.max(axis=1)
        d = (hi - lo) / np.float32(15)
        q = _trunc_codes((x - lo[:, None]) * safe_recip(d)[:, None] + np.float32(0.5), 15)
        out = np.empty(x.shape[0], self.block_dtype)
        out["d"] = to_fp16(d)
        out["m"] = to_fp16(lo)
        out["qs"] = _nibbles(q)
        return out

    def decode(self, b):
        q = _unnibble(b["qs"]).astype(np.float32)
        return fp16_field(b["d"])[:, None] * q + fp16_field(b["m"])[:, None]


class Q5_0(GGMLScheme):
    name = "q5_0"
    nominal_bits = 5
    ggml_type = Q.Q5_0
    family = "GGML legacy"
    quant_kernel = "legacy"
    weighted_encoder = ("legacy_sym", 16)
    kernel_family = "q4_1"
    block_dtype = block_dtype([("d", "<f2"), ("qh", "u1", (4,)), ("qs", "u1", (16,))], 22)

    def encode(self, x):
        d = _signed_absmax(x) / np.float32(-16)
        q = _trunc_codes(x * safe_recip(d)[:, None] + np.float32(16.5), 31)
        out = np.empty(x.shape[0], self.block_dtype)
        out["d"] = to_fp16(d)
        out["qh"] = _high_bits(q)
        out["qs"] = _nibbles(q)
        return out

    def decode(self, b):
        q = _unnibble(b["qs"]) | (_unhigh_bits(b["qh"]) << np.uint8(4))
        q = q.astype(np.int8) - np.int8(16)
        return fp16_field(b["d"])[:, None] * q.astype(np.float32)


class Q5_1(GGMLScheme):
    name = "q5_1"
    zero_when_worse = True
    nominal_bits = 5
    ggml_type = Q.Q5_1
    family = "GGML legacy"
    quant_kernel = "legacy"
    weighted_encoder = ("legacy_affine", 31)
    kernel_family = "q4_1"
    scale_fields = ("d", "m")
    block_dtype = block_dtype([("d", "<f2"), ("m", "<f2"), ("qh", "u1", (4,)),
                               ("qs", "u1", (16,))], 24)

    def encode(self, x):
        lo, hi = x.min(axis=1), x.max(axis=1)
        d = (hi - lo) / np.float32(31)
        q = _trunc_codes((x - lo[:, None]) * safe_recip(d)[:, None] + np.float32(0.5), 31)
        out = np.empty(x.shape[0], self.block_dtype)
        out["d"] = to_fp16(d)
        out["m"] = to_fp16(lo)
        out["qh"] = _high_bits(q)
        out["qs"] = _nibbles(q)
        return out

    def decode(self, b):
        q = (_unnibble(b["qs"]) | (_unhigh_bits(b["qh"]) << np.uint8(4))).astype(np.float32)
        return fp16_field(b["d"])[:, None] * q + fp16_field(b["m"])[:, None]


def round_half_away(v: np.ndarray) -> np.ndarray:
    """C's roundf in float32: halves go away from zero (exact: the fraction is exact)."""
    a = np.abs(v)
    whole = np.floor(a)
    r = whole + (a - whole >= np.float32(0.5)).astype(np.float32)
    return np.copysign(r, v)


class Q8_0(GGMLScheme):
    name = "q8_0"
    nominal_bits = 8
    ggml_type = Q.Q8_0
    family = "GGML legacy"
    quant_kernel = "block32"
    kernel_family = "q4_0"
    block_dtype = block_dtype([("d", "<f2"), ("qs", "i1", (32,))], 34)

    def encode(self, x):
        d = np.abs(x).max(axis=1) / np.float32(127)
        q = round_half_away(x * safe_recip(d)[:, None])
        out = np.empty(x.shape[0], self.block_dtype)
        out["d"] = to_fp16(d)
        out["qs"] = np.clip(q, -127, 127).astype(np.int8)
        return out

    def decode(self, b):
        return fp16_field(b["d"])[:, None] * b["qs"].astype(np.float32)

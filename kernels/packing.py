"""Bit packing of small unsigned codes: a little-endian bit stream.

Code i of a flattened (row-major) tensor occupies bits [i*b, (i+1)*b) of the stream, least
significant bit first; byte j holds stream bits [8j, 8j+8). For b=4 that is the familiar
``byte = c[2j] | c[2j+1] << 4``; for b=8 the codes are the bytes.
"""

from __future__ import annotations

import numpy as np


def packed_nbytes(n: int, bits: int) -> int:
    return (n * bits + 7) // 8


def pack_bits(codes: np.ndarray, bits: int) -> np.ndarray:
    c = np.ascontiguousarray(codes, dtype=np.uint8).reshape(-1)
    n = c.size
    if bits == 8:
        return c.copy()
    if 8 % bits == 0:
        per = 8 // bits
        pad = (-n) % per
        if pad:
            c = np.concatenate([c, np.zeros(pad, np.uint8)])
        c = c.reshape(-1, per).astype(np.uint8)
        out = np.zeros(c.shape[0], np.uint8)
        for k in range(per):
            out |= c[:, k] << np.uint8(k * bits)
        return out
    # general b: expand to bits, pack little-endian
    bitplanes = ((c[:, None] >> np.arange(bits, dtype=np.uint8)) & 1).astype(np.uint8)
    return np.packbits(bitplanes.reshape(-1), bitorder="little")


def unpack_bits(packed: np.ndarray, bits: int, n: int) -> np.ndarray:
    p = np.ascontiguousarray(packed, dtype=np.uint8).reshape(-1)
    if bits == 8:
        return p[:n].copy()
    if 8 % bits == 0:
        per = 8 // bits
        mask = np.uint8((1 << bits) - 1)
        out = np.empty((p.size, per), np.uint8)
        for k in range(per):
            out[:, k] = (p >> np.uint8(k * bits)) & mask
        return out.reshape(-1)[:n]
    flat = np.unpackbits(p, bitorder="little")[: n * bits].reshape(n, bits)
    weights = (1 << np.arange(bits)).astype(np.uint8)
    return (flat * weights).sum(axis=1, dtype=np.uint16).astype(np.uint8)

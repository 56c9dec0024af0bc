"""Helpers shared by the K-quants: sub-block views, code packing and the final re-rounding.

K-quant super-blocks hold QK_K = 256 weights split into sub-blocks of 16 or 32, each with
its own small integer scale (and min) relative to the float16 super-block scale(s).
"""

from __future__ import annotations

import numpy as np

from workbench.schemes.ggml.common import QK_K

F = np.float32


def sub_blocks(x: np.ndarray, size: int) -> np.ndarray:
    """(nb, 256) -> (nb * 256/size, size), a view."""
    return x.reshape(-1, size)


def requantize(xn: np.ndarray, dsub: np.ndarray, lo: int, hi: int,
               offset: np.ndarray | None = None, empty: int = 0) -> np.ndarray:
    """Final codes given the *stored* sub-block scales: clip(rint((x + offset) / d), lo, hi).

    xn: (nb, S, n) normalized weights, dsub/offset: (nb, S). Sub-blocks with d == 0 get code
    `empty`. Returns int16 codes (nb, S, n).
    """
    d = dsub[..., None]
    num = xn if offset is None else xn + offset[..., None]
    ok = d != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.rint(num / np.where(ok, d, F(1)))
    q = np.clip(q, lo, hi)
    return np.where(ok, q, empty).astype(np.int16)


def pack_2bit(L: np.ndarray) -> np.ndarray:
    """Codes (nb, 256) in 0..3 -> 64 bytes: byte h*32+l holds codes h*128 + s*32 + l at bits 2s."""
    q = L.reshape(-1, 2, 4, 32).astype(np.uint8)
    out = np.zeros((q.shape[0], 2, 32), np.uint8)
    for s in range(4):
        out |= (q[:, :, s, :] & np.uint8(3)) << np.uint8(2 * s)
    return out.reshape(-1, QK_K // 4)


def unpack_2bit(qs: np.ndarray) -> np.ndarray:
    b = qs.reshape(-1, 2, 1, 32)
    shifts = (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)
    return ((b >> shifts) & np.uint8(3)).reshape(-1, QK_K)


def pack_4bit_k(L: np.ndarray) -> np.ndarray:
    """Codes (nb, 256) -> 128 bytes: byte c*32+l = code c*64+l | code c*64+32+l << 4."""
    q = L.reshape(-1, 4, 2, 32).astype(np.uint8)
    return ((q[:, :, 0, :] & np.uint8(15)) | (q[:, :, 1, :] << np.uint8(4))).reshape(-1, QK_K // 2)


def unpack_4bit_k(qs: np.ndarray) -> np.ndarray:
    b = qs.reshape(-1, 4, 1, 32)
    return ((b >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & np.uint8(15)).reshape(-1, QK_K)


def pack_high_bits(L: np.ndarray, bit: int) -> np.ndarray:
    """Bit `bit` of code e (of 256) -> bit e//32 of byte e%32 (32 bytes)."""
    from workbench.schemes.ggml.common import pack_bit_planes
    return pack_bit_planes(((L.astype(np.uint8) >> np.uint8(bit)) & np.uint8(1)).reshape(-1, 8, 32))


def unpack_high_bits(qh: np.ndarray) -> np.ndarray:
    from workbench.schemes.ggml.common import unpack_bit_planes
    return unpack_bit_planes(qh, 8).reshape(-1, QK_K)


def pack_scales_k4(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and eight 6-bit mins -> 12 bytes (Q4_K/Q5_K ``scales``).

    bytes 0-3: scale j (j<4) in bits 0-5, bits 4-5 of scale j+4 in bits 6-7
    bytes 4-7: min j (j<4) in bits 0-5, bits 4-5 of min j+4 in bits 6-7
    bytes 8-11: low nibble of scale j+4 | low nibble of min j+4 << 4
    """
    ls = ls.astype(np.uint8)
    lm = lm.astype(np.uint8)
    out = np.empty((ls.shape[0], 12), np.uint8)
    out[:, 0:4] = (ls[:, :4] & np.uint8(63)) | ((ls[:, 4:] >> np.uint8(4)) << np.uint8(6))
    out[:, 4:8] = (lm[:, :4] & np.uint8(63)) | ((lm[:, 4:] >> np.uint8(4)) << np.uint8(6))
    out[:, 8:12] = (ls[:, 4:] & np.uint8(15)) | ((lm[:, 4:] & np.uint8(15)) << np.uint8(4))
    return out


def unpack_scales_k4(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a, b, c = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    ls = np.concatenate([a & np.uint8(63), (c & np.uint8(15)) | ((a >> np.uint8(6)) << np.uint8(4))], axis=1)
    lm = np.concatenate([b & np.uint8(63), (c >> np.uint8(4)) | ((b >> np.uint8(6)) << np.uint8(4))], axis=1)
    return ls, lm


def k4_weights(sub: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K importance of each weight: the sub-block's rms plus |w|."""
    rms = np.sqrt(np.einsum("ij,ij->i", sub, sub) / F(sub.shape[1]))
    return rms[:, None] + np.abs(sub)


def super_scale_codes(values: np.ndarray, e: np.ndarray, levels: int, signed: bool = False
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sub-block scales (nb, S), normalized by 2**e -> (fp16 super scale, its value, codes).

    Unsigned (scales and mins of Q2_K/Q4_K/Q5_K): the largest value maps to code `levels`.
    Signed (Q3_K, Q6_K): the value of largest magnitude maps to code -levels, codes lie in
    [-levels, levels-1]. The codes are rounded against the *stored* float16 super scale, so
    a super scale that float16 rounds coarsely (tiny weights) still gives the closest codes.
    Returns (d16 float16 (nb,), d_eff float32 normalized (nb,), codes int16 (nb, S)).
    """
    from workbench.schemes.ggml.common import denormalize, renormalize, to_fp16
    if signed:
        idx = np.abs(values).argmax(axis=1)
        top = values[np.arange(values.shape[0]), idx]
        d = top / F(-levels)
        lo, hi = -levels, levels - 1
    else:
        d = values.max(axis=1) / F(levels)
        lo, hi = 0, levels
    d_real = denormalize(d.astype(F), e)
    d16 = to_fp16(d_real)
    # a float16 scale rounded toward zero would push the top code out of range (clipping the
    # largest weights): take the next float16 away from zero instead. Only matters where
    # float16 is coarse (subnormal scales of small weights).
    with np.errstate(divide="ignore", invalid="ignore"):
        over = np.rint(F(levels) * np.abs(d_real) / np.abs(d16.astype(F))) > levels
    over &= np.isfinite(d16) & (d_real != 0)
    if over.any():
        d16 = d16.copy()
        d16[over] = np.nextafter(d16[over], np.copysign(np.float16(np.inf), d16[over]))
    d_eff = renormalize(d16.astype(F), e)
    ok = np.isfinite(d_eff) & (d_eff != 0)
    safe = np.where(ok, d_eff, F(1))
    codes = np.clip(np.rint(values / safe[:, None]), lo, hi)
    codes = np.where(ok[:, None], codes, 0).astype(np.int16)
    return d16, d_eff, codes

"""The numpy reference of MLX's quantization: ``mlx.core.quantize`` and ``mlx.core.dequantize``
rewritten bit for bit (tests/workbench/test_mlx_schemes.py compares the bytes with mlx itself).

Every function works on 2-D float32 matrices whose values are already those of the export's
float dtype ``dtype`` ("F16", "BF16" or "F32": a weight cast to bfloat16 and back, say), because
mlx quantizes the weight in the model's dtype. Rows are quantized in groups of ``group`` along
the last axis.

Affine (mlx's CPU kernel; all arithmetic in float32): per group ``lo = min``, ``hi = max``,
``s = max((hi - lo) / (2^B - 1), 1e-7)``, negated unless ``|lo| > |hi|``; the edge (``lo`` or
``hi``, the one of larger magnitude) must land on a code: ``q0 = rint(edge / s)``, and when
``q0 != 0`` then ``s = edge / q0`` and ``bias = edge`` (else ``bias = 0``); codes
``clip(rint((w - bias) / s), 0, 2^B - 1)`` use the float32 ``s`` and ``bias``, which are then
stored rounded to ``dtype``. Dequantize: ``w = round(round(scale * q) + bias)``, each step
rounded to ``dtype`` (mlx computes in the scales' dtype).

Microscaling (``mxfp4``: E2M1 codes, G 32; ``mxfp8``: E4M3 codes, G 32): the E8M0 scale byte is
``clamp(ceil(log2(amax / M)), -127, 127) + 127`` (the exact ceiling) (M = 6 or 448; an all-zero group gets 127,
2^0), the codes are the nearest E2M1/E4M3 values of ``w / 2^(e - 127)`` computed in ``dtype``
(E4M3: ties to the even code, the sign bit kept on a zero; E2M1: ties to the smaller magnitude,
as mlx's thresholds 0.25 < x <= 0.75 -> 0.5 ... do, and no -0 code), saturating.
``nvfp4`` (G 16): scale byte = E4M3 of ``amax / 6`` (nearest, ties to even), codes of
``w / e4m3(scale)``; no global scale (mlx's default).
"""

from __future__ import annotations

import numpy as np

from workbench.core.floatbits import FP8_E4M3_TABLE, bf16_to_f32, f32_to_bf16
from workbench.schemes.floats import _positive_grid, round_to_fp8
from workbench.schemes.packing import pack_bits

F = np.float32
#: float32 value of every E2M1 code (magnitude index | sign << 3), mlx's FP4_LUT
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                        -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], F)
#: the midpoints between E2M1 magnitudes: a value above k of them has magnitude index k
_E2M1_MIDS = tuple(float(m) for m in (E2M1_VALUES[1:8] + E2M1_VALUES[:7]) / 2)
_E4M3_GRID = _positive_grid(FP8_E4M3_TABLE)
#: the float dtypes an MLX export stores scales, biases and float tensors in -> numpy storage
FLOAT_DTYPES = {"F16": np.float16, "BF16": np.uint16, "F32": np.float32}
EPS = F(1e-7)


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 `x` rounded (nearest even) to `dtype` and returned as float32 (a new array)."""
    x = np.asarray(x, F)
    if dtype == "F16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(F)
    if dtype == "BF16":
        return bf16_to_f32(f32_to_bf16(x))
    return x.copy()


def store(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 `x` as stored in `dtype` (bfloat16: its uint16 bits)."""
    if dtype == "BF16":
        return f32_to_bf16(x)
    with np.errstate(over="ignore"):
        return np.asarray(x, F).astype(FLOAT_DTYPES[dtype])


def widen(a: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values of an array stored in `dtype` (bfloat16 as uint16 bits)."""
    if dtype == "BF16":
        return bf16_to_f32(a)
    return np.asarray(a).astype(F)


def pack_words(codes: np.ndarray, bits: int) -> np.ndarray:
    """(rows, cols) codes -> uint32 (rows, cols·bits/32): least significant bit first, a code
    crossing a word boundary when 32 is not a multiple of `bits` (cols·bits divisible by 32)."""
    rows, cols = codes.shape
    return pack_bits(codes, bits).view("<u4").reshape(rows, cols * bits // 32)


def unpack_codes(words: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes of rows of uint32 words, packed from the least significant bit (crossing
    word boundaries when 32 is not a multiple of `bits`): (rows, words·32/bits)."""
    words = np.ascontiguousarray(words, dtype="<u4")
    rows = words.shape[0]
    b = words.view(np.uint8).reshape(rows, -1, bits)   # every `bits` bytes hold 8 codes
    out = np.empty((rows, b.shape[1], 8), np.uint8)
    mask = (1 << bits) - 1
    for j in range(8):
        k, s = divmod(j * bits, 8)
        v = b[:, :, k] >> s
        if s + bits > 8:
            v = v | (b[:, :, k + 1] << (8 - s))
        out[:, :, j] = v & mask
    return out.reshape(rows, -1)


def affine_params(w: np.ndarray, bits: int, group: int) -> tuple[np.ndarray, np.ndarray]:
    """mlx's float32 (scale, bias) per group of `w` (rows, cols/group), before storage."""
    rows, cols = w.shape
    g = w.reshape(rows, cols // group, group)
    hi, lo = g.max(axis=2), g.min(axis=2)
    n_bins = F((1 << bits) - 1)
    mask = np.abs(lo) > np.abs(hi)
    s = np.maximum((hi - lo) / n_bins, EPS).astype(F)
    s = np.where(mask, s, -s).astype(F)
    edge = np.where(mask, lo, hi).astype(F)
    with np.errstate(divide="ignore", invalid="ignore"):
        q0 = np.rint(edge / s).astype(F)
        moved = q0 != 0
        s = np.where(moved, edge / np.where(moved, q0, F(1)), s).astype(F)
    bias = np.where(moved, edge, F(0)).astype(F)
    return s, bias


def affine_codes(w: np.ndarray, scale: np.ndarray, bias: np.ndarray, bits: int,
                 group: int) -> np.ndarray:
    """uint8 codes clip(rint((w - bias) / scale), 0, 2^B - 1) with per-group float32 params."""
    rows, cols = w.shape
    g = w.reshape(rows, cols // group, group)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.rint((g - bias[:, :, None]) / scale[:, :, None])
    return np.clip(q, 0, (1 << bits) - 1).astype(np.uint8).reshape(rows, cols)


def quantize_affine(w: np.ndarray, bits: int, group: int, dtype: str) -> dict:
    """mx.quantize(w, group, bits, "affine") of float32 `w` holding `dtype` values."""
    w = np.ascontiguousarray(w, F)
    s, b = affine_params(w, bits, group)
    codes = affine_codes(w, s, b, bits, group)
    return {"weight": pack_words(codes, bits), "scales": store(s, dtype),
            "biases": store(b, dtype)}


def dequantize_affine(codes: np.ndarray, scales: np.ndarray, biases: np.ndarray, bits: int,
                      group: int, dtype: str) -> np.ndarray:
    """mx.dequantize's affine values as float32: the product rounded to `dtype`, then the sum.
    `scales` / `biases` are float32 values of the stored ones; `codes` (rows, cols) uint8."""
    rows = codes.shape[0]
    c = codes.reshape(rows, -1, group)
    s, b = scales[:, :, None], biases[:, :, None]
    small = (1 << bits) < group            # each group's 2^B values are worked out once
    q = np.arange(1 << bits, dtype=F) if small else c.astype(F)
    with np.errstate(over="ignore", invalid="ignore"):
        out = round_to(s * q, dtype)
        out = round_to(out + b, dtype)
    if small:
        out = np.take_along_axis(out, c, axis=2)
    return out.reshape(rows, -1)


def e8m0_values(s: np.ndarray) -> np.ndarray:
    """2^(s-127) of E8M0 bytes (255 is 2^128: infinite in float32, as mlx reads it)."""
    with np.errstate(over="ignore"):
        return np.ldexp(F(1), np.asarray(s).astype(np.int32) - 127).astype(F)


def fp_scales(w: np.ndarray, mode: str, group: int) -> np.ndarray:
    """The uint8 scale byte per group of mode mxfp4 / mxfp8 (E8M0) or nvfp4 (E4M3)."""
    rows, cols = w.shape
    amax = np.abs(w.reshape(rows, cols // group, group)).max(axis=2).astype(F)
    if mode == "nvfp4":
        return round_to_fp8((amax / F(6)).astype(F), _E4M3_GRID)
    m = F(6) if mode == "mxfp4" else F(448)
    # ceil(log2 x) exactly (as mlx computes it: x = f·2^k, f in [0.5, 1): k - 1 when f is
    # 0.5, else k), not through a rounded float log2
    frac, k = np.frexp((amax / m).astype(F))
    e = np.where(frac == 0.5, k - 1, k)
    e = np.where(amax > 0, np.clip(e, -127, 127), 0)     # an all-zero group: 2^0
    return (e + 127).astype(np.uint8)


def fp_scale_values(scales: np.ndarray, mode: str) -> np.ndarray:
    return FP8_E4M3_TABLE[np.asarray(scales, np.uint8)].astype(F) if mode == "nvfp4" \
        else e8m0_values(scales)


def fp_codes(w: np.ndarray, scales: np.ndarray, mode: str, group: int, dtype: str) -> np.ndarray:
    """uint8 codes (rows, cols): E2M1 (mxfp4/nvfp4: magnitude index | sign << 3) or E4M3 bytes
    (mxfp8) of w / scale, the quotient rounded to `dtype` first."""
    rows, cols = w.shape
    sv = fp_scale_values(scales, mode)[:, :, None]
    g = w.reshape(rows, cols // group, group)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(sv > 0, g / np.where(sv > 0, sv, F(1)), F(0)).astype(F)
    y = round_to(y, dtype).reshape(rows, cols)
    if mode == "mxfp8":
        return round_to_fp8(y, _E4M3_GRID)
    return e2m1_codes(y)


def e2m1_codes(y: np.ndarray) -> np.ndarray:
    """mlx's E2M1 codes of float32 y: the nearest magnitude, a tie to the smaller one,
    saturating at 6; a magnitude that rounds to 0 is code 0 (no -0)."""
    a = np.abs(y)
    mag = np.zeros(a.shape, np.uint8)
    for m in _E2M1_MIDS:
        mag += (a > m).astype(np.uint8)
    return (mag | np.where((mag > 0) & np.signbit(y), 8, 0)).astype(np.uint8)


def quantize_fp(w: np.ndarray, mode: str, group: int, dtype: str) -> dict:
    """mx.quantize(w, mode=mode) of float32 `w` holding `dtype` values."""
    w = np.ascontiguousarray(w, F)
    s = fp_scales(w, mode, group)
    bits = 8 if mode == "mxfp8" else 4
    return {"weight": pack_words(fp_codes(w, s, mode, group, dtype), bits), "scales": s}


def dequantize_fp(codes: np.ndarray, scales: np.ndarray, mode: str, group: int,
                  global_scale: np.ndarray | None = None) -> np.ndarray:
    """mx.dequantize's float32 values of mxfp4 / nvfp4 / mxfp8 codes (rows, cols) uint8."""
    rows = codes.shape[0]
    table = FP8_E4M3_TABLE if mode == "mxfp8" else E2M1_VALUES
    vals = np.asarray(table, F)[codes].reshape(rows, -1, group)
    s = fp_scale_values(scales, mode)
    if global_scale is not None:
        gs = np.asarray(global_scale, F).reshape(-1, 1)
        s = s * (gs / F(6 * 448))
    with np.errstate(over="ignore", invalid="ignore"):
        return (vals * s[:, :, None]).reshape(rows, -1)


def dequantize(arrays: dict, p: dict, scale_dtype: str = "F32") -> np.ndarray:
    """float32 values of one module's stored arrays (2-D: rows of the last axis; global_scale
    one per row), as mx.dequantize computes them. `arrays`: weight, scales[, biases,
    global_scale] as numpy; `p`: {"mode", "bits", "group_size"}; `scale_dtype`: the stored
    float dtype of affine scales and biases ("F16", "BF16", "F32")."""
    mode, bits, group = p["mode"], p["bits"], p["group_size"]
    codes = unpack_codes(np.asarray(arrays["weight"]), bits)
    if mode == "affine":
        s = widen(np.asarray(arrays["scales"]), scale_dtype)
        b = widen(np.asarray(arrays["biases"]), scale_dtype)
        return dequantize_affine(codes, s, b, bits, group, scale_dtype)
    return dequantize_fp(codes, np.asarray(arrays["scales"]), mode, group,
                         arrays.get("global_scale"))

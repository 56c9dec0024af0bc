"""Host-side preparation shared by the CPU and CUDA paths (numpy only, no numba).

* ``affine_args``: the flat arrays a packed-code kernel reads (float16 scales widened to
  float32 exactly as the reference does).
* ``*_qparams``: per-block scale / zero point from per-block ranges computed by a kernel,
  pushed through the scheme's own numpy ``choose_qparams`` so they are the reference's values.
* ``fp8_format``: (mantissa bits, exponent bias, largest finite code) read off a scheme's table.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .spec import Spec

DUMMY_U8 = np.zeros(1, np.uint8)
DUMMY_F32 = np.zeros(1, np.float32)


def readonly(a):
    """`a` as every kernel takes its inputs: read-only (a view, no copy). numba types a
    read-only array apart from a writable one and compiles each kernel once per type; weights
    read from a file are read-only maps and those made in memory writable, so before, most
    kernels were compiled twice (a K-quant encoder for minutes each time)."""
    if isinstance(a, np.ndarray) and a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


def affine_args(spec: Spec, arrays, rows: int, cols: int):
    a = arrays
    codes = np.ascontiguousarray(a[spec.code_key], dtype=np.uint8).reshape(-1)
    gs, bpr = spec.geometry(rows, cols)
    if spec.scale_decode == "block128":
        gs = 128
        while cols % gs:
            gs //= 2
        bpr = cols // gs
    if spec.scale_decode:
        scales = decoded_scales(spec, a, rows, cols, gs)
    else:
        scales = np.ascontiguousarray(a[spec.scale_key]).reshape(-1).astype(np.float32, copy=False)
    if spec.zero_key:
        zeros = np.ascontiguousarray(a[spec.zero_key], dtype=np.uint8).reshape(-1)
    else:
        zeros = DUMMY_U8
    return (readonly(codes), int(spec.bits), readonly(spec.lut), readonly(scales), readonly(zeros),
            spec.zero_key is not None, gs, bpr)


def decoded_scales(spec: Spec, arrays, rows: int, cols: int, gs: int = 0) -> np.ndarray:
    """float32 scales per group of a spec whose stored scales need decoding (Spec.scale_decode),
    with the numpy operations of the scheme's reference decoder (so the products match it)."""
    s = np.asarray(arrays[spec.scale_key])
    if spec.scale_decode == "e8m0":
        e = s.reshape(-1).astype(np.int32)
        with np.errstate(over="ignore"):
            return np.where(e == 255, np.float32(np.inf),
                            np.ldexp(np.float32(1), e - 127)).astype(np.float32)
    if spec.scale_decode == "e4m3g":
        g = np.asarray(arrays["global_scale"], np.float32).reshape(-1)[0]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return (spec.scale_table[s.reshape(-1).astype(np.uint8)] / g).astype(np.float32)
    if spec.scale_decode == "block128":
        s2 = np.asarray(s, np.float32).reshape(-(-rows // 128), -(-cols // 128))
        s2 = np.repeat(np.repeat(s2, 128, axis=0)[:rows], 128 // gs, axis=1)[:, :cols // gs]
        return np.ascontiguousarray(s2).reshape(-1)
    raise ValueError(spec.scale_decode)


def u16_args(spec: Spec, arrays, rows: int, cols: int):
    from . import tables
    data = np.ascontiguousarray(arrays["data"]).view(np.uint16).reshape(rows, cols)
    table = tables.f16_table() if spec.table == "f16" else tables.bf16_table()
    return readonly(data), readonly(table)


def ggml_blocks(spec: Spec, arrays, rows: int, cols: int) -> np.ndarray:
    return readonly(np.ascontiguousarray(arrays["blocks"], dtype=np.uint8).reshape(
        rows, cols // spec.qk * spec.bpb))


def safe_inv(scale: np.ndarray) -> np.ndarray:
    """float32(1)/scale, 0 where scale == 0 (the reference's formula)."""
    s = np.asarray(scale, dtype=np.float32)
    with np.errstate(divide="ignore"):
        inv = np.float32(1.0) / s
    inv[s == 0] = 0.0
    return inv.astype(np.float32)


def int_qparams(spec: Spec, w2d: np.ndarray, minmax, choose_qparams):
    """(scale as stored, zero uint8 or None, inv float32, zero float32) for an integer scheme.

    `minmax(gs, bpr) -> (lo, hi)` computes per-block min/max with a kernel. For min/max clipping
    the caller's `choose_qparams` (the scheme's own reference) then runs on those two numbers
    per block, ``choose_qparams(lo_hi)``: it only looks at the block's min/max/|max|, so the
    result is the reference's (asymmetric schemes). @p99.9/@mse and the symmetric divisor
    search need the whole block: ``choose_qparams(None)`` asks the caller for the reference's
    qparams of the whole tensor.
    """
    rows, cols = w2d.shape
    if spec.clip == "minmax" and spec.asym:
        if spec.gran == "tensor":
            lo, hi = minmax(cols, 1)
            lo, hi = np.array([lo.min()], np.float32), np.array([hi.max()], np.float32)
        else:
            lo, hi = minmax(*spec.geometry(rows, cols))
        scale, zero = choose_qparams(np.stack([lo, hi], axis=1))
    else:
        scale, zero = choose_qparams(None)
    inv = safe_inv(scale)
    zf = zero.astype(np.float32) if zero is not None else DUMMY_F32
    return scale, zero, inv, zf


def nf4_inv(absmax: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(absmax > 0, np.float32(1.0) / absmax, np.float32(0.0)).astype(np.float32)


def ternary_scale(mean64: np.ndarray):
    scale = np.minimum(mean64, 65504.0).astype(np.float16)
    s32 = scale.astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(s32 > 0, np.float32(1.0) / s32, np.float32(0.0)).astype(np.float32)
    return scale, inv


def fp8_scale(amax: np.ndarray, fmax: float):
    scale = (amax / np.float32(fmax)).astype(np.float32)
    safe = np.where(scale > 0, scale, np.float32(1.0)).astype(np.float32)
    return scale, safe


@lru_cache(maxsize=None)
def fp8_format(table_bytes: bytes) -> tuple[int, int, int]:
    """(mantissa bits, exponent bias, largest finite code) of an FP8 decode table."""
    table = np.frombuffer(table_bytes, dtype=np.float32)
    pos = table[:128]
    finite = np.isfinite(pos)
    maxcode = int(np.argmax(~finite)) - 1 if not finite.all() else 127
    grid = pos[: maxcode + 1].astype(np.float64)
    codes = np.arange(maxcode + 1)
    for man in range(1, 7):
        for bias in range(0, 64):
            e = codes >> man
            m = codes & ((1 << man) - 1)
            val = np.where(e == 0, m / 2.0 ** man * 2.0 ** (1 - bias),
                           (1 + m / 2.0 ** man) * 2.0 ** (e - bias))
            if np.array_equal(val, grid):
                return man, bias, maxcode
    raise ValueError("not an FP8 table")


def block_view_ok_for_mean(gs: int) -> bool:
    """block_stats' mean follows numpy's pairwise order only for 8 <= gs <= 128, gs % 8 == 0."""
    return 8 <= gs <= 128 and gs % 8 == 0

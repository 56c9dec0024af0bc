"""Host side of the "mlx" family (kernels.cpu_mlx and the CUDA decoder in kernels.cuda_mlx):
the kernels' arguments from a scheme's arrays, and the arrays from the quantize kernels'
outputs. Plain numpy; imports nothing from ``workbench``."""

from __future__ import annotations

import numpy as np

from . import tables
from .host import DUMMY_F32, readonly
from .spec import Spec

F = np.float32
NVFP4_GLOBAL = F(6 * 448)          # mlx: scale · (global_scale / (6 · 448))


def widen(a: np.ndarray, dt: int) -> np.ndarray:
    """float32 values (flat) of affine scales or biases stored in dtype number dt."""
    a = np.ascontiguousarray(a).reshape(-1)
    if dt == 2:                                    # bfloat16 bits
        return (a.view(np.uint16).astype(np.uint32) << np.uint32(16)).view(F)
    return a.astype(F)


def scale_values(spec: Spec, arrays) -> tuple[np.ndarray, np.ndarray]:
    """(scales, biases) as flat float32, one per group: affine widened from their dtype; the
    microscaling modes' scale bytes through the spec's table (times an nvfp4 global scale's
    factor per row, as the reference computes it)."""
    if spec.mlx_mode == 0:
        return (widen(arrays["scales"], spec.scale_dtype),
                widen(arrays[spec.zero_key], spec.scale_dtype))
    s = np.asarray(arrays["scales"])
    sv = spec.scale_table[s.astype(np.uint8)]
    if "global_scale" in arrays:
        gs = np.asarray(arrays["global_scale"], F).reshape(-1, 1)
        sv = (sv.reshape(gs.shape[0], -1) * (gs / NVFP4_GLOBAL)).astype(F)
    return np.ascontiguousarray(sv, F).reshape(-1), DUMMY_F32


def dequant_args(spec: Spec, arrays) -> tuple:
    """The arguments of cpu_mlx.mlx_dequant / mlx_error before the output (or weights)."""
    codes = np.ascontiguousarray(arrays[spec.code_key]).reshape(-1).view(np.uint8)
    sv, bv = scale_values(spec, arrays)
    lut = spec.lut if spec.lut is not None else DUMMY_F32
    return (readonly(codes), readonly(sv), readonly(bv), spec.mlx_mode, spec.bits,
            int(spec.gran), spec.scale_dtype if spec.mlx_mode == 0 else 0,
            tables.f16_table(), readonly(lut))


def quantize(spec: Spec, w2d: np.ndarray, k) -> dict:
    """The scheme's arrays of float32 w2d (rows, cols) from the quantize kernels (`k`:
    kernels.cpu)."""
    w2d = readonly(w2d)
    rows, cols = w2d.shape
    gs = int(spec.gran)
    codes = np.empty((rows, cols * spec.bits // 8), np.uint8)
    if spec.mlx_mode == 0:
        s = np.empty((rows, cols // gs), np.uint16)
        b = np.empty((rows, cols // gs), np.uint16)
        k.mlx_quant_affine(w2d, spec.bits, gs, spec.dtype, spec.scale_dtype, tables.f16_table(),
                           codes, s, b)
        if spec.scale_dtype == 1:
            s, b = s.view(np.float16), b.view(np.float16)
        return {"weight": codes.view("<u4"), "scales": s, "biases": b}
    s = np.empty((rows, cols // gs), np.uint8)
    k.mlx_quant_fp(w2d, spec.mlx_mode, gs, spec.dtype, tables.f16_table(), spec.scale_table,
                   codes, s)
    return {"weight": codes.view("<u4"), "scales": s}

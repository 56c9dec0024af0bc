"""numba CPU kernels, one module per family (``@njit(parallel=True, cache=True)``, parallel over rows).

Few generic kernels rather than many specialisations (compile time is paid once per machine,
the cache lives next to this file or in ``NUMBA_CACHE_DIR``):

* ``affine_dequant`` / ``affine_error``   every packed-code family (int, NF4, ternary, FP8)
* ``u16_dequant`` / ``u16_error``         fp16 / bf16 through a 65536-entry table
* ``f32_copy`` / ``f32_error``            fp32
* ``ggml_dequant`` / ``ggml_error``       GGML blocks; one block decoder per format
* ``block_stats``, ``encode``             quantize: per-block ranges, then codes + packing
* ``ggml_encode``                         Q4_0 / Q8_0 quantize
* ``mlx_dequant`` / ``mlx_error`` / ``mlx_quant_*``   Apple MLX's modes (cpu_mlx)

Each ``*_row`` helper decodes one row into a float32 buffer; the ``*_error`` kernels decode a
row into a small per-row scratch buffer and fold it into float64 sums at once, so the
dequantized tensor is never written out.

Arithmetic is float32 exactly as in the numpy references (numba does not contract a*b+c into
an FMA without fastmath; only the float64 error sums use reassociation).
Imported lazily by ``kernels.cpu_ops``: importing this module compiles (or loads) nothing until a
kernel is first called.

The kernels live in ``cpu_common`` (shared helpers), ``cpu_affine_dequant``,
``cpu_affine_quant`` and ``cpu_affine_fused`` (the packed-code family: decode, quantize pass
by pass, quantize in one pass), ``cpu_floats`` and ``cpu_ggml``; this module gathers them
under one name for ``cpu_ops``. A kernel's module is imported when one of its names is first
asked for (``cpu.ggml_encode`` imports ``cpu_ggml`` only), so a process that quantizes GGML
blocks never defines the affine kernels.
"""

from __future__ import annotations

import importlib

_FAMILIES = {
    "cpu_affine_dequant": ("affine_dequant", "affine_error"),
    "cpu_affine_fused": ("_f64_to_f16_bits", "quant_error_fused", "quant_fused"),
    "cpu_affine_quant": ("block_stats", "encode", "int_qparams", "sym_qparams"),
    "cpu_common": ("F0", "_J", "_P", "_acc_row", "_block_keys", "_encode_row", "_f32_to_f16_bits",
                   "_put_f16", "count_nonfinite"),
    "cpu_floats": ("f32_copy", "f32_error", "u16_dequant", "u16_error"),
    "cpu_ggml": ("ggml_dequant", "ggml_encode", "ggml_error"),
    "cpu_mlx": ("mlx_dequant", "mlx_error", "mlx_quant_affine", "mlx_quant_fp"),
}
_WHERE = {name: mod for mod, names in _FAMILIES.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__package__}.{mod}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_WHERE))

"""Storage dtypes the loaders understand, and their conversion to float32.

Names follow safetensors (F32, F16, BF16, F8_E4M3, F8_E5M2, I8 ... BOOL). GGUF block types
keep their GGML names (Q4_K, ...). bfloat16 and float8 are decoded with bit operations /
lookup tables in numpy, so no torch import is needed to read them.
"""

from __future__ import annotations

import numpy as np

from workbench.core.floatbits import FP8_E4M3_TABLE, FP8_E5M2_TABLE, bf16_to_f32

# safetensors dtype name -> (numpy storage dtype, itemsize, is_float)
STORAGE = {
    "F64": (np.dtype("<f8"), 8, True),
    "F32": (np.dtype("<f4"), 4, True),
    "F16": (np.dtype("<f2"), 2, True),
    "BF16": (np.dtype("<u2"), 2, True),
    "F8_E4M3": (np.dtype("u1"), 1, True),
    "F8_E5M2": (np.dtype("u1"), 1, True),
    "I64": (np.dtype("<i8"), 8, False),
    "I32": (np.dtype("<i4"), 4, False),
    "I16": (np.dtype("<i2"), 2, False),
    "I8": (np.dtype("i1"), 1, False),
    "U64": (np.dtype("<u8"), 8, False),
    "U32": (np.dtype("<u4"), 4, False),
    "U16": (np.dtype("<u2"), 2, False),
    "U8": (np.dtype("u1"), 1, False),
    "BOOL": (np.dtype("?"), 1, False),
}

# torch dtype name (str(torch.dtype) without 'torch.') -> safetensors name
TORCH_TO_ST = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
    "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8",
    "uint64": "U64", "uint32": "U32", "uint16": "U16", "uint8": "U8", "bool": "BOOL",
}

# numpy dtype -> safetensors name (for writing)
NUMPY_TO_ST = {
    np.dtype("float64"): "F64", np.dtype("float32"): "F32", np.dtype("float16"): "F16",
    np.dtype("int64"): "I64", np.dtype("int32"): "I32", np.dtype("int16"): "I16",
    np.dtype("int8"): "I8", np.dtype("uint64"): "U64", np.dtype("uint32"): "U32",
    np.dtype("uint16"): "U16", np.dtype("uint8"): "U8", np.dtype("bool"): "BOOL",
}


# from this many elements on, F16/BF16 are widened by the parallel numba kernels
# (kernels.convert: the same bits as numpy, 3-6x faster); smaller arrays by numpy
FAST_WIDEN_MIN = 1 << 16


def _fast_widen(raw: np.ndarray, dtype: str):
    try:
        from kernels import convert
    except ImportError:   # numba missing: numpy does it
        return None
    return convert.f16_to_f32(raw) if dtype == "F16" else convert.bf16_to_f32(raw)


def to_float32(raw: np.ndarray, dtype: str) -> np.ndarray:
    """Convert a raw storage array (as read from a file) to float32."""
    if dtype == "F32":
        return np.asarray(raw, dtype=np.float32)
    if dtype in ("F16", "BF16") and np.size(raw) >= FAST_WIDEN_MIN:
        out = _fast_widen(np.asarray(raw), dtype)
        if out is not None:
            return out
    if dtype == "BF16":
        return bf16_to_f32(raw)
    if dtype == "F8_E4M3":
        return FP8_E4M3_TABLE[raw]
    if dtype == "F8_E5M2":
        return FP8_E5M2_TABLE[raw]
    return np.asarray(raw).astype(np.float32)


def is_float(dtype: str) -> bool:
    st = STORAGE.get(dtype)
    return True if st is None else st[2]  # GGML block types are float data


def decode_rows(raw: np.ndarray, info) -> np.ndarray:
    """Decode a 2-D chunk of storage rows of tensor `info` to float32 (rows x cols).

    Plain dtypes are converted element-wise; GGML block types are dequantized through the
    scheme registry (falling back to the `gguf` package for types it does not implement).
    """
    if not isinstance(raw, np.ndarray):   # a loaders.region.Region: its rows read once, here
        raw = np.asarray(raw)
    dtype = info.dtype
    if dtype in STORAGE:
        out = to_float32(raw, dtype)
    elif raw.size == 0:   # no rows (a zero-row tensor) or no columns: no blocks to decode
        rows = raw.shape[0] if raw.ndim else 0
        if rows and info.cols:
            from workbench.core.errors import WorkbenchError
            raise WorkbenchError(f"{rows} rows of {info.cols} values hold no data",
                                 path=getattr(info, "file", None) or None, tensor=info.name)
        return np.zeros((rows, info.cols), np.float32)
    else:
        from workbench.core.errors import WorkbenchError
        from workbench.schemes.ggml_decode import dequantize_ggml_rows
        try:
            out = dequantize_ggml_rows(raw, dtype)
        except WorkbenchError as exc:
            if exc.path is None and exc.tensor is None:
                raise WorkbenchError(str(exc), path=getattr(info, "file", None) or None,
                                     tensor=info.name) from None
            raise
    return out.reshape(raw.shape[0], -1) if out.ndim != 2 else out

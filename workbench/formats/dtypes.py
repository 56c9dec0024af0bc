"""Storage dtypes the loaders understand, and their conversion to float32.

Names follow safetensors (F32, F16, BF16, F8_E4M3, F8_E5M2, I8 ... BOOL). GGUF block types
keep their GGML names (Q4_K, ...). bfloat16 and float8 are decoded with bit operations /
lookup tables in numpy, so no torch import is needed to read them.
"""

from __future__ import annotations

import numpy as np

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


def _fp8_table(exp_bits: int, man_bits: int, fn: bool) -> np.ndarray:
    """Decode all 256 codes of an FP8 format to float32 (fn: no inf, only 0x7F/0xFF NaN)."""
    bias = (1 << (exp_bits - 1)) - 1
    out = np.empty(256, dtype=np.float32)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        e = (code >> man_bits) & ((1 << exp_bits) - 1)
        m = code & ((1 << man_bits) - 1)
        if fn:
            if e == (1 << exp_bits) - 1 and m == (1 << man_bits) - 1:
                out[code] = np.nan
                continue
        elif e == (1 << exp_bits) - 1:
            out[code] = sign * np.inf if m == 0 else np.nan
            continue
        if e == 0:
            val = m / (1 << man_bits) * 2.0 ** (1 - bias)
        else:
            val = (1 + m / (1 << man_bits)) * 2.0 ** (e - bias)
        out[code] = sign * val
    return out


FP8_E4M3_TABLE = _fp8_table(4, 3, fn=True)
FP8_E5M2_TABLE = _fp8_table(5, 2, fn=False)
FP8_MAX = {"F8_E4M3": 448.0, "F8_E5M2": 57344.0}


def bf16_to_f32(u16: np.ndarray) -> np.ndarray:
    return (np.asarray(u16, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 bits (round to nearest even, NaN kept quiet) as uint16."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))
    out = rounded.astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16)
    return out


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

"""ggml's own quantizers and dequantizers, called through ctypes, for comparisons in one run.

The library is the ``libggml-base.so`` that ``.ci/llama-cpp`` builds from the llama-cpp-python
sdist's vendored llama.cpp (outside the repository, in ``~/.cache/quant-workbench`` or
``$QW_LLAMA_CACHE``). Nothing here is used to produce the workbench's own results: it is the
yardstick the benchmarks (``quant-workbench bench --vs-ggml``) and tests measure against.

    quantize(type_name, x, imatrix=None) -> uint8 (rows, row_bytes)   ggml_quantize_chunk
    dequantize(type_name, raw, n_per_row) -> float32 (rows, n_per_row) type_traits.to_float

Both run on the calling thread (ggml's reference C code; ctypes releases the GIL), so their
timings are single-thread figures. Imports nothing from ``workbench``.
"""

from __future__ import annotations

import ctypes
import glob
import os

import numpy as np

LLAMA_CPP_VERSION = "0.3.36"


class GGMLUnavailable(RuntimeError):
    """libggml-base is not built here (run ``bash .ci/llama-cpp`` once)."""


def cache_dir() -> str:
    base = os.environ.get("QW_LLAMA_CACHE") or os.path.expanduser("~/.cache/quant-workbench")
    return os.path.join(base, f"llama-cpp-python-{LLAMA_CPP_VERSION}")


def library_path() -> str | None:
    """The built libggml-base shared library, or None."""
    root = cache_dir()
    if not os.path.exists(os.path.join(root, ".built")):
        return None
    for pat in ("build/bin/libggml-base.so", "build/bin/libggml-base.so.*",
                "build/**/libggml-base.so"):
        hits = sorted(glob.glob(os.path.join(root, pat), recursive=True))
        if hits:
            return hits[0]
    return None


class _Traits(ctypes.Structure):
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                ("from_float_ref", ctypes.c_void_p)]


_TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
_lib = None


def _load():
    global _lib
    if _lib is None:
        path = library_path()
        if path is None:
            raise GGMLUnavailable(f"libggml-base is not built under {cache_dir()}; "
                                  "run `bash .ci/llama-cpp` once")
        lib = ctypes.CDLL(path)
        lib.ggml_quantize_chunk.restype = ctypes.c_size_t
        lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                            ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                            ctypes.c_void_p]
        lib.ggml_row_size.restype = ctypes.c_size_t
        lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
        lib.ggml_get_type_traits.restype = ctypes.POINTER(_Traits)
        lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
        lib.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
        lib.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]
        _lib = lib
    return _lib


def available() -> bool:
    try:
        _load()
        return True
    except (GGMLUnavailable, OSError):
        return False


def type_id(type_name: str) -> int:
    """ggml_type of a GGML type name ("q4_k", "Q4_K", "iq4_nl"): gguf's enum mirrors ggml's."""
    import gguf
    try:
        return int(gguf.GGMLQuantizationType[type_name.upper()])
    except KeyError:
        raise ValueError(f"unknown GGML type {type_name!r}") from None


def block_size(type_name: str) -> int:
    return int(_load().ggml_get_type_traits(type_id(type_name)).contents.blck_size)


def row_bytes(type_name: str, n_per_row: int) -> int:
    return int(_load().ggml_row_size(type_id(type_name), n_per_row))


def quantize(type_name: str, x: np.ndarray, imatrix: np.ndarray | None = None) -> np.ndarray:
    """ggml_quantize_chunk over all rows of the 2-D float32 `x` (one thread). `imatrix`: the
    per-column importance (length x.shape[1]), as llama-quantize passes it. Returns uint8
    (rows, row_bytes)."""
    lib = _load()
    t = type_id(type_name)
    x = np.ascontiguousarray(x, np.float32)
    if x.ndim != 2:
        raise ValueError("x must be 2-D")
    rows, n = x.shape
    if n % block_size(type_name):
        raise ValueError(f"{type_name}: row length {n} is not a multiple of {block_size(type_name)}")
    qw = None
    if imatrix is not None:
        qw = np.ascontiguousarray(imatrix, np.float32).reshape(-1)
        if qw.size != n:
            raise ValueError(f"imatrix has {qw.size} values for rows of {n}")
    elif lib.ggml_quantize_requires_imatrix(t):
        raise ValueError(f"{type_name} needs an imatrix in ggml")
    rb = row_bytes(type_name, n)
    out = np.empty((rows, rb), np.uint8)
    wrote = lib.ggml_quantize_chunk(t, x.ctypes.data, out.ctypes.data, 0, rows, n,
                                    None if qw is None else qw.ctypes.data)
    if wrote != rows * rb:
        raise RuntimeError(f"ggml_quantize_chunk wrote {wrote} bytes, expected {rows * rb}")
    return out


def dequantize(type_name: str, raw: np.ndarray, n_per_row: int,
               out: np.ndarray | None = None) -> np.ndarray:
    """ggml's to_float of uint8 rows (rows, row_bytes) -> float32 (rows, n_per_row), one call.
    out: an optional C-contiguous float32 array of rows * n_per_row elements to write into."""
    lib = _load()
    t = type_id(type_name)
    fn = lib.ggml_get_type_traits(t).contents.to_float
    if not fn:
        raise ValueError(f"{type_name} has no to_float in ggml")
    raw = np.ascontiguousarray(raw, np.uint8)
    rb = row_bytes(type_name, n_per_row)
    if raw.size % rb:
        raise ValueError(f"{raw.size} bytes are not whole rows of {rb}")
    rows = raw.size // rb
    if out is None:
        out = np.empty((rows, n_per_row), np.float32)
    elif out.dtype != np.float32 or out.size != rows * n_per_row or not out.flags.c_contiguous:
        raise ValueError("out must be a C-contiguous float32 array of rows * n_per_row elements")
    _TO_FLOAT(fn)(raw.ctypes.data, out.ctypes.data, rows * n_per_row)
    return out

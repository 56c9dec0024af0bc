"""GGUF files, read with the `gguf` package's memory-mapped GGUFReader.

Tensor shapes are reported in PyTorch order (outermost first); GGUF lists them innermost
first. Quantized tensors keep their GGML type as dtype (Q4_K, ...) and are dequantized on
demand, row chunk by row chunk.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import WorkbenchError
from ..model import Model, TensorInfo

_PLAIN = {"F32": "F32", "F16": "F16", "BF16": "BF16", "F64": "F64", "I8": "I8", "I16": "I16",
          "I32": "I32", "I64": "I64"}


def _field_value(field):
    import gguf
    try:
        if not field.types:
            return None
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            if len(field.data) > 64:
                return f"[{len(field.data)} items]"
            return [field.contents(i) for i in range(len(field.data))]
        return field.contents()
    except Exception:  # noqa: BLE001 - metadata display must not stop loading
        return None


def open_gguf(path: str | os.PathLike) -> Model:
    import gguf
    p = str(Path(path))
    if not os.path.exists(p):
        raise WorkbenchError("file not found", path=p)
    try:
        reader = gguf.GGUFReader(p, "r")
    except (ValueError, IndexError, KeyError, OSError, struct_error()) as exc:
        raise WorkbenchError(f"corrupt or truncated GGUF ({type(exc).__name__}: "
                             f"{str(exc)[:160]})", path=p) from None
    tensors: dict[str, TensorInfo] = {}
    by_name = {}
    for t in reader.tensors:
        type_name = t.tensor_type.name
        shape = tuple(int(s) for s in reversed([int(x) for x in t.shape]))
        while len(shape) > 1 and shape[0] == 1 and len(t.shape) > len(shape):
            shape = shape[1:]
        dtype = _PLAIN.get(type_name, type_name)
        tensors[t.name] = TensorInfo(t.name, shape, dtype, int(t.n_bytes), p)
        by_name[t.name] = t
    metadata = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        metadata[key] = _field_value(field)

    def raw(name: str) -> np.ndarray:
        t = by_name[name]
        info = tensors[name]
        data = t.data
        rows = info.rows
        if info.dtype == "BF16":
            return np.asarray(data).view(np.uint16).reshape(rows, -1)
        return np.asarray(data).reshape(rows, -1)

    return Model(p, "gguf", tensors, raw, metadata, source=reader)


def struct_error():
    import struct
    return struct.error

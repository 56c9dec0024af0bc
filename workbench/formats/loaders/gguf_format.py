"""GGUF files, read with the project's memory-mapped reader (``gguf_reader.GGUFFile``).

GGUF lists a tensor's dimensions innermost first (ggml's ne[0] is the row length); the
catalog reports them in PyTorch order (outermost first), so a llama.cpp ``blk.0.attn_q.weight``
of ne = [4096, 1024] is shape (1024, 4096): 1024 output channels of 4096 inputs. Each
tensor keeps its GGML type as dtype (F32, F16, BF16, Q4_K, IQ4_NL, ...) and its real size on
disk, so bits per weight and totals are the file's own. Quantized tensors are dequantized on
demand, row chunk by row chunk (workbench.schemes.ggml_decode). ``Model.source`` is the GGUFFile, which
the GGUF exporter uses to copy metadata and raw tensor bytes.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.formats.model import Model, TensorInfo

# GGUF type name -> catalog dtype (plain types share safetensors' names)
_PLAIN = {"F32": "F32", "F16": "F16", "BF16": "BF16", "F64": "F64", "I8": "I8", "I16": "I16",
          "I32": "I32", "I64": "I64"}
MAX_LISTED = 64  # metadata arrays longer than this are summarised for display


def field_value(field, max_items: int | None = MAX_LISTED):
    """A GGUF field as a Python value (long arrays summarised as '[N items]')."""
    v = field.value
    if isinstance(v, (list, np.ndarray)) and max_items is not None and len(v) > max_items:
        return f"[{len(v)} items]"
    return field.contents()


def torch_shape(reader_tensor) -> tuple[int, ...]:
    """PyTorch-order shape of a GGUF tensor (GGUF stores ne[0] = innermost first)."""
    dims = [int(x) for x in reader_tensor.shape]
    return tuple(reversed(dims)) if dims else (1,)


def open_gguf(path: str | os.PathLike) -> Model:
    from workbench.formats.loaders.gguf_reader import GGUFFile
    p = str(Path(path))
    if not os.path.exists(p):
        raise WorkbenchError("file not found", path=p)
    from workbench.core.limits import prescan_gguf
    try:
        prescan_gguf(p)
    except struct.error:
        raise WorkbenchError("truncated GGUF header", path=p) from None
    try:
        reader = GGUFFile(p)
    except (ValueError, IndexError, KeyError, OSError, struct.error, TypeError,
            OverflowError) as exc:
        raise WorkbenchError(f"corrupt or truncated GGUF ({type(exc).__name__}: "
                             f"{str(exc)[:160]})", path=p) from None
    tensors: dict[str, TensorInfo] = {}
    by_name = {}
    for t in reader.tensors:
        type_name = t.tensor_type.name
        shape = torch_shape(t)
        dtype = _PLAIN.get(type_name, type_name)
        tensors[t.name] = TensorInfo(t.name, shape, dtype, int(t.n_bytes), p)
        by_name[t.name] = t
    metadata = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        metadata[key] = field_value(field)

    def raw(name: str) -> np.ndarray:
        t = by_name[name]
        info = tensors[name]
        data = t.data
        if data.size == 0:
            return data.reshape(info.rows, 0)
        return data.reshape(info.rows, -1)

    return Model(p, "gguf", tensors, raw, metadata, source=reader)

"""The bytes of each tensor of a GGUF export: copied from a GGUF source, kept or widened
exactly, or encoded with the plan's scheme (after llama.cpp's layout change where it has one).
A large tensor is cut into row chunks, each a task of its own: workbench.export.gguf_pool runs
the tasks (on worker threads, the kernels releasing the GIL, or on a cluster's workers) and
workbench.export.gguf_file writes their bytes in order.
"""

from __future__ import annotations

import threading

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.export.gguf_items import FLOAT_SCHEMES, KEEP_TYPES, _Item
from workbench.formats.model import Model
from workbench.schemes import get_scheme


CHUNK_ELEMENTS = 1 << 22

FUSED_WIDENING = {"q4_0", "q8_0"}   # schemes with a kernel that widens F16/BF16 as it quantizes

_scratch = threading.local()   # per worker thread: one float32 buffer for decoded row chunks


def _scratch_f32(n: int) -> np.ndarray:
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.size < n:
        buf = _scratch.buf = np.empty(n, np.float32)
    return buf[:n]


def _row_chunks(model, item: _Item):
    """The row ranges a tensor is quantized in as separate tasks, or None when it is one task:
    a loader's tensor (not a method's model) re-encoded by a scheme, without a layout change,
    is cut into chunks of about CHUNK_ELEMENTS, so a large tensor spreads over the workers.
    Each chunk's bytes are those of the same rows quantized alone: the GGML and float schemes
    encode rows independently (and the exporter always quantized in these row chunks)."""
    if item.data is not None:
        return [("extra", item.data)]
    if item.parts is not None:
        return [("part", k) for k in range(len(item.parts))]
    if item.how in ("copy", "keep", "widen") and not item.transform and isinstance(model, Model):
        return _kept_chunks(model, item)
    if item.how != "scheme" or item.transform or not isinstance(model, Model):
        return None
    info = model.info(item.name)
    rows, cols = info.matrix_shape
    step = max(1, CHUNK_ELEMENTS // max(cols, 1))
    return [("rows", r0, min(rows, r0 + step)) for r0 in range(0, rows, step)] or None


KEPT_CHUNK_BYTES = 16 << 20   # a tensor copied or kept above 4x this goes in row slices of it


def _kept_chunks(model, item: _Item):
    """Row ranges of a large tensor written unchanged (copied from a GGUF source, kept, or
    widened to F32), so it is read and written a slice at a time (the loader reads the rows
    asked for: the whole tensor is never held); None for a small one (one task)."""
    info = model.info(item.name)
    if info.nbytes <= 4 * KEPT_CHUNK_BYTES or (item.how != "copy" and (
            info.quant or info.dtype not in KEEP_TYPES)):
        return None
    rows = info.rows
    if rows < 2:
        return None
    step = max(1, KEPT_CHUNK_BYTES // max(1, info.nbytes // rows))
    return [("kept", r0, min(rows, r0 + step)) for r0 in range(0, rows, step)]


def _kept_data(model, item: _Item, r0: int, r1: int) -> list[np.ndarray]:
    """The bytes of rows r0:r1 of a tensor written unchanged: the same bytes as
    _tensor_parts writes for the whole tensor, a slice of them."""
    info = model.info(item.name)
    raw = np.asarray(model.raw(item.name)[r0:r1])
    if item.how == "copy":
        return [np.ascontiguousarray(raw)]
    from workbench.formats.dtypes import decode_rows
    from workbench.core.errors import context
    if item.how == "widen":
        with context(info.file or model.path, info.name):
            return [np.ascontiguousarray(decode_rows(raw, info), np.float32)]
    if info.dtype in ("F8_E4M3", "F8_E5M2"):
        with context(info.file or model.path, info.name):
            return [np.ascontiguousarray(decode_rows(raw, info).astype(np.float16))]
    if info.dtype == "U64" and raw.size and int(raw.max()) > np.iinfo(np.int64).max:
        raise WorkbenchError("U64 values beyond the int64 range have no GGUF type",
                             tensor=item.name)
    return [np.ascontiguousarray(raw).astype(KEEP_TYPES[info.dtype][1], copy=False)]


def _part_data(model, item: _Item, k: int) -> list[np.ndarray]:
    """The bytes of part k of a layout tensor (one expert of a merged tensor, one head of a
    split MLA tensor): its rows read, reshaped, cut and transposed as the part says, then
    encoded with the item's type (a task of its own, on a worker)."""
    from dataclasses import replace
    part = item.parts[k]
    info = model.info(part.src)
    if isinstance(model, Model):
        m = _decode(model, info, part.r0, part.r1)
    else:   # a method's model: its (whole) matrix
        m = model.read_matrix(part.src)[part.r0:part.r1]
    if part.reshape_rows is not None:
        m = m.reshape(part.reshape_rows, -1)
    if part.sub is not None:
        m = m[part.sub[0]:part.sub[1]]
    if part.transpose:
        m = m.T
    m = np.ascontiguousarray(m, dtype=np.float32)
    if item.how == "scheme":
        if part.transpose and item.scheme not in FLOAT_SCHEMES and \
                getattr(model, "quantize_tensor", None) is not None:
            # a method's (GPTQ/AWQ) statistics belong to the source's input columns; the
            # transposed part (DeepSeek's attn_k_b) has other columns: rounded to nearest
            from workbench.quant.evaluate import quantize
            qt = quantize(m, item.scheme, tensor=part.src)
            return [np.ascontiguousarray(next(iter(qt.arrays.values())))]
        return [_encode_chunk(model, replace(item, name=part.src), m)]
    return [_float_as(m, item.gtype)]


def _float_as(w: np.ndarray, gtype: str) -> np.ndarray:
    """float32 values (decoded from an F32/F16/BF16 source, so exact in `gtype`) as the bytes
    of GGUF type `gtype`."""
    if gtype == "F32":
        return np.ascontiguousarray(w, dtype=np.float32)
    if gtype == "F16":
        return np.ascontiguousarray(w.astype(np.float16))
    if gtype == "BF16":   # exact: the values came from bfloat16
        return np.ascontiguousarray((np.ascontiguousarray(w, np.float32).view(np.uint32)
                                     >> 16).astype(np.uint16))
    raise WorkbenchError(f"internal error: no float encoding for {gtype}")


def _decode(model, info, r0: int, r1: int) -> np.ndarray:
    """float32 rows r0:r1 of a loader's tensor. F16/BF16 are widened into the worker thread's
    reused buffer (overwritten by its next chunk: callers copy what they keep)."""
    raw = model.raw(info.name)[r0:r1]
    if info.dtype in ("F16", "BF16") and not info.quant:
        try:
            from kernels import convert
        except ImportError:
            convert = None
        if convert is not None:
            widen = convert.f16_to_f32 if info.dtype == "F16" else convert.bf16_to_f32
            return widen(raw, out=_scratch_f32(raw.size).reshape(raw.shape))
    from workbench.formats.dtypes import decode_rows
    from workbench.core.errors import context
    with context(info.file or model.path, info.name):
        return decode_rows(raw, info)


def _chunk_data(model, item: _Item, r0: int, r1: int) -> list[np.ndarray]:
    """The bytes of rows r0:r1 of one output tensor (a task of its own, on a worker).
    F16/BF16 rows go to Q4_0/Q8_0 in one pass where the kernel takes them (no float32 copy);
    anything it declines is widened and quantized as before, the same bytes either way."""
    info = model.info(item.name)
    if info.dtype in ("F16", "BF16") and not info.quant and item.scheme in FUSED_WIDENING:
        qt = _quantize_widening(item.scheme, model.raw(info.name)[r0:r1], info.dtype)
        if qt is not None:
            return [np.ascontiguousarray(qt.arrays["blocks"])]
    chunk = _decode(model, info, r0, r1)
    return [_encode_chunk(model, item, chunk)]


def _quantize_widening(scheme: str, raw, dtype: str):
    try:
        from workbench.quant.accel import quantize_widening
    except ImportError:
        return None
    return quantize_widening(scheme, raw, dtype)


def _encode_chunk(model, item: _Item, chunk: np.ndarray) -> np.ndarray:
    from workbench.quant.evaluate import quantize
    method_q = getattr(model, "quantize_tensor", None)
    if method_q is not None and item.scheme not in FLOAT_SCHEMES:
        qt = method_q(item.name, chunk, item.scheme)
    elif item.scheme in FLOAT_SCHEMES:
        from workbench.quant.evaluate import check_representable
        qt = get_scheme(item.scheme).quantize(chunk, tensor=item.name)
        check_representable(qt, chunk, item.name)
    else:
        qt = quantize(chunk, item.scheme, tensor=item.name)
    out = next(iter(qt.arrays.values()))
    if np.may_share_memory(out, chunk):   # e.g. a reused buffer passed through: keep a copy
        out = out.copy()
    return np.ascontiguousarray(out)


def _tensor_data(model, item: _Item, reader_tensors, target=None) -> list[np.ndarray]:
    """The bytes of one output tensor as a list of C-contiguous arrays written one after the
    other (float tensors quantized in row chunks with the numba kernels where they exist).
    Runs on worker threads: the kernels release the GIL."""
    data = _tensor_parts(model, item, reader_tensors, target)
    return data if isinstance(data, list) else [data]


def _tensor_parts(model, item: _Item, reader_tensors, target=None):
    info = model.info(item.name)
    if item.how == "copy":
        return np.asarray(reader_tensors[item.name].data)
    if item.how == "widen" and not item.transform:
        return model.read_matrix(item.name).astype(np.float32, copy=False)
    if item.transform:
        from workbench.export.gguf_transform import transform
        w = transform(target, item.name, model.read_matrix(item.name).reshape(info.shape))
        if item.how in ("keep", "widen"):
            return _float_as(np.asarray(w, np.float32), item.gtype)
        rows = [w.reshape(w.shape[0], -1)]
    elif item.how == "keep":
        if info.quant or info.dtype not in KEEP_TYPES:
            return model.read_matrix(item.name).astype(np.float32, copy=False)
        np_dtype = KEEP_TYPES[info.dtype][1]
        raw = np.asarray(model.raw(item.name))
        if info.dtype in ("F8_E4M3", "F8_E5M2"):
            return model.read_matrix(item.name).astype(np.float16)
        if info.dtype == "U64" and raw.size and int(raw.max()) > np.iinfo(np.int64).max:
            raise WorkbenchError("U64 values beyond the int64 range have no GGUF type",
                                 tensor=item.name)
        return np.ascontiguousarray(raw).astype(np_dtype, copy=False)
    elif getattr(model, "quantize_tensor", None) is not None:
        rows = [model.read_matrix(item.name)]   # a method (workbench.quant.methods): the whole matrix
    else:
        rows = (chunk for _r0, chunk in model.iter_rows(item.name, max_elements=CHUNK_ELEMENTS))
    return [_encode_chunk(model, item, chunk) for chunk in rows]

"""Export a GGUF file (llama.cpp's format), each tensor encoded per the plan.

* From a GGUF source: every key/value is copied (``general.architecture`` and
  ``general.alignment`` included), then ``general.file_type`` is set to the llama_ftype of the
  type that holds most weight parameters (the way llama-quantize labels its output; K-quants
  map to the _M variants that llama-quantize's plain ``Q4_K`` etc. aliases name) and
  ``general.quantization_version`` to 2. A ``keep`` tensor is copied byte for byte.
* From safetensors / PyTorch: the tensors keep their original names (llama.cpp will not run
  such a file, but every GGUF reader can open it); ``general.architecture`` is
  ``quant_workbench``.
* Both carry the plan as JSON in ``quant_workbench.plan``.

Tensor types: ``keep`` (the source's own type; types GGUF lacks are widened exactly:
U8->I16, U16->I32, U32->I64, BOOL->I8, FP8->F16), ``fp32``/``fp16``/``bf16`` (F32/F16/BF16) and
every GGML block scheme (Q4_0 ... Q6_K, IQ4_NL), whose bytes are exactly
``scheme.quantize(w).arrays["blocks"]``. Any other scheme, or a tensor whose row length
(innermost dimension) is not a multiple of the GGML block, is refused with a WorkbenchError
naming the tensor, before anything is written.

Header, key/values and tensor infos are written with gguf.GGUFWriter, then the tensor data in
file order (padded to the alignment as the package pads it) with os.write. Re-encoded tensors
are cut into row chunks that worker threads quantize in parallel (numba kernels, GIL released)
while this thread writes finished chunks in order; at most 2 x workers + 2 tasks are in
flight, so memory is bounded by a few chunks (and whole tensors for copies and widenings).
F16/BF16 rows bound for Q4_0/Q8_0 are widened inside the quantize kernel itself
(accel.quantize_widening), the same bytes as widening them first.
Atomic: a temporary file beside the target, renamed over it on success, removed on error or
cancel.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..atomic import default_file_mode, make_temp
from ..errors import WorkbenchError
from ..model import Model
from ..plan import KEEP
from ..progress import Progress
from ..schemes import get_scheme
from . import register_exporter

ARCH_FOR_NON_GGUF = "quant_workbench"
PLAN_KEY = "quant_workbench.plan"
QUANTIZATION_VERSION = 2
CHUNK_ELEMENTS = 1 << 22

FLOAT_SCHEMES = {"fp32": "F32", "fp16": "F16", "bf16": "BF16"}
FUSED_WIDENING = {"q4_0", "q8_0"}   # schemes with a kernel that widens F16/BF16 as it quantizes
# catalog dtype -> (GGUF type name, numpy dtype written) for `keep` from non-GGUF sources
KEEP_TYPES = {
    "F32": ("F32", np.float32), "F16": ("F16", np.float16), "BF16": ("BF16", np.uint16),
    "F64": ("F64", np.float64), "I8": ("I8", np.int8), "I16": ("I16", np.int16),
    "I32": ("I32", np.int32), "I64": ("I64", np.int64),
    # GGUF has no unsigned or FP8 tensor types: widen exactly
    "U8": ("I16", np.int16), "U16": ("I32", np.int32), "U32": ("I64", np.int64),
    "U64": ("I64", np.int64), "BOOL": ("I8", np.int8),
    "F8_E4M3": ("F16", np.float16), "F8_E5M2": ("F16", np.float16),
}
# metadata keys never copied from a GGUF source (rewritten here or meaningless in one file)
SKIP_KEYS = {"general.architecture", "general.file_type", "general.quantization_version",
             "general.alignment", "split.no", "split.count", "split.tensors.count",
             PLAN_KEY, "quant_workbench.source_format"}
# GGML type -> llama_ftype name (llama-quantize's aliases: Q3_K = Q3_K_M, Q4_K = Q4_K_M, ...)
FTYPE_OF = {"F32": "ALL_F32", "F16": "MOSTLY_F16", "BF16": "MOSTLY_BF16", "Q4_0": "MOSTLY_Q4_0",
            "Q4_1": "MOSTLY_Q4_1", "Q5_0": "MOSTLY_Q5_0", "Q5_1": "MOSTLY_Q5_1",
            "Q8_0": "MOSTLY_Q8_0", "Q2_K": "MOSTLY_Q2_K", "Q3_K": "MOSTLY_Q3_K_M",
            "Q4_K": "MOSTLY_Q4_K_M", "Q5_K": "MOSTLY_Q5_K_M", "Q6_K": "MOSTLY_Q6_K",
            "IQ4_NL": "MOSTLY_IQ4_NL"}


@dataclass
class _Item:
    name: str         # the source's name
    out: str          # the name written
    shape: tuple      # the shape written
    gtype: str        # GGUF type name written
    nbytes: int
    how: str          # "copy" | "keep" | "scheme"
    scheme: str       # scheme name ("keep" for copies)
    transform: bool = False   # llama.cpp layout differs from the source's (gguf_arch.transform)
    parts: list | None = None  # gguf_arch.Part list: merged experts, MLA split, fused experts
    src_dtype: str = ""       # the source's dtype (of every part)
    data: np.ndarray | None = None   # a tensor computed from config.json (rope_freqs)


def _gtype(name: str):
    import gguf
    return gguf.GGMLQuantizationType[name]


def _type_nbytes(gtype: str, shape: tuple) -> int:
    import gguf
    block, size = gguf.GGML_QUANT_SIZES[_gtype(gtype)]
    n = int(np.prod(shape)) if shape else 1
    return n // block * size


def _plan_items(model, decisions, from_gguf: bool, target=None,
                plan=None) -> tuple[list[_Item], list[str]]:
    """What each tensor becomes, and the tensors llama.cpp's converter drops; raises before
    anything is written if a tensor cannot be written. With a Hugging Face `target`, the
    output tensors are its layout's (merged experts, split MLA tensors); their decisions come
    from their source tensors' (the experts of one merged tensor must agree), decided again
    for the output's own row length where it differs (`plan` gives the rules)."""
    from .gguf_arch import needs_transform
    items, dropped = [], []
    if target is None:
        for name, info in model.tensors.items():
            shape = tuple(int(s) for s in info.shape) or (1,)
            items.append(_item(model, info, decisions[name], name, shape, from_gguf, None))
        return items, dropped
    used = set()
    for o in target.layout:
        used.update(o.sources)
        info = model.info(o.sources[0])
        d = _out_decision(model, o, decisions, plan)
        items.append(_item(model, info, d, o.out, tuple(o.shape), False, target,
                           transform=o.parts is None and needs_transform(target, o.sources[0]),
                           parts=o.parts))
    dropped = [n for n in model.tensors if n not in used]
    return items, dropped


def _out_decision(model, o, decisions, plan):
    """The decision for output tensor `o` of a Hugging Face target."""
    from ..runtimes import decide
    ds = [decisions[n] for n in o.sources]
    applied = {d.applied for d in ds}
    if len(applied) > 1:
        by = {}
        for n, d in zip(o.sources, ds):
            by.setdefault(d.applied, []).append(n)
        detail = "; ".join(f"{k}: {len(v)} ({v[0]}{' ...' if len(v) > 1 else ''})"
                           for k, v in by.items())
        raise WorkbenchError(
            f"llama.cpp stores these {len(o.sources)} experts as one tensor {o.out} of one type, "
            f"but the plan gives them different schemes ({detail}): give every expert of the "
            "projection the same scheme (one rule matching them all)", tensor=o.sources[0])
    if not o.resplit:
        return ds[0]
    d0 = ds[0]
    info = model.info(o.sources[0])
    fallback = plan.fallback_for(o.sources[0]) if plan is not None else None
    explicit = d0.kind == "skipped" or (plan is not None and plan.scheme_and_source(
        info.name, info.ndim, info.is_float)[1])
    return decide(info, d0.requested, "llama.cpp", fallback=fallback, explicit=explicit,
                  gguf_name=o.out, shape=o.matrix_shape)


def _item(model, info, d, out: str, shape: tuple, from_gguf: bool, target, transform=False,
          parts=None) -> _Item:
    from ..runtimes import get_runtime
    from ..schemes.ggml import GGMLScheme
    name = info.name
    scheme = d.applied
    if scheme == KEEP:
        if from_gguf:
            return _Item(name, out, shape, info.dtype, info.nbytes, "copy", KEEP)
        if info.quant or info.dtype not in KEEP_TYPES:
            gt = "F32"  # stored quantized in a non-GGUF container: its float32 decoding
        elif target is not None and info.dtype in ("F16", "BF16") \
                and get_runtime("llama.cpp").never_retyped(info, out):
            # llama.cpp's CPU ops take norms, biases, position and token-type embeddings
            # as F32 (its converter writes them so): widen exactly
            gt = "F32"
        elif transform and info.dtype not in ("F32", "F16", "BF16"):
            gt = "F32"
        else:
            gt = KEEP_TYPES[info.dtype][0]
        if parts is not None and info.dtype not in ("F32", "F16", "BF16"):
            gt = "F32"
        how = "keep" if gt == KEEP_TYPES.get(info.dtype, ("",))[0] else "widen"
        return _Item(name, out, shape, gt, _type_nbytes(gt, shape), how, KEEP, transform,
                     parts, info.dtype)
    s = get_scheme(scheme)
    if isinstance(s, GGMLScheme):
        gt = s.ggml_name
    elif s.name in FLOAT_SCHEMES:
        gt = FLOAT_SCHEMES[s.name]
    else:  # runtimes.decide refuses these for llama.cpp; kept as a guard
        raise WorkbenchError(f"scheme '{s.name}' has no GGUF tensor type", tensor=name)
    return _Item(name, out, shape, gt, _type_nbytes(gt, shape), "scheme", s.name, transform,
                 parts, info.dtype)


def _file_type(items: list[_Item], source_ftype=None) -> int:
    """llama_ftype of the type holding most parameters of the >= 2-D tensors."""
    import gguf
    counts: dict[str, int] = {}
    for it in items:
        if len(it.shape) >= 2:
            counts[it.gtype] = counts.get(it.gtype, 0) + int(np.prod(it.shape))
    if not counts:
        return int(gguf.LlamaFileType.ALL_F32)
    top = max(counts, key=lambda k: counts[k])
    name = FTYPE_OF.get(top) or f"MOSTLY_{top}"
    if name in gguf.LlamaFileType.__members__:
        return int(gguf.LlamaFileType[name])
    if isinstance(source_ftype, int):
        return source_ftype
    return int(gguf.LlamaFileType.GUESSED)


def _fast_writer_class():
    """gguf.GGUFWriter whose metadata arrays of strings or plain numbers are packed in one go
    (the package packs them item by item: 0.15 s for MiniLM's 30,522-token vocabulary, half
    of a whole Q4_0 export). The bytes are the package's own layout (tested against
    GGUFReader); anything else goes to the package's code."""
    import struct

    import gguf
    VT = gguf.GGUFValueType
    fmts = getattr(gguf.GGUFWriter, "_simple_value_packing", {})

    class FastKVWriter(gguf.GGUFWriter):
        def _pack_val(self, val, vtype, add_vtype, sub_type=None):
            if (vtype == VT.ARRAY and sub_type is not None and len(val) > 16
                    and self.endianess == gguf.GGUFEndian.LITTLE
                    and (sub_type == VT.STRING or (sub_type in fmts and sub_type != VT.BOOL))):
                head = (struct.pack("<I", int(VT.ARRAY)) if add_vtype else b"") + struct.pack(
                    "<IQ", int(sub_type), len(val))
                return self._pack_array(val, sub_type, head)
            return super()._pack_val(val, vtype, add_vtype, sub_type=sub_type)

        def _pack_array(self, val, sub_type, head):
            if sub_type == VT.STRING:
                items = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in val]
                lens = np.fromiter((len(b) for b in items), np.uint64, len(items))
                parts = [None] * (2 * len(items))
                parts[0::2] = [x.tobytes() for x in lens.astype("<u8")]
                parts[1::2] = items
                return head + b"".join(parts)
            return head + np.asarray(val).astype("<" + fmts[sub_type]).tobytes()

    return FastKVWriter



class _Recorder:
    """Passes a writer's ``add_*`` calls through and records them, for `_write_tokenizer_once`."""

    def __init__(self, writer):
        self._writer = writer
        self.calls: list = []

    def __getattr__(self, name):
        attr = getattr(self._writer, name)
        if not (name.startswith("add_") and callable(attr)):
            return attr

        def call(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            return attr(*args, **kwargs)
        return call


#: {(folder, its sidecar files' signatures): (vocabulary size, tokens, recorded calls)}
_TOKENIZER_KV: dict = {}


def _write_tokenizer_once(writer, hf) -> int:
    """`write_tokenizer`, its key/values recorded once per tokenizer and replayed after: a file
    budget writes the header of every plan it tries (`layout_bytes`), and a 49k-262k token
    vocabulary took a second or more each time. The key is the folder and the size and
    mtime of every file in it but the weights, so an edited tokenizer is read again."""
    from .gguf_arch import write_tokenizer
    from ..stats import file_signature
    folder = Path(hf.folder)
    try:
        side = tuple(sorted((p.name, file_signature(p)) for p in folder.iterdir()
                            if p.suffix not in (".safetensors", ".bin", ".gguf", ".pt", ".pth")))
    except OSError:
        return write_tokenizer(writer, hf)
    key = (str(folder.resolve()), side)
    hit = _TOKENIZER_KV.get(key)
    if hit is None:
        rec = _Recorder(writer)
        n = write_tokenizer(rec, hf)
        _TOKENIZER_KV.clear()
        _TOKENIZER_KV[key] = (n, hf.tokens, rec.calls)
        return n
    n, tokens, calls = hit
    hf.tokens = tokens
    for name, args, kwargs in calls:
        getattr(writer, name)(*args, **kwargs)
    return n


def _copy_fields(writer, reader) -> list[str]:
    """Copy every key/value of a GGUF source byte-faithfully. Returns keys it could not copy."""
    import gguf
    VT = gguf.GGUFValueType
    skipped = []
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in SKIP_KEYS or not field.types:
            continue
        main = field.types[0]
        if main == VT.ARRAY:
            if len(field.types) != 2 or len(field.value) == 0:
                skipped.append(key)  # nested or empty arrays: GGUFWriter cannot write them
                continue
            sub = field.types[1]
            val = list(field.value) if sub == VT.STRING else field.value.tolist()
            writer.add_key_value(key, val, VT.ARRAY, sub_type=sub)
        else:
            writer.add_key_value(key, field.value, main)
    return skipped


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
    from ..dtypes import decode_rows
    from ..errors import context
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
            from ..evaluate import quantize
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
    from ..dtypes import decode_rows
    from ..errors import context
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
        from ..accel import quantize_widening
    except ImportError:
        return None
    return quantize_widening(scheme, raw, dtype)


def _encode_chunk(model, item: _Item, chunk: np.ndarray) -> np.ndarray:
    from ..evaluate import quantize
    method_q = getattr(model, "quantize_tensor", None)
    if method_q is not None and item.scheme not in FLOAT_SCHEMES:
        qt = method_q(item.name, chunk, item.scheme)
    elif item.scheme in FLOAT_SCHEMES:
        from ..evaluate import check_representable
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
        from .gguf_arch import transform
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
        rows = [model.read_matrix(item.name)]   # a method (workbench.methods): the whole matrix
    else:
        rows = (chunk for _r0, chunk in model.iter_rows(item.name, max_elements=CHUNK_ELEMENTS))
    return [_encode_chunk(model, item, chunk) for chunk in rows]


def _write_all(fd: int, data) -> int:
    """Write bytes or a C-contiguous array to fd entirely; returns the byte count."""
    mv = memoryview(data if isinstance(data, bytes) else data.reshape(-1).view(np.uint8))
    n = len(mv)
    while mv:
        mv = mv[os.write(fd, mv):]
    return n


def _workers() -> int:
    """Tensors quantized at once: numba's thread count (all cores, or `export --threads N`,
    or NUMBA_NUM_THREADS), at most 8. Each worker runs its kernels on one thread, so the
    export computes on exactly that many threads."""
    try:
        import numba
        n = numba.get_num_threads()
    except ImportError:
        n = os.cpu_count() or 1
    return max(1, min(8, n))


def _one_kernel_thread() -> None:
    try:
        import numba
        numba.set_num_threads(1)
    except ImportError:
        pass


class _ClusterPool:
    """The export's pool on a cluster (workbench.cluster): a task's item and rows travel, the
    worker opens the model by path and sends the encoded bytes back; this process writes them
    in order, as with the local threads. Leaving it cancels what is still queued."""

    REMOTE = ("_tensor_data", "_part_data", "_kept_data", "_chunk_data")

    def __init__(self, executor, model):
        from ..cluster import signature
        self.ex, self.sig, self.futs = executor, signature(model), []

    def submit(self, fn, *args):
        if getattr(fn, "__name__", "") not in self.REMOTE:
            return _Done(fn(*args))           # data held here already (rope_freqs)
        item, rest = args[1], args[2:]
        if fn.__name__ == "_tensor_data":
            rest = ()                         # the source reader and layout: rebuilt there
        fut = self.ex.submit(_remote_task, self.sig, fn.__name__, item, *rest,
                             key=f"gguf{fn.__name__}")
        self.futs.append(fut)
        return _Remote(self.ex, fut)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.ex.cancel([f for f in self.futs if not f.done()])
        self.futs = []


class _Done:
    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


class _Remote:
    def __init__(self, ex, fut):
        self.ex, self.fut = ex, fut

    def result(self):
        return self.ex.result(self.fut)


_REMOTE_TARGETS: dict = {}


def _remote_task(sig, fn_name: str, item: _Item, *rest):
    """On a worker: one export task against the worker's own copy of the model."""
    from ..cluster import worker_model
    model = worker_model(sig)
    if fn_name == "_tensor_data":
        reader_tensors = {}
        if model.format == "gguf" and model.source is not None:
            reader_tensors = {t.name: t for t in model.source.tensors}
        hf = None
        if item.transform:
            if sig not in _REMOTE_TARGETS:
                from .gguf_arch import hf_target
                _REMOTE_TARGETS.clear()
                _REMOTE_TARGETS[sig] = hf_target(model)[0]
            hf = _REMOTE_TARGETS[sig]
        rest = (reader_tensors, hf)
    return globals()[fn_name](model, item, *rest)


@dataclass
class _Prepared:
    """What export_gguf decides before it writes: the items in file order and their source."""
    items: list
    dropped: list
    decisions: dict
    hf: object
    not_runnable: str | None
    from_gguf: bool
    reader: object
    arch: str
    source_ftype: int | None


def _prepare(model, plan, strict: bool = False) -> _Prepared:
    """The tensors a GGUF export of `plan` writes (raises before anything is written)."""
    from ..runtimes import check_strict, plan_decisions
    from .gguf_arch import extra_tensors, hf_target, refuses
    from_gguf = model.format == "gguf" and model.source is not None
    if from_gguf:      # the key/values copied must describe the tensors
        from ..config_check import check_gguf_metadata
        check_gguf_metadata(model)
    decisions = plan_decisions(model, plan, "llama.cpp")
    if strict:
        check_strict(decisions.values(), path=model.path)
    hf, not_runnable = (None, None) if from_gguf else hf_target(model)
    if not_runnable and refuses(model):
        raise WorkbenchError(f"not written: {not_runnable}", path=model.path)
    items, dropped = _plan_items(model, decisions, from_gguf, hf, plan)
    for it in items:   # GGUF stores names as UTF-8: a lone surrogate (from a JSON header's
        try:           # \udc80 escape) has no UTF-8 form
            it.out.encode("utf-8")
        except UnicodeEncodeError:
            raise WorkbenchError("tensor name holds a lone surrogate, which GGUF (UTF-8 names) "
                                 "cannot store: rename the tensor", path=model.path,
                                 tensor=it.out) from None
    if hf is not None:
        for name, arr in extra_tensors(hf):
            items.append(_Item(name, name, tuple(arr.shape), "F32", arr.nbytes, "extra", KEEP,
                               data=np.ascontiguousarray(arr, np.float32)))
    reader = model.source if from_gguf else None
    if reader is not None:
        arch_field = reader.fields.get("general.architecture")
        arch = arch_field.contents() if arch_field is not None and isinstance(
            arch_field.value, bytes) else ARCH_FOR_NON_GGUF
        src_ft = reader.fields.get("general.file_type")
        source_ftype = int(src_ft.value) if src_ft is not None and isinstance(
            src_ft.value, (int, np.integer)) else None
    elif hf is not None:
        arch, source_ftype = hf.arch_name, None
    else:
        arch, source_ftype = ARCH_FOR_NON_GGUF, None
    return _Prepared(items, dropped, decisions, hf, not_runnable, from_gguf, reader, arch,
                     source_ftype)


def _write_head(writer, model, plan, prep: _Prepared):
    """Key/values and tensor infos of the export (not yet written to the file):
    (skipped keys, vocabulary size, a note on general.name, file type)."""
    from .gguf_arch import name_breaks_loading, write_hparams, write_tokenizer
    hf, reader, items = prep.hf, prep.reader, prep.items
    skipped: list[str] = []
    n_vocab = None
    name_note = None
    if reader is not None:
        align = reader.fields.get("general.alignment")
        if align is not None and align.types:
            writer.add_custom_alignment(int(align.value))
        skipped = _copy_fields(writer, reader)
    else:
        model_name = (Path(model.path).stem if Path(model.path).is_file()
                      else Path(model.path).name).encode("utf-8", "replace").decode()
        if hf is None:
            writer.add_name(model_name)
        if hf is not None:
            import logging
            vocab_log = logging.getLogger("gguf.vocab")
            level = vocab_log.level
            vocab_log.setLevel(logging.ERROR)  # "No handler for special token type cls"
            try:
                write_hparams(writer, hf)
                n_vocab = _write_tokenizer_once(writer, hf)
            finally:
                vocab_log.setLevel(level)
            why = name_breaks_loading(model_name, hf)
            if why is None:
                writer.add_name(model_name)
            else:
                name_note = why
        if model.metadata:
            writer.add_string("quant_workbench.source_metadata",
                              json.dumps({str(k): str(v) for k, v in model.metadata.items()}))
    writer.add_string("quant_workbench.source_format", model.format)
    writer.add_string(PLAN_KEY, plan.to_json())
    file_type = _file_type(items, prep.source_ftype)
    writer.add_file_type(file_type)
    writer.add_quantization_version(QUANTIZATION_VERSION)
    for it in items:
        writer.add_tensor_info(it.out, it.shape, np.dtype(np.float32), it.nbytes,
                               raw_dtype=_gtype(it.gtype))
    return skipped, n_vocab, name_note, file_type


def layout_bytes(model, plan) -> dict:
    """The size of the GGUF file `export_gguf` would write for `plan`, without quantizing
    anything: the header (key/values, the plan's JSON, tensor infos) written to a scratch
    file, and each tensor's bytes padded to the alignment as the export pads them.
    {"file": total, "header": header bytes padded, "tensors": {source name: padded bytes}}."""
    prep = _prepare(model, plan)
    fd, tmp = tempfile.mkstemp(suffix=".gguf")
    os.close(fd)
    writer = None
    try:
        writer = _fast_writer_class()(tmp, prep.arch)
        _write_head(writer, model, plan, prep)
        writer.write_header_to_file(Path(tmp))
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        fout = writer.fout[0]
        fout.flush()
        align = writer.data_alignment
        head = fout.tell()
        writer.close()
        writer = None
    finally:
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close()
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    head += -head % align
    per: dict[str, int] = {}
    for it in prep.items:
        per[it.name] = per.get(it.name, 0) + it.nbytes + (-it.nbytes % align)
    return {"file": head + sum(per.values()), "header": head, "tensors": per,
            "dropped": list(prep.dropped), "alignment": align}


@register_exporter("gguf", ".gguf",
                   "GGUF for llama.cpp: F32/F16/BF16 and GGML block types (q4_0 ... q6_k, iq4_nl) "
                   "per the plan; metadata copied from a GGUF source")
def export_gguf(model, plan, out_path, strict: bool = False, executor=None):
    import gguf
    from concurrent.futures import ThreadPoolExecutor

    from ..runtimes import summarize
    target = Path(out_path)
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise WorkbenchError("output folder does not exist", path=str(target))
    yield Progress(0, 1, "checking the plan")
    prep = _prepare(model, plan, strict)
    items, dropped, decisions, hf = prep.items, prep.dropped, prep.decisions, prep.hf
    from_gguf, reader, arch, not_runnable = prep.from_gguf, prep.reader, prep.arch, \
        prep.not_runnable
    summary = summarize(d for n, d in decisions.items() if n not in dropped)
    reader_tensors = {t.name: t for t in reader.tensors} if reader is not None else {}

    fd, tmp = make_temp(target)
    os.close(fd)
    writer = None
    try:
        writer = _fast_writer_class()(tmp, arch)
        skipped, n_vocab, name_note, file_type = _write_head(writer, model, plan, prep)
        writer.write_header_to_file(Path(tmp))
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        # tensor data: written here straight from the arrays (each tensor padded to the
        # alignment, as GGUFWriter.write_tensor_data does), part by part, no joined copy
        fout = writer.fout[0]
        fout.flush()
        fd, pos, align = fout.fileno(), fout.tell(), writer.data_alignment
        total = sum(max(int(np.prod(it.shape)), 1) for it in items) or 1
        done = 0
        types: dict[str, int] = {}
        # tasks in file order: a row chunk of a re-encoded tensor, or a whole tensor. Workers
        # run them in parallel (the kernels release the GIL); this thread writes the results
        # in order. At most `window` tasks are queued or held, so memory stays bounded.
        tasks = ((i, task, k == 0, k == len(chunks) - 1) for i, it in enumerate(items)
                 for chunks in [_row_chunks(model, it) or [None]]
                 for k, task in enumerate(chunks))
        from ..cluster import is_plain
        if executor is not None and is_plain(model):
            workers = executor.workers()
            pool_cm = _ClusterPool(executor, model)
        else:
            workers = _workers()
            pool_cm = ThreadPoolExecutor(max_workers=workers, initializer=_one_kernel_thread)
        window = 2 * workers + 2
        with pool_cm as pool:
            pending: deque = deque()

            def submit() -> None:
                task = next(tasks, None)
                if task is None:
                    return
                i, what, first, last = task
                if what is None:
                    fut = pool.submit(_tensor_data, model, items[i], reader_tensors, hf)
                elif what[0] == "part":
                    fut = pool.submit(_part_data, model, items[i], what[1])
                elif what[0] == "extra":
                    fut = pool.submit(lambda a: [a], what[1])
                elif what[0] == "kept":
                    fut = pool.submit(_kept_data, model, items[i], what[1], what[2])
                else:
                    fut = pool.submit(_chunk_data, model, items[i], what[1], what[2])
                pending.append((i, first, last, fut))

            for _ in range(window):
                submit()
            written = 0
            while pending:
                i, first, last, fut = pending.popleft()
                it = items[i]
                if first:
                    yield Progress(done, total,
                                   f"writing {i + 1}/{len(items)} {it.out} ({it.gtype})")
                    pos += _write_all(fd, b"\0" * (-pos % align))
                    written = 0
                parts = fut.result()
                submit()
                n = sum(p.nbytes for p in parts)
                if written + n > it.nbytes or (last and written + n != it.nbytes):
                    raise WorkbenchError(f"internal error: {written + n} bytes for a {it.gtype} "
                                         f"tensor of {it.nbytes}", tensor=it.name)
                for p in parts:
                    pos += _write_all(fd, p)
                written += n
                del parts
                if last:
                    pos += _write_all(fd, b"\0" * (-written % align))
                    types[it.gtype] = types.get(it.gtype, 0) + 1
                    done += max(int(np.prod(it.shape)), 1)
        os.fsync(fd)
        writer.close()
        writer = None
        os.chmod(tmp, default_file_mode())
        os.replace(tmp, target)
    except BaseException as exc:
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close()
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise WorkbenchError(f"write failed ({exc.strerror or exc}); existing file left "
                                 "unchanged", path=str(target)) from exc
        raise
    yield Progress(total, total, "done")
    try:
        ftype_name = gguf.LlamaFileType(file_type).name
    except ValueError:
        ftype_name = str(file_type)
    out = {"path": str(target), "format": "gguf", "tensors": len(items),
           "bytes": target.stat().st_size, "file_type": ftype_name,
           "quantization_version": QUANTIZATION_VERSION, "types": types,
           "architecture": arch, "skipped_keys": skipped,
           "runnable_by_llama_cpp": from_gguf or hf is not None,
           "dropped_by_converter": dropped,
           "fallbacks": summary.to_dict(),
           "notes": {d.name: d.note for d in decisions.values()
                     if d.note and d.kind in ("fallback", "skipped") and d.name not in dropped}}
    if n_vocab is not None:
        out["vocab_size"] = n_vocab
    if not_runnable:
        out["not_runnable"] = not_runnable
    if name_note:
        out["notes"]["general.name"] = name_note
    return out

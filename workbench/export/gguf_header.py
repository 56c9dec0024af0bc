"""The head of a GGUF export, before its tensor data: the key/values (copied from a GGUF
source, or a Hugging Face folder's hyper-parameters and tokenizer; the plan's JSON,
general.file_type, general.quantization_version) and the tensor infos, written with the `gguf`
package's GGUFWriter (a subclass that packs long metadata arrays in one go). A tokenizer's
key/values are recorded once and replayed: a file budget writes the head of every plan it tries.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from workbench.export.gguf_items import _gtype, _Item, _Prepared


PLAN_KEY = "quant_workbench.plan"
QUANTIZATION_VERSION = 2

# metadata keys never copied from a GGUF source (rewritten here or meaningless in one file)
SKIP_KEYS = {"general.architecture", "general.file_type", "general.quantization_version",
             "general.alignment", "split.no", "split.count", "split.tensors.count",
             PLAN_KEY, "quant_workbench.source_format"}
# GGML type -> llama_ftype name (llama-quantize's aliases: Q3_K = Q3_K_M, Q4_K = Q4_K_M, ...)
FTYPE_OF = {"F32": "ALL_F32", "F16": "MOSTLY_F16", "BF16": "MOSTLY_BF16", "Q4_0": "MOSTLY_Q4_0",
            "Q4_1": "MOSTLY_Q4_1", "Q5_0": "MOSTLY_Q5_0", "Q5_1": "MOSTLY_Q5_1",
            "Q8_0": "MOSTLY_Q8_0", "Q2_K": "MOSTLY_Q2_K", "Q3_K": "MOSTLY_Q3_K_M",
            "Q4_K": "MOSTLY_Q4_K_M", "Q5_K": "MOSTLY_Q5_K_M", "Q6_K": "MOSTLY_Q6_K",
            "IQ4_NL": "MOSTLY_IQ4_NL", "MXFP4": "MOSTLY_MXFP4_MOE",
            "NVFP4": "MOSTLY_NVFP4"}


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
            if vtype == VT.ARRAY and sub_type is None and len(val) > 16:
                sub_type = _array_type(val)     # the type the package would infer, or None
            if (vtype == VT.ARRAY and sub_type is not None and len(val) > 16
                    and self.endianess == gguf.GGUFEndian.LITTLE
                    and (sub_type == VT.STRING or (sub_type in fmts and sub_type != VT.BOOL))):
                head = (struct.pack("<I", int(VT.ARRAY)) if add_vtype else b"") + struct.pack(
                    "<IQ", int(sub_type), len(val))
                return self._pack_array(val, sub_type, head)
            return super()._pack_val(val, vtype, add_vtype, sub_type=sub_type)

        def _pack_array(self, val, sub_type, head):
            if isinstance(val, tuple):      # a replayed tokenizer array: packed once
                hit = _PACKED.get(id(val))
                if hit is not None and hit[0] is val and hit[1] == sub_type:
                    return head + hit[2]
                body = self._pack_array(list(val), sub_type, b"")
                _PACKED[id(val)] = (val, sub_type, body)
                return head + body
            if sub_type == VT.STRING:
                items = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in val]
                lens = np.fromiter((len(b) for b in items), np.uint64, len(items))
                parts = [None] * (2 * len(items))
                parts[0::2] = [x.tobytes() for x in lens.astype("<u8")]
                parts[1::2] = items
                return head + b"".join(parts)
            return head + np.asarray(val).astype("<" + fmts[sub_type]).tobytes()

    def _array_type(val):
        """The item type gguf's writer infers for a metadata array given without one (the
        tokenizer's vocabulary, scores and token types), where every item has it and packs the
        same in one go (an int subclass such as gguf.TokenType packs as its int, as the
        package's own INT32 does); None leaves the array to the package."""
        if isinstance(val, (bytes, bytearray, str)) or not isinstance(val, (list, tuple)):
            return None
        if all(isinstance(v, str) for v in val):
            return VT.STRING
        if all(type(v) is float for v in val):
            a = np.asarray(val, np.float64)
            return VT.FLOAT32 if np.all(np.abs(a[np.isfinite(a)]) <= FLOAT32_MAX) else None
        if all(isinstance(v, int) and not isinstance(v, bool) for v in val):   # TokenType too
            try:
                a = np.asarray(val, np.int64)
            except OverflowError:
                return None
            return VT.INT32 if a.min() >= -(1 << 31) and a.max() < (1 << 31) else None
        return None

    return FastKVWriter


FLOAT32_MAX = float(np.finfo(np.float32).max)


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
            # lists become tuples: the same immutable objects on every replay, so the writer
            # packs each once (_PACKED)
            args = tuple(tuple(a) if isinstance(a, list) else a for a in args)
            self.calls.append((name, args, kwargs))
            return attr(*args, **kwargs)
        return call


#: {(folder, its sidecar files' signatures): (vocabulary size, tokens, recorded calls)}
_TOKENIZER_KV: dict = {}
#: {id(tuple): (the tuple, item type, its packed items)}: the recorded calls' arrays, packed
#: once (the tuple is held here, so its id is not reused while the entry lives)
_PACKED: dict = {}


def _write_tokenizer_once(writer, hf) -> int:
    """`write_tokenizer`, its key/values recorded once per tokenizer and replayed after: a file
    budget writes the header of every plan it tries (`layout_bytes`), and a 49k-262k token
    vocabulary took a second or more each time. The key is the folder and the size and
    mtime of every file in it but the weights, so an edited tokenizer is read again."""
    from workbench.export.gguf_tokenizer import write_tokenizer
    from workbench.quant.stats import file_signature
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
        _PACKED.clear()
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


def _write_head(writer, model, plan, prep: _Prepared):
    """Key/values and tensor infos of the export (not yet written to the file):
    (skipped keys, vocabulary size, a note on general.name, file type)."""
    from workbench.export.gguf_hparams import write_hparams
    from workbench.export.gguf_tokenizer import name_breaks_loading
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

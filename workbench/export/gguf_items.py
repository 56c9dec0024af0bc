"""What a GGUF export writes, decided before anything is written: each tensor's output name,
shape, GGUF type and byte count (`_Item`), from the plan's decisions and, for a Hugging Face
folder, llama.cpp's layout (workbench.export.gguf_target); and the export's source and
architecture (`_prepare`). A tensor that cannot be written is refused here, by name.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.quant.plan import KEEP
from workbench.schemes import get_scheme


ARCH_FOR_NON_GGUF = "quant_workbench"

FLOAT_SCHEMES = {"fp32": "F32", "fp16": "F16", "bf16": "BF16"}

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


@dataclass
class _Item:
    name: str         # the source's name
    out: str          # the name written
    shape: tuple      # the shape written
    gtype: str        # GGUF type name written
    nbytes: int
    how: str          # "copy" | "keep" | "scheme"
    scheme: str       # scheme name ("keep" for copies)
    transform: bool = False   # llama.cpp layout differs from the source's (gguf_transform.transform)
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
    from workbench.export.gguf_transform import needs_transform
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
    from workbench.quant.runtimes import decide
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
    from workbench.quant.runtimes import get_runtime
    from workbench.schemes.ggml import GGMLScheme
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
    from workbench.quant.runtimes import check_strict, plan_decisions
    from workbench.export.gguf_target import extra_tensors, hf_target, refuses
    from_gguf = model.format == "gguf" and model.source is not None
    if from_gguf:      # the key/values copied must describe the tensors
        from workbench.formats.config_check import check_gguf_metadata
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

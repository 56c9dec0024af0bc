"""Compare two quantizations of one model: `quant-workbench diff A B [--source FLOAT]`.

A and B are each a plan (JSON; needs the float source to resolve and measure) or a quantized
file: a GGUF (llama-quantize's Q4_K_M, or the workbench's own export), a quantized safetensors
file of the workbench, a compressed-tensors folder, or any float checkpoint. Per tensor: the
type each one stores it as, its bits per weight and, with the float source, its relative RMS
error against the source (‖w − ŵ‖ / ‖w‖). Totals per side. With a runnable source, the
model-level figures of both (`workbench.running.runner_jobs.check`, the figures of `quant-workbench check`).

Names are matched across naming schemes: a GGUF's ``blk.N.*`` against the Hugging Face names
of its source through llama.cpp's own name map (:func:`workbench.formats.llama_names.gguf_names`); the
layouts llama.cpp's converter changes (Llama q/k rope permutation, GPT-2's transposed Conv1D)
are mapped back before errors are measured. Tensors are read one at a time.

JSON (``--json``)::

    {"a": {"path", "kind"}, "b": {...}, "source": path | null,
     "tensors": [{"name", "a": {"type", "bits_per_weight", "rel_rmse", "name", "bytes",
                                "params"} | null, "b": {...} | null, "same_type": bool}, ...],
     "totals": {"a": {"tensors", "params", "bytes", "bits_per_weight", "rel_rmse", "sqnr_db",
                      "measured"}, "b": {...}, "a_matched": {...}, "b_matched": {...},
                "matched", "only_a", "only_b", "same_type", "different_type"},
     "check": {"a": {...}, "b": {...}} | null}

``a_matched`` / ``b_matched``: the same totals over only the tensors both hold.
``name`` is the source's tensor name when there is a source (else A's, else B's); a side's
``name`` is the tensor's name in that file; ``rel_rmse`` is null without a source; a side is
null when that file has no such tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.core.progress import Progress


@dataclass
class Side:
    path: str
    kind: str                    # plan | gguf | quantized-safetensors | compressed-tensors | ...
    model: object = None         # the opened file (None for a plan)
    plan: object = None
    names: dict = field(default_factory=dict)   # key -> this side's tensor name

    def to_dict(self) -> dict:
        return {"path": self.path, "kind": self.kind}


def _is_plan(path: Path) -> bool:
    if not path.is_file() or not path.name.lower().endswith(".json"):
        return False
    if path.name.lower().endswith(".index.json"):
        return False
    return True


def open_side(path) -> Side:
    """A plan or a quantized / float file (errors name the file); a Plan object is taken as
    it is."""
    from workbench.quant.plan import Plan
    if isinstance(path, Plan):
        return Side("(plan)", "plan", plan=path)
    p = Path(path).expanduser()
    if not p.exists():
        raise WorkbenchError("file not found", path=str(p))
    if _is_plan(p):
        from workbench.quant.plan import Plan
        return Side(str(p), "plan", plan=Plan.load(p))
    from workbench.formats.loaders.compressed_tensors_format import is_compressed_tensors, open_compressed_tensors
    if is_compressed_tensors(p) and (p.is_dir() or p.suffix == ".safetensors"):
        m = open_compressed_tensors(p)
    else:
        from workbench.formats.loaders import open_model
        m = open_model(p)
    return Side(str(p), m.format, model=m)


def _gguf_map(model) -> dict[str, str]:
    """own name -> llama.cpp name (identity for a GGUF; dropped/unknown names left out)."""
    from workbench.formats.llama_names import gguf_names
    return {k: v for k, v in gguf_names(model).items() if v}


def _match(ref_model, ref_names: list[str], other) -> dict[str, str]:
    """ref name -> other's name, matched by name or, across naming schemes, by llama.cpp name."""
    own = set(other.tensors)
    direct = {n: n for n in ref_names if n in own}
    ref_gguf = ref_model.format == "gguf"
    other_gguf = other.format == "gguf"
    if ref_gguf == other_gguf or len(direct) == len(ref_names):
        return direct
    ref_map = _gguf_map(ref_model)
    other_map = _gguf_map(other)
    inv = {}
    for n, g in other_map.items():
        inv.setdefault(g, n)
    out = dict(direct)
    for n in ref_names:
        if n not in out and n in ref_map and ref_map[n] in inv:
            out[n] = inv[ref_map[n]]
    return out


def _layout(model):
    """The HFTarget-like object to undo llama.cpp's layout changes, for an HF model; None for a
    GGUF or a model of no known architecture."""
    from workbench.formats.llama_names import detect_arch, read_config, gguf_names, model_folder
    if model.format == "gguf":
        return None
    try:
        config = read_config(model) or {}
        arch = detect_arch(model, config)
    except WorkbenchError:
        return None
    if arch is None or arch.gguf_arch == "UNSUPPORTED":
        return None
    from workbench.export.gguf_arch import HFTarget
    return HFTarget(arch, config, model_folder(model), gguf_names(model, arch))


def _to_source_layout(w: np.ndarray, src_info, target, hf_name: str) -> np.ndarray:
    """A GGUF tensor's float values in the Hugging Face source's layout (shape src_info.shape)."""
    from workbench.export.gguf_transform import needs_transform, transform
    if target is not None and needs_transform(target, hf_name):
        shape = src_info.shape
        if target.arch.gguf_arch == "GPT2" and len(shape) == 2:
            return np.ascontiguousarray(w.reshape(shape[1], shape[0]).T)
        # rope permutation of q/k rows: the inverse, from the permutation of row indices
        rows = shape[0]
        idx = np.arange(rows, dtype=np.float64).reshape(rows, *([1] * (len(shape) - 1)))
        perm = transform(target, hf_name, idx)
        if perm is not None:
            order = perm.reshape(rows).astype(np.int64)    # gguf row r holds hf row order[r]
            flat = w.reshape(rows, -1)
            out = np.empty_like(flat)
            out[order] = flat
            return out.reshape(shape)
    return w.reshape(src_info.shape)


def _rel_rmse(w: np.ndarray, wq: np.ndarray) -> tuple[float, float, float]:
    """(rel_rmse, sse, sig) of wq against w, in float64."""
    a = np.asarray(w, np.float64).reshape(-1)
    b = np.asarray(wq, np.float64).reshape(-1)
    a = np.where(np.isfinite(a), a, 0.0)
    d = a - b
    sse = float(d @ d)
    sig = float(a @ a)
    if sse == 0:
        return 0.0, 0.0, sig
    return (math.sqrt(sse / sig) if sig > 0 else math.inf), sse, sig


def _file_entry(side: Side, own: str, src, key: str, target) -> tuple[dict, float, float]:
    info = side.model.info(own)
    d = {"name": own, "type": info.display_dtype, "bits_per_weight": info.bits_per_weight,
         "bytes": info.nbytes, "params": info.numel, "rel_rmse": None}
    sse = sig = math.nan
    if src is not None and key in src.tensors:
        sinfo = src.info(key)
        if sinfo.numel != info.numel:
            raise WorkbenchError(f"has {info.numel} values but the source's {key} has "
                                 f"{sinfo.numel}: not a quantization of this source",
                                 path=side.path, tensor=own)
        if sinfo.is_float and info.is_float:
            w = src.read(key)
            wq = side.model.read_matrix(own)
            if side.model.format == "gguf" and src.format != "gguf":
                wq = _to_source_layout(wq, sinfo, target, key)
            d["rel_rmse"], sse, sig = _rel_rmse(w, wq)
    return d, sse, sig


def _plan_entry(side: Side, src, key: str, decision) -> tuple[dict, float, float]:
    from workbench.quant.evaluate import evaluate_tensor
    from workbench.quant.plan import KEEP
    r = evaluate_tensor(src, key, decision.requested, decision=decision)
    info = src.info(key)
    typ = info.display_dtype if r.scheme == KEEP else r.scheme
    d = {"name": key, "type": typ, "bits_per_weight": r.bits_per_weight, "bytes": r.bytes,
         "params": r.params, "rel_rmse": r.error.rel_rmse if info.is_float else None}
    return d, r.error.sse, r.error.sig


_ALIASES = {"keep": None, "fp32": "f32", "fp16": "f16", "bf16": "bf16", "f32": "f32",
            "f16": "f16"}


def same_type(a: str | None, b: str | None) -> bool:
    """Whether two type names mean the same storage: GGML names and workbench scheme names
    compare case-insensitively (Q4_K = q4_k, F16 = fp16)."""
    if a is None or b is None:
        return False
    na, nb = a.lower(), b.lower()
    return _ALIASES.get(na, na) == _ALIASES.get(nb, nb)


def _totals(entries: list[dict | None], errs: list[tuple[float, float]]) -> dict:
    ents = [e for e in entries if e is not None]
    params = sum(e["params"] for e in ents)
    nbytes = sum(e["bytes"] for e in ents)
    pairs = [(sse, sig) for sse, sig in errs if not (math.isnan(sse) or math.isnan(sig))]
    out = {"tensors": len(ents), "params": params, "bytes": nbytes,
           "bits_per_weight": 8.0 * nbytes / params if params else 0.0,
           "rel_rmse": None, "sqnr_db": None, "measured": len(pairs)}
    if pairs:
        sse = sum(p[0] for p in pairs)
        sig = sum(p[1] for p in pairs)
        from workbench.quant.metrics import sqnr_db
        out["rel_rmse"] = math.sqrt(sse / sig) if sig > 0 else (0.0 if sse == 0 else math.inf)
        out["sqnr_db"] = sqnr_db(sig, sse)
    return out


def diff(a_path: str, b_path: str, source_path: str | None = None, check: bool = True,
         calib=None, samples: int | None = None):
    """Job: the comparison of A and B (see the module doc for the result's keys)."""
    a, b = open_side(a_path), open_side(b_path)
    src = None
    if source_path is not None and not isinstance(source_path, (str, Path)):
        src = source_path       # an opened Model
    elif source_path is not None:
        from workbench.formats.loaders import open_model
        src = open_model(source_path)
    for side in (a, b):
        if side.kind == "plan" and src is None:
            raise WorkbenchError("a plan needs the float model it applies to: add source=FLOAT",
                                 path=side.path, params=("source",))
    ref = src if src is not None else (a.model if a.model is not None else b.model)
    keys = list(ref.tensors)
    decisions = {}
    for side in (a, b):
        if side.kind == "plan":
            from workbench.quant.runtimes import plan_decisions
            side.names = {k: k for k in keys}
            decisions[id(side)] = plan_decisions(src, side.plan, "any")
        elif side.model is ref:
            side.names = {k: k for k in keys}
        else:
            side.names = _match(ref, keys, side.model)
    target = _layout(src) if src is not None else None
    rows, errs_a, errs_b = [], {}, {}
    total = len(keys) or 1
    for i, key in enumerate(keys):
        yield Progress(i, total, f"comparing {key}")
        row = {"name": key}
        for tag, side, errs in (("a", a, errs_a), ("b", b, errs_b)):
            own = side.names.get(key)
            if own is None:
                row[tag] = None
                continue
            if side.kind == "plan":
                d, sse, sig = _plan_entry(side, src, key, decisions[id(side)][key])
            else:
                d, sse, sig = _file_entry(side, own, src, key, target)
            row[tag] = d
            errs[key] = (sse, sig)
        row["same_type"] = bool(row["a"] and row["b"]
                                and same_type(row["a"]["type"], row["b"]["type"]))
        rows.append(row)
    # tensors of A or B that no source / reference tensor matched
    for tag, side in (("a", a), ("b", b)):
        if side.model is None or side.model is ref:
            continue
        seen = set(side.names.values())
        for own in side.model.tensors:
            if own not in seen:
                d, _, _ = _file_entry(side, own, None, own, None)
                rows.append({"name": own, "a": d if tag == "a" else None,
                             "b": d if tag == "b" else None, "same_type": False})
    yield Progress(total, total, "totals")
    ta = _totals([r["a"] for r in rows], list(errs_a.values()))
    tb = _totals([r["b"] for r in rows], list(errs_b.values()))
    both = [r for r in rows if r["a"] is not None and r["b"] is not None]
    # the same over the tensors both hold (sizes compare like for like)
    ma = _totals([r["a"] for r in both], [errs_a[r["name"]] for r in both if r["name"] in errs_a])
    mb = _totals([r["b"] for r in both], [errs_b[r["name"]] for r in both if r["name"] in errs_b])
    totals = {"a": ta, "b": tb, "a_matched": ma, "b_matched": mb, "matched": len(both),
              "only_a": sum(1 for r in rows if r["a"] is not None and r["b"] is None),
              "only_b": sum(1 for r in rows if r["b"] is not None and r["a"] is None),
              "same_type": sum(1 for r in both if r["same_type"]),
              "different_type": sum(1 for r in both if not r["same_type"])}
    result = {"a": a.to_dict(), "b": b.to_dict(), "source": str(src.path) if src else None,
              "tensors": rows, "totals": totals, "check": None}
    if src is not None and check:
        result["check"] = yield from _check_both(src, a, b, target, calib, samples)
    for side in (a, b):
        if side.model is not None:
            side.model.close()
    return result


def runnable(src) -> str | None:
    """None when the source can run (transformers and a config), else why not."""
    from workbench.running.runner_config import read_config
    try:
        read_config(src)
    except WorkbenchError as exc:
        return str(exc).split(": ")[-1]
    try:
        import transformers  # noqa: F401
    except ImportError:
        return "transformers is not installed"
    return None


def _side_weights(side: Side, src, target) -> dict[str, np.ndarray]:
    out = {}
    for key, own in side.names.items():
        if key not in src.tensors or own not in side.model.tensors:
            continue
        sinfo = src.info(key)
        info = side.model.info(own)
        if not (sinfo.is_float and info.is_float) or info.numel != sinfo.numel:
            continue
        if info.display_dtype == sinfo.display_dtype and side.model.format != "gguf":
            continue    # stored as the source stores it
        w = side.model.read_matrix(own)
        if side.model.format == "gguf" and src.format != "gguf":
            w = _to_source_layout(w, sinfo, target, key)
        out[key] = np.asarray(w, np.float32).reshape(sinfo.shape)
    return out


def _check_both(src, a: Side, b: Side, target, calib, samples):
    """{"a": figures, "b": figures} of `check`, or {"skipped": why}."""
    why = runnable(src)
    if why is not None:
        return {"skipped": why}
    from workbench.quant.plan import Plan
    from workbench.core.progress import prefixed, subjob
    from workbench.running.runner_jobs import check
    out = {}
    for tag, side in (("a", a), ("b", b)):
        if side.kind == "plan":
            job = check(src, side.plan, calib, samples)
        else:
            job = check(src, Plan(), calib, samples, weights=_side_weights(side, src, target))
        try:
            out[tag] = yield from prefixed(subjob(job, 0, 1, 1), f"check {tag.upper()}: ")
        except WorkbenchError as exc:
            return {"skipped": str(exc)}
        except ImportError as exc:
            return {"skipped": f"not runnable ({exc})"}
    return out

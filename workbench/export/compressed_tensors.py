"""Export for vLLM: a Hugging Face folder in the compressed-tensors format.

``quant-workbench export MODEL --plan P --format compressed-tensors -o OUT_DIR`` writes
``OUT_DIR/config.json`` (the source's config with a ``quantization_config``), ``model.safetensors``
and the source folder's tokenizer files.

Which tensors and schemes (``workbench.quant.runtimes`` "vllm"): the weights of linear layers
(attention and MLP projections) under int4 / int8, per channel or group-wise, symmetric or
asymmetric, and fp8-e4m3 (per channel). Anything else is stored unchanged in the source dtype, with
a note per tensor saying why; ``--strict`` makes that an error.

Per quantized layer ``L`` (the tensor ``L.weight``):

* int (``pack-quantized``): ``L.weight_packed`` int32 [out, in*b/32] (the package's
  ``pack_to_int32``: code q + 2^(b-1), element i at bit i*b of little-endian words),
  ``L.weight_scale`` float32 [out, in/group] (channel: [out, 1]), ``L.weight_shape`` int64 [2],
  and for asymmetric schemes ``L.weight_zero_point`` packed the same way along dim 0.
  The workbench's codes map exactly: symmetric q = code - 2^(b-1); asymmetric
  q = code - 2^(b-1) and zero point z - 2^(b-1), so (q - z) * scale is the workbench's own
  dequantized value, bit for bit.
* fp8-e4m3 (``float-quantized``): ``L.weight`` float8_e4m3fn [out, in] and ``L.weight_scale``
  float32 [out, 1] (strategy ``channel``).
* fp8-e4m3-b128 (``float-quantized``, strategy ``block``, block_structure [128, 128], the
  package's FP8_BLOCK preset): ``L.weight`` float8_e4m3fn [out, in], ``L.weight_scale`` float32
  [ceil(out/128), ceil(in/128)].
* nvfp4-g16 (``nvfp4-pack-quantized``, strategy ``tensor_group``, group 16, the NVFP4A16
  preset): ``L.weight_packed`` uint8 [out, in/2] (two E2M1 codes per byte, weight 2k low),
  ``L.weight_scale`` float8_e4m3fn [out, in/16], ``L.weight_global_scale`` float32 [1]
  (w = e2m1 * scale / global_scale).
* mxfp4-g32 (``mxfp4-pack-quantized``, strategy ``group``, group 32, scale dtype uint8, the
  MXFP4A16 preset): ``L.weight_packed`` as NVFP4, ``L.weight_scale`` uint8 E8M0 [out, in/32]
  (w = e2m1 * 2^(e-127)).
The arrays are the workbench schemes' own (workbench/schemes/microscaling.py), written as they are.

Scales are float32 holding the workbench's scale values exactly (group scales are float16
values). vLLM casts scales to the model's activation dtype when it loads them; with a bfloat16
model that rounds the scales, so vLLM's weights can differ from these in the last bits.
"""

from __future__ import annotations

from workbench.core.optional import require

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.quant.plan import KEEP
from workbench.core.progress import Progress
from workbench.schemes import get_scheme
from workbench.quant import streaming
from workbench.export import register_exporter

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.txt", "vocab.json", "merges.txt", "tokenizer.model",
                   "generation_config.json")
FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"),
         ("query", "key", "value"), ("w1", "w3"), ("q_a_proj", "kv_a_proj_with_mqa"))
# one expert's projection: vLLM's FusedMoE holds a layer's experts (all projections) in one
# quantized layer with one scheme
EXPERT = re.compile(r"^(?P<layer>.*\.(?:mlp|block_sparse_moe))\.experts\.\d+\."
                    r"(?:gate_proj|up_proj|down_proj|w1|w2|w3)\.weight$")


def _args_for(scheme):
    """compressed-tensors QuantizationArgs for a workbench scheme (vLLM-expressible ones)."""
    import torch
    QuantizationArgs = require("compressed_tensors.quantization", "vllm").QuantizationArgs
    from workbench.schemes.granularity import PerGroup
    if scheme.name == "fp8-e4m3":
        return QuantizationArgs(num_bits=8, type="float", symmetric=True, strategy="channel",
                                scale_dtype=torch.float32), "float-quantized"
    if scheme.name == "fp8-e4m3-b128":
        return QuantizationArgs(num_bits=8, type="float", symmetric=True, strategy="block",
                                block_structure=[128, 128], dynamic=False,
                                scale_dtype=torch.float32), "float-quantized"
    if scheme.name == "nvfp4-g16":
        return QuantizationArgs(num_bits=4, type="float", symmetric=True, dynamic=False,
                                strategy="tensor_group", group_size=16,
                                scale_dtype=torch.float8_e4m3fn,
                                zp_dtype=torch.float8_e4m3fn), "nvfp4-pack-quantized"
    if scheme.name == "mxfp4-g32":
        return QuantizationArgs(num_bits=4, type="float", symmetric=True, dynamic=False,
                                strategy="group", group_size=32, scale_dtype=torch.uint8,
                                zp_dtype=torch.uint8), "mxfp4-pack-quantized"
    group = scheme.gran.size if isinstance(scheme.gran, PerGroup) else None
    return QuantizationArgs(num_bits=scheme.bits, type="int", symmetric=not scheme.asym,
                            strategy="group" if group else "channel", group_size=group,
                            scale_dtype=torch.float32, zp_dtype=torch.int8 if scheme.asym
                            else None), "pack-quantized"


def _layer_tensors(scheme, qt, shape) -> dict:
    """The compressed-tensors arrays of one layer (numpy / torch), exactly the workbench's."""
    import torch
    pack_to_int32 = require("compressed_tensors.compressors.pack_quantized.helpers",
                            "vllm").pack_to_int32
    from workbench.schemes.packing import unpack_bits
    rows, cols = shape
    if scheme.name in ("nvfp4-g16", "mxfp4-g32"):
        out = {"weight_packed": torch.from_numpy(
                   np.ascontiguousarray(qt.arrays["packed"]).reshape(rows, cols // 2).copy())}
        sc = torch.from_numpy(np.ascontiguousarray(qt.arrays["scales"]).reshape(
            rows, cols // scheme.group).copy())
        out["weight_scale"] = sc.view(torch.float8_e4m3fn) if scheme.name == "nvfp4-g16" else sc
        if scheme.name == "nvfp4-g16":
            out["weight_global_scale"] = torch.from_numpy(
                np.asarray(qt.arrays["global_scale"], np.float32).reshape(1).copy())
        return out
    if scheme.name == "fp8-e4m3-b128":
        codes = np.ascontiguousarray(qt.arrays["codes"]).reshape(rows, cols)
        return {"weight": torch.from_numpy(codes.copy()).view(torch.float8_e4m3fn),
                "weight_scale": torch.from_numpy(np.asarray(qt.arrays["scales"], np.float32).copy())}
    if scheme.name == "fp8-e4m3":
        # the workbench's FP8 codes are E4M3FN bit patterns: the same bytes, viewed
        codes = np.ascontiguousarray(qt.arrays["codes"]).reshape(rows, cols)
        return {"weight": torch.from_numpy(codes.copy()).view(torch.float8_e4m3fn),
                "weight_scale": torch.from_numpy(
                    qt.arrays["scales"].astype(np.float32).reshape(rows, 1).copy())}
    b = scheme.bits
    codes = unpack_bits(qt.arrays["codes"], b, rows * cols).reshape(rows, cols).astype(np.int16)
    half = 1 << (b - 1)
    q = torch.from_numpy((codes - half).astype(np.int8))
    nb = qt.arrays["scales"].size // rows if rows else 0   # a zero-row weight: no groups
    out = {"weight_packed": pack_to_int32(q, b),
           "weight_scale": torch.from_numpy(
               qt.arrays["scales"].astype(np.float32).reshape(rows, nb).copy()),
           "weight_shape": torch.tensor([rows, cols], dtype=torch.int64)}
    if scheme.asym:
        zp = torch.from_numpy((qt.arrays["zeros"].astype(np.int16) - half).astype(np.int8)
                              .reshape(rows, nb))
        out["weight_zero_point"] = pack_to_int32(zp, b, packed_dim=0).contiguous()
    return out


def _act_args(entry: dict):
    """compressed-tensors QuantizationArgs of a plan's activation entry (static, per tensor,
    symmetric: workbench.quant.methods.activations.activation_entry)."""
    QuantizationArgs = require("compressed_tensors.quantization", "vllm").QuantizationArgs
    return QuantizationArgs(num_bits=int(entry["num_bits"]), type=entry.get("type", "int"),
                            symmetric=bool(entry.get("symmetric", True)),
                            strategy=entry.get("strategy", "tensor"),
                            dynamic=bool(entry.get("dynamic", False)),
                            observer=None)


def _group_key(scheme_name: str) -> str:
    """What vLLM sees of a scheme: its compressed-tensors args (variants such as ``@mse`` or
    ``@pot`` choose other scales but are stored the same way, so they share a config group)."""
    args, fmt = _args_for(get_scheme(scheme_name))
    return json.dumps([fmt, args.model_dump(mode="json", exclude_none=True)], sort_keys=True)


def _fused_conflicts(decisions: dict) -> list[str]:
    """Layers vLLM fuses (q/k/v, gate/up) that do not all get the same compressed-tensors
    scheme. A sibling stored unquantized counts as a different scheme: vLLM refuses a fused
    layer whose shards are partly ignored, and loads all shards with the first one's scheme."""
    problems, seen = [], set()
    for name in decisions:
        for group in FUSED:
            if f".{group[0]}.weight" not in name:
                continue
            sibs = [name.replace(f".{group[0]}.", f".{g}.") for g in group]
            present = [s for s in sibs if s in decisions]
            if len(present) < 2 or tuple(present) in seen:
                continue
            seen.add(tuple(present))
            keys = {(_group_key(decisions[s].applied) if decisions[s].applied != KEEP
                     else "unquantized") for s in present}
            if len(keys) > 1:
                problems.append(", ".join(f"{s} ({decisions[s].applied})" for s in present))
    problems += _moe_conflicts(decisions)
    return problems


def _moe_conflicts(decisions: dict) -> list[str]:
    """Mixture-of-experts layers whose experts (every projection of every expert) do not all
    get one compressed-tensors scheme: vLLM's FusedMoE quantizes them as one layer."""
    layers: dict[str, dict[str, list[str]]] = {}
    for name, d in decisions.items():
        m = EXPERT.match(name)
        if m is None:
            continue
        key = _group_key(d.applied) if d.applied != KEEP else "unquantized"
        layers.setdefault(m.group("layer"), {}).setdefault(key, []).append(name)
    problems = []
    for layer, by in layers.items():
        if len(by) > 1:
            problems.append(f"the experts of {layer}: " + ", ".join(
                f"{v[0]} ({decisions[v[0]].applied}){f' and {len(v) - 1} more' if len(v) > 1 else ''}"
                for v in by.values()))
    return problems


@register_exporter("compressed-tensors", "", kind="folder", activations=True, description=
                   "a Hugging Face folder for vLLM (compressed-tensors: int4/int8 channel or "
                   "group, symmetric or asymmetric, fp8-e4m3 channel or 128x128 block, "
                   "nvfp4-g16, mxfp4-g32)")
def export_compressed_tensors(model, plan, out_path, strict: bool = False, executor=None):
    _ctq = require("compressed_tensors.quantization", "vllm")
    QuantizationConfig, QuantizationScheme = _ctq.QuantizationConfig, _ctq.QuantizationScheme

    from workbench.export.st_writer import StreamingSafetensorsWriter

    from workbench.quant.evaluate import quantize
    from workbench.formats.llama_names import model_folder, read_config
    from workbench.quant.runtimes import check_strict, plan_decisions, summarize
    out_dir = Path(out_path)      # checked by the export door (workbench.core.outputs)
    src = model_folder(model)
    yield Progress(0, 1, "checking the plan")
    from workbench.formats.config_check import check_config, config_path
    if (cfg := read_config(model)) is not None:   # against the tensors, before any work
        check_config(model, cfg, config_path(model))
    from workbench.core.limits import check_sidecar
    for f in TOKENIZER_FILES:     # copied as they are: each within its size limit, checked first
        if (src / f).is_file():
            check_sidecar(src / f)
    decisions = plan_decisions(model, plan, "vllm")
    if strict:
        check_strict(decisions.values(), path=model.path)
    applied = {n: d.applied for n, d in decisions.items() if d.applied != KEEP}
    conflicts = _fused_conflicts(decisions)
    if conflicts:
        raise WorkbenchError(
            f"vLLM fuses q/k/v and gate/up (and a mixture-of-experts layer's experts) into one "
            f"layer and needs one scheme for all of its parts (stored unquantized counts as "
            f"another scheme); {len(conflicts)} fused "
            f"group(s) differ: " + "; ".join(conflicts[:3])
            + (" ..." if len(conflicts) > 3 else ""), path=model.path)
    config = dict(read_config(model) or _minimal_config(model))
    groups: dict[str, list[str]] = {}       # one config group per compressed-tensors scheme
    group_scheme: dict[str, str] = {}
    acts = getattr(plan, "activations", None) or {}
    group_act: dict[str, dict | None] = {}
    for n, s in applied.items():
        act = acts.get(n)
        key = _group_key(s) + ("" if act is None else "|" + json.dumps(
            _act_args(act).model_dump(mode="json", exclude_none=True), sort_keys=True))
        group_act.setdefault(key, act)
        group_scheme.setdefault(key, s)
        groups.setdefault(key, []).append(n[:-len(".weight")] if n.endswith(".weight") else n)

    from workbench.core.atomic import clean_stale_temps, discard_folder, replace_folder
    clean_stale_temps(out_dir.parent)          # folders left by killed runs
    tmp = out_dir.parent / f".{out_dir.name}.quant-workbench-{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        # streamed: one tensor quantized and written at a time (bounded memory)
        writer = StreamingSafetensorsWriter(tmp / "model.safetensors", {"format": "pt"})
        names = list(model.tensors)
        total = sum(max(model.info(n).numel, 1) for n in names) or 1
        done = 0
        ahead = _cluster_quantized(executor, model, names, decisions)
        try:
            for k, n in enumerate(names, 1):
                info = model.info(n)
                yield Progress(done, total, f"exporting {k}/{len(names)} {n}")
                d = decisions[n]
                if d.applied == KEEP:
                    writer.add(n, *_st_array(_source_tensor(model, n)))
                elif streaming.export_streamed(model, info, d.applied) and not getattr(
                        get_scheme(d.applied), "asym", False):
                    # a big tensor, a block of rows at a time (the same bytes; zero points are
                    # packed across rows, so asymmetric schemes take the whole-tensor path)
                    scheme = get_scheme(d.applied)
                    layer = n[:-len(".weight")]
                    key, blocks, spool = streaming.quantized_row_blocks(
                        model, n, d.applied, lambda qt, r, c, s=scheme: _layer_tensors(s, qt, (r, c)))
                    writer.add_stream(f"{layer}.{key}", (_st_array(t)[0] for t in blocks),
                                      dtype=None if key != "weight" else "F8_E4M3")
                    for k, parts in spool.items():
                        if k == "weight_shape":
                            import torch
                            parts = [torch.tensor(list(info.matrix_shape), dtype=torch.int64)]
                        else:
                            import torch
                            parts = [torch.cat(parts, 0)]
                        writer.add(f"{layer}.{k}", *_st_array(parts[0]))
                    if n in acts:
                        import torch
                        writer.add(f"{layer}.input_scale", *_st_array(torch.tensor(
                            [float(acts[n].get("scale", 1.0))], dtype=torch.float32)))
                else:
                    scheme = get_scheme(d.applied)
                    if ahead is not None:    # quantized on a worker (workbench.jobs.cluster)
                        qt, shape = ahead.take(n)
                        w = None
                    else:
                        w = model.read_matrix(n)
                        qt = model.quantize_tensor(n, w, d.applied) if hasattr(
                            model, "quantize_tensor") else quantize(w, d.applied, tensor=n)
                        shape = w.shape
                    layer = n[:-len(".weight")]
                    for k, v in _layer_tensors(scheme, qt, shape).items():
                        writer.add(f"{layer}.{k}", *_st_array(v))
                    if n in acts:   # a static activation range: the per-tensor input scale
                        import torch
                        writer.add(f"{layer}.input_scale", *_st_array(torch.tensor(
                            [float(acts[n].get("scale", 1.0))], dtype=torch.float32)))
                    del w, qt
                done += max(info.numel, 1)
            yield Progress(total, total, "writing model.safetensors")
            writer.finish()
        except BaseException:
            if ahead is not None:
                ahead.close()
            writer.abort()
            raise
        config_groups, formats = {}, set()
        for i, (key, layers) in enumerate(sorted(groups.items())):
            args, fmt = _args_for(get_scheme(group_scheme[key]))
            formats.add(fmt)
            act = group_act.get(key)
            config_groups[f"group_{i}"] = QuantizationScheme(
                targets=sorted(layers), weights=args, format=fmt,
                input_activations=None if act is None else _act_args(act))
        qcfg = QuantizationConfig(
            config_groups=config_groups, quant_method="compressed-tensors",
            format=(formats.pop() if len(formats) == 1 else "mixed-precision") if formats
            else "dense", quantization_status="compressed",
            ignore=sorted(n[:-len(".weight")] for n, d in decisions.items()
                          if d.applied == KEEP and n.endswith(".weight") and model.info(n).ndim == 2))
        config["quantization_config"] = qcfg.model_dump(exclude_none=True, mode="json")
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        for f in TOKENIZER_FILES:
            if (src / f).is_file():
                shutil.copyfile(src / f, tmp / f)
        replace_folder(tmp, out_dir)
    except BaseException as exc:
        discard_folder(tmp, out_dir, exc)
    summary = summarize(decisions.values())
    return {"path": str(out_dir), "format": "compressed-tensors",
            "quantization_format": config["quantization_config"].get("format"),
            "quantized": len(applied), "tensors": len(names),
            "bytes": sum(f.stat().st_size for f in out_dir.iterdir()),
            "fallbacks": summary.to_dict(),
            "notes": {d.name: d.note for d in decisions.values()
                      if d.note and d.kind in ("fallback", "skipped")
                      or (d.note and "cannot express" in d.note)}}


def _cluster_quantized(executor, model, names, decisions):
    """The whole-tensor quantizations of the export, computed ahead on the cluster's workers
    in the order the loop writes them (workbench.jobs.cluster.Ahead), or None in process."""
    from workbench.jobs.cluster import Ahead, is_plain, quantize_task, signature
    if executor is None or not is_plain(model):
        return None
    sig = signature(model)
    tasks = []
    for n in names:
        d = decisions[n]
        if d.applied == KEEP or (streaming.export_streamed(model, model.info(n), d.applied)
                                 and not getattr(get_scheme(d.applied), "asym", False)):
            continue
        tasks.append((n, (sig, n, d.applied)))
    return Ahead(executor, quantize_task, tasks, 2 * executor.workers() + 2)


def _minimal_config(model) -> dict:
    """config.json for a source without one: the dtype of its weights, nothing invented."""
    from collections import Counter
    names = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
    dtypes = Counter(names.get(model.info(n).dtype) for n in model.tensors
                     if model.info(n).ndim == 2)
    dtypes.pop(None, None)
    cfg = {"_comment": "written by quant-workbench: the source had no config.json"}
    if dtypes:
        cfg["torch_dtype"] = dtypes.most_common(1)[0][0]
    return cfg


_TORCH_ST = {"bfloat16": ("int16", "BF16"), "float8_e4m3fn": ("uint8", "F8_E4M3"),
             "float8_e5m2": ("uint8", "F8_E5M2")}


def _st_array(t):
    """(numpy array, safetensors dtype or None) of a torch tensor, the same bytes."""
    import torch
    t = t.contiguous()
    name = str(t.dtype).replace("torch.", "")
    if name in _TORCH_ST:
        view, st = _TORCH_ST[name]
        return t.view(getattr(torch, view)).numpy(), st
    return t.numpy(), None


def _source_tensor(model, name):
    """A tensor stored unchanged (float types in their own dtype; others as they are)."""
    import torch
    info = model.info(name)
    shape = tuple(info.shape)
    if info.quant:
        return torch.from_numpy(model.read(name).astype(np.float32).reshape(shape).copy())
    if info.dtype == "BF16":
        raw = np.asarray(model.raw(name)).view(np.int16).reshape(shape)
        return torch.from_numpy(raw.copy()).view(torch.bfloat16)
    arr = np.asarray(model.raw(name))
    try:
        return torch.from_numpy(np.ascontiguousarray(arr).reshape(shape).copy())
    except TypeError:
        return torch.from_numpy(model.read(name).astype(np.float32).reshape(shape).copy())

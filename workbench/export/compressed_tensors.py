"""Export for vLLM: a Hugging Face folder in the compressed-tensors format.

``quant-workbench export MODEL --plan P --format compressed-tensors -o OUT_DIR`` writes
``OUT_DIR/config.json`` (the source's config with a ``quantization_config``), ``model.safetensors``
and the source folder's tokenizer files.

Which tensors and schemes (``workbench.runtimes`` "vllm"): the weights of linear layers
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
  float32 [out, 1].

Scales are float32 holding the workbench's scale values exactly (group scales are float16
values). vLLM casts scales to the model's activation dtype when it loads them; with a bfloat16
model that rounds the scales, so vLLM's weights can differ from these in the last bits.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from ..atomic import default_file_mode
from ..errors import WorkbenchError
from ..plan import KEEP
from ..progress import Progress
from ..schemes import get_scheme
from . import register_exporter

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.txt", "vocab.json", "merges.txt", "tokenizer.model",
                   "generation_config.json")
FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"),
         ("query", "key", "value"))


def _args_for(scheme):
    """compressed-tensors QuantizationArgs for a workbench scheme (vLLM-expressible ones)."""
    import torch
    from compressed_tensors.quantization import QuantizationArgs
    from ..schemes.granularity import PerGroup
    if scheme.name == "fp8-e4m3":
        return QuantizationArgs(num_bits=8, type="float", symmetric=True, strategy="channel",
                                scale_dtype=torch.float32), "float-quantized"
    group = scheme.gran.size if isinstance(scheme.gran, PerGroup) else None
    return QuantizationArgs(num_bits=scheme.bits, type="int", symmetric=not scheme.asym,
                            strategy="group" if group else "channel", group_size=group,
                            scale_dtype=torch.float32, zp_dtype=torch.int8 if scheme.asym
                            else None), "pack-quantized"


def _layer_tensors(scheme, qt, shape) -> dict:
    """The compressed-tensors arrays of one layer (numpy / torch), exactly the workbench's."""
    import torch
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    from ..schemes.packing import unpack_bits
    rows, cols = shape
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
    nb = qt.arrays["scales"].size // rows
    out = {"weight_packed": pack_to_int32(q, b),
           "weight_scale": torch.from_numpy(
               qt.arrays["scales"].astype(np.float32).reshape(rows, nb).copy()),
           "weight_shape": torch.tensor([rows, cols], dtype=torch.int64)}
    if scheme.asym:
        zp = torch.from_numpy((qt.arrays["zeros"].astype(np.int16) - half).astype(np.int8)
                              .reshape(rows, nb))
        out["weight_zero_point"] = pack_to_int32(zp, b, packed_dim=0).contiguous()
    return out


def _fused_conflicts(applied: dict[str, str]) -> list[str]:
    """Layers vLLM fuses (q/k/v, gate/up) that the plan gives different schemes."""
    problems = []
    for name in applied:
        for group in FUSED:
            if f".{group[0]}.weight" in name:
                sibs = [name.replace(f".{group[0]}.", f".{g}.") for g in group]
                schemes = {applied.get(s) for s in sibs if s in applied}
                if len(schemes) > 1:
                    problems.append(f"{', '.join(sibs)} get {', '.join(sorted(map(str, schemes)))}")
    return problems


@register_exporter("compressed-tensors", "",
                   "a Hugging Face folder for vLLM (compressed-tensors: int4/int8 channel or "
                   "group, symmetric or asymmetric, fp8-e4m3)")
def export_compressed_tensors(model, plan, out_path, strict: bool = False):
    import torch
    from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme
    from safetensors.torch import save_file

    from ..evaluate import quantize
    from ..llama_names import model_folder, read_config
    from ..runtimes import check_strict, plan_decisions, summarize
    out_dir = Path(out_path)
    if out_dir.exists() and not out_dir.is_dir():
        raise WorkbenchError("output must be a folder (compressed-tensors is a Hugging Face "
                             "folder)", path=str(out_dir))
    if not out_dir.parent.is_dir():
        raise WorkbenchError("parent folder does not exist", path=str(out_dir))
    src = model_folder(model)
    if out_dir.exists() and out_dir.resolve() == src.resolve():
        raise WorkbenchError("output folder is the model's own folder: it would overwrite the "
                             "source", path=str(out_dir))
    if out_dir.is_dir():     # it is replaced as a whole: only ever a previous export of ours
        ours = {"model.safetensors", "config.json", *TOKENIZER_FILES}
        other = sorted(e.name for e in os.scandir(out_dir) if e.name not in ours)
        if other:
            raise WorkbenchError(f"output folder exists and holds other files ({other[0]}"
                                 f"{' ...' if len(other) > 1 else ''}); it would be replaced: "
                                 "choose a new folder; nothing was written", path=str(out_dir))
    yield Progress(0, 1, "checking the plan")
    decisions = plan_decisions(model, plan, "vllm")
    if strict:
        check_strict(decisions.values(), path=model.path)
    applied = {n: d.applied for n, d in decisions.items() if d.applied != KEEP}
    conflicts = _fused_conflicts(applied)
    if conflicts:
        raise WorkbenchError("vLLM fuses these layers and needs one scheme for each group: "
                             + "; ".join(conflicts[:3]), path=model.path)
    config = dict(read_config(model) or {})
    groups: dict[str, list[str]] = {}
    for n, s in applied.items():
        groups.setdefault(s, []).append(n[:-len(".weight")] if n.endswith(".weight") else n)

    from ..atomic import clean_stale_temps
    clean_stale_temps(out_dir.parent)          # folders left by killed runs
    tmp = out_dir.parent / f".{out_dir.name}.quant-workbench-{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        tensors: dict[str, torch.Tensor] = {}
        names = list(model.tensors)
        total = sum(max(model.info(n).numel, 1) for n in names) or 1
        done = 0
        for n in names:
            info = model.info(n)
            yield Progress(done, total, f"exporting {n}")
            d = decisions[n]
            if d.applied == KEEP:
                t = _source_tensor(model, n)
                tensors[n] = t
            else:
                scheme = get_scheme(d.applied)
                w = model.read_matrix(n)
                qt = quantize(w, d.applied, tensor=n)
                layer = n[:-len(".weight")]
                for k, v in _layer_tensors(scheme, qt, w.shape).items():
                    tensors[f"{layer}.{k}"] = v
            done += max(info.numel, 1)
        yield Progress(total, total, "writing model.safetensors")
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "model.safetensors"),
                  metadata={"format": "pt"})
        config_groups, formats = {}, set()
        for i, (s, layers) in enumerate(sorted(groups.items())):
            args, fmt = _args_for(get_scheme(s))
            formats.add(fmt)
            config_groups[f"group_{i}"] = QuantizationScheme(targets=sorted(layers), weights=args,
                                                             format=fmt)
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
        for f in tmp.iterdir():
            os.chmod(f, default_file_mode())
        if out_dir.exists():
            old = out_dir.parent / f".{out_dir.name}.quant-workbench-{os.getpid()}.old"
            os.replace(out_dir, old)
            os.replace(tmp, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out_dir)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise WorkbenchError(f"write failed ({exc.strerror or exc}); nothing written",
                                 path=str(out_dir)) from exc
        raise
    summary = summarize(decisions.values())
    return {"path": str(out_dir), "format": "compressed-tensors",
            "quantization_format": config["quantization_config"].get("format"),
            "quantized": len(applied), "tensors": len(names),
            "bytes": sum(f.stat().st_size for f in out_dir.iterdir()),
            "fallbacks": summary.to_dict(),
            "notes": {d.name: d.note for d in decisions.values()
                      if d.note and d.kind in ("fallback", "skipped")
                      or (d.note and "cannot express" in d.note)}}


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

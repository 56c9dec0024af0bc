"""Export for Apple MLX: an mlx-lm folder that ``mlx_lm.load`` runs.

``quant-workbench export MODEL --plan P --format mlx -o OUT_DIR`` writes ``OUT_DIR/config.json``
(the source's config with mlx-lm's ``"quantization"`` object: a default and one entry per module
whose scheme differs), ``model.safetensors`` (shards of at most 5 GiB and
``model.safetensors.index.json`` beyond that) and the source folder's tokenizer files. What is
written, tensor by tensor, is workbench.export.mlx_layout's layout (the names, the stacked
experts, the float dtype), which also predicts the files' size to the byte.

Which tensors and schemes: workbench.quant.runtimes' ``mlx`` runtime (Linear, Embedding and
expert weights whose last dimension the group divides, in the MLX modes of
workbench.schemes.mlx). Each quantized weight is quantized as mlx.core.quantize does it (the
same bytes) from the weight cast to the export's dtype, with the scales and biases in that
dtype (float16 for a float32 model: the schemes' sizes assume 2-byte scales); a plan's method
(``--method``) quantizes through its own quantizer with the same scheme. The folder is written
whole in a temporary folder beside the output and renamed into place.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.core.progress import Progress
from workbench.export import register_exporter
from workbench.export import mlx_layout as L
from workbench.quant.plan import KEEP

ST_DTYPE = {"BF16": "BF16"}       # arrays whose numpy dtype does not name the safetensors one


def _float_tensor(model, name: str, dtype: str) -> np.ndarray:
    """A float tensor in the export's dtype: the stored bytes when the source has that dtype,
    else its float32 values rounded (bfloat16 as uint16 bits)."""
    from workbench.schemes.mlx.reference import store
    info = model.info(name)
    shape = tuple(info.shape)
    if not info.is_float:
        return np.asarray(model.raw(name)).reshape(shape)
    if info.dtype == dtype and not info.quant:
        raw = np.asarray(model.raw(name))
        return (raw.view(np.uint16) if dtype == "BF16" else raw).reshape(shape)
    return store(np.asarray(model.read(name), np.float32).reshape(shape), dtype)


def _quantized(model, name: str, scheme) -> dict:
    """One source weight quantized with `scheme` (an MLXScheme for the export's dtype)."""
    from workbench.quant import accel
    w = np.asarray(model.read_matrix(name), np.float32)   # rounded to its dtype by the scheme
    if hasattr(model, "quantize_tensor"):  # a plan's method
        qt = model.quantize_tensor(name, w, scheme.name)
    else:
        qt = accel.quantize(scheme, w, tensor=name)
    if qt.scheme != scheme.name:
        raise WorkbenchError(f"internal error: quantized as {qt.scheme}, not {scheme.name}",
                             tensor=name)
    return qt.arrays


def _module_arrays(model, mod: L.Module, dtype: str) -> dict:
    """{output name: array} of one module, shaped as the layout says."""
    from workbench.schemes import get_scheme
    if mod.scheme == KEEP:
        parts = [_float_tensor(model, n, dtype) for n in mod.sources]
        (name, (_, shape)), = mod.arrays.items()
        arr = np.stack(parts) if len(parts) > 1 or name != mod.sources[0] else parts[0]
        return {name: arr.reshape(shape)}
    scheme = get_scheme(mod.scheme).for_dtype(dtype)
    got = [_quantized(model, n, scheme) for n in mod.sources]
    out = {}
    for key in ("weight", "scales", "biases"):
        if f"{mod.path}.{key}" not in mod.arrays:
            continue
        _, shape = mod.arrays[f"{mod.path}.{key}"]
        arr = np.stack([np.ascontiguousarray(g[key]).reshape(-1) for g in got])
        out[f"{mod.path}.{key}"] = arr.reshape(shape)
    return out


#: config keys mlx-lm 0.32's model classes read under their transformers-4 names, filled in from
#: the transformers-5 spelling when only that is present (nothing removed or changed)
LEGACY_KEYS = (("num_experts", "num_local_experts"), ("torch_dtype", "dtype"))


def _legacy_keys(cfg: dict) -> dict:
    for old, new in LEGACY_KEYS:
        if old not in cfg and new in cfg:
            cfg[old] = cfg[new]
    rope = cfg.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" not in cfg and "rope_theta" in rope:
        cfg["rope_theta"] = rope["rope_theta"]
    return cfg


def _config(model, mods) -> dict:
    from workbench.formats.llama_names import read_config
    cfg = read_config(model)
    if cfg is None:
        raise WorkbenchError("the MLX export needs the model's config.json (mlx-lm builds the "
                             "network from it)", path=model.path)
    cfg = _legacy_keys(dict(cfg))
    q = L.quantization_config(mods)
    cfg.pop("quantization", None)
    cfg.pop("quantization_config", None)
    if q is not None:
        cfg["quantization"] = q
        cfg["quantization_config"] = q       # mlx-lm writes both
    return cfg


def _check_tokenizer(src: Path) -> list[str]:
    from workbench.core.limits import check_sidecar
    from workbench.export.compressed_tensors import TOKENIZER_FILES
    found = [f for f in TOKENIZER_FILES if (src / f).is_file()]
    for f in found:
        check_sidecar(src / f)
    return found


@register_exporter("mlx", "", kind="folder", description=
                   "an mlx-lm folder for Apple MLX (mlx_lm.load): affine 2-8 bits in groups of "
                   "32/64/128, mxfp4, nvfp4, mxfp8, mixed per module")
def export_mlx(model, plan, out_path, strict: bool = False):
    from workbench.core.atomic import clean_stale_temps, discard_folder, replace_folder
    from workbench.export.st_writer import StreamingSafetensorsWriter
    from workbench.formats.llama_names import model_folder, read_config
    from workbench.quant.runtimes import check_strict, plan_decisions, summarize
    out_dir = Path(out_path)          # checked by the export door (workbench.core.outputs)
    yield Progress(0, 1, "checking the plan")
    decisions = plan_decisions(model, plan, "mlx")
    if strict:
        check_strict(decisions.values(), path=model.path)
    config = read_config(model)
    dtype = L.export_dtype(model, config)
    mods = L.modules(model, decisions, config)
    cfg = _config(model, mods)
    src = model_folder(model)
    tok = _check_tokenizer(src)
    files = L.shards(mods)
    names = L.shard_names(len(files))
    predicted = sum(L.header_bytes(f) + sum(L.module_bytes(m) for m in f) for f in files)
    total = sum(max(math.prod(m.shape) * len(m.sources), 1) for m in mods) or 1
    clean_stale_temps(out_dir.parent)          # folders left by killed runs
    tmp = out_dir.parent / f".{out_dir.name}.quant-workbench-{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        done, weight_map = 0, {}
        for fname, group in zip(names, files):
            writer = StreamingSafetensorsWriter(tmp / fname, dict(L.METADATA))
            try:
                for mod in group:
                    yield Progress(done, total, f"exporting {mod.path}")
                    for name, arr in _module_arrays(model, mod, dtype).items():
                        want = mod.arrays[name][0]
                        writer.add(name, arr, dtype=ST_DTYPE.get(want))
                        weight_map[name] = fname
                    done += max(math.prod(mod.shape) * len(mod.sources), 1)
                yield Progress(done, total, f"writing {fname}")
                writer.finish()
            except BaseException:
                writer.abort()
                raise
        if len(names) > 1:
            index = {"metadata": {"total_size": sum(L.module_bytes(m) for m in mods)},
                     "weight_map": dict(sorted(weight_map.items()))}
            (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n",
                                                              encoding="utf-8")
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
        for f in tok:
            shutil.copyfile(src / f, tmp / f)
        replace_folder(tmp, out_dir)
    except BaseException as exc:
        discard_folder(tmp, out_dir, exc)
    written = sum((out_dir / n).stat().st_size for n in names)
    summary = summarize(decisions.values())
    quantized = [m for m in mods if m.scheme != KEEP]
    return {"path": str(out_dir), "format": "mlx", "dtype": dtype,
            "quantized": len(quantized), "modules": len(mods), "tensors": len(decisions),
            "safetensors_bytes": written, "predicted_bytes": predicted, "files": names,
            "bytes": sum(f.stat().st_size for f in out_dir.iterdir()),
            "quantization": cfg.get("quantization"),
            "fallbacks": summary.to_dict(),
            "notes": {d.name: d.note for d in decisions.values()
                      if d.note and d.kind in ("fallback", "skipped")}}

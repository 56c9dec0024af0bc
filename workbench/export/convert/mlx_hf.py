"""An mlx-lm folder (any mode, uniform or mixed) as a float Hugging Face folder.

The weights are the mlx loader's (workbench.formats.loaders.mlx_format: every quantized module
dequantized exactly as ``mx.dequantize`` computes it, in the folder's float dtype), stored in
the chosen dtype (default: the folder's own float dtype, so nothing is rounded twice). The
names are mlx-lm's, which are Hugging Face's except for the mixtures of experts: mlx-lm's
``sanitize`` stacks the experts into ``…switch_mlp.{gate,up,down}_proj.weight`` ``[E, out,
in]``; they are split back into ``…experts.{e}.{name}.weight`` (Mixtral's ``w1`` / ``w3`` /
``w2`` for gate / up / down). config.json loses ``"quantization"`` and
``"quantization_config"`` (at the top and in ``text_config``) and gains ``dtype``; every other
file of the folder (the tokenizer's, generation_config.json, a chat template) is copied.
Written into a temporary folder beside the target, renamed into place when whole.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.core.progress import Progress

#: mlx-lm's stacked expert projections -> Mixtral's per-expert names
MIXTRAL_NAMES = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}
_QUANT_KEYS = ("quantization", "quantization_config")
_SKIP = ("config.json", "model.safetensors.index.json")


def float_dtype(model) -> str:
    """The folder's float dtype as convert names it (bf16, f16 or f32): its scales' (or float
    tensors') storage type, bf16 when it has none."""
    from workbench.formats.loaders.mlx_format import FLOAT_SCALES
    names = {"BF16": "bf16", "F16": "f16", "F32": "f32"}
    for info in model.tensors.values():
        if info.dtype in FLOAT_SCALES and info.quant is None:
            return names[info.dtype]
    return "bf16"


def hf_config(cfg_path: Path, dtype: str) -> dict:
    """config.json of the float folder: the mlx one without its quantization entries."""
    from workbench.core.limits import load_sidecar_json
    from workbench.export.convert.hf import TORCH_NAMES
    cfg = load_sidecar_json(cfg_path, "config.json")
    if not isinstance(cfg, dict):
        raise WorkbenchError("config.json is not a JSON object", path=str(cfg_path))
    cfg = dict(cfg)
    for holder in (cfg, cfg.get("text_config")):
        if isinstance(holder, dict):
            for k in _QUANT_KEYS:
                holder.pop(k, None)
    cfg["dtype"] = TORCH_NAMES[dtype]
    if "torch_dtype" in cfg:
        cfg["torch_dtype"] = TORCH_NAMES[dtype]
    return cfg


def hf_tensors(model, cfg: dict) -> list[tuple[str, str, int | None]]:
    """[(Hugging Face name, the loader's tensor, expert index or None)] in the loader's order."""
    mixtral = cfg.get("model_type") == "mixtral"
    out = []
    for name, info in model.tensors.items():
        if ".switch_mlp." not in name:
            out.append((name, name, None))
            continue
        head, tail = name.split(".switch_mlp.", 1)
        proj, _, what = tail.partition(".")
        if what != "weight" or proj not in MIXTRAL_NAMES or info.ndim != 3:
            raise WorkbenchError("a stacked expert tensor with no Hugging Face name (only "
                                 "switch_mlp.{gate,up,down}_proj.weight [experts, out, in] are "
                                 "split)", path=model.path, tensor=name)
        hf = MIXTRAL_NAMES[proj] if mixtral else proj
        out += [(f"{head}.experts.{e}.{hf}.weight", name, e) for e in range(info.shape[0])]
    return out


def write_mlx_hf(model, out: Path, dtype: str | None = None):
    """Job: the mlx-lm `model` (opened by the loader) as a float Hugging Face folder at `out`
    (absent or empty; checked by the caller). Returns {"tensors", "bytes", "dtype"}."""
    from workbench.export.convert.hf import (_discard, cast, make_temp_dir,
                                            raise_write_failure, user_paths)
    from workbench.export.st_writer import StreamingSafetensorsWriter
    folder = Path(model.folder or Path(model.path).parent)
    dtype = dtype or float_dtype(model)
    cfg = hf_config(folder / "config.json", dtype)
    names = hf_tensors(model, cfg)
    tmp = make_temp_dir(out)
    writer = None
    try:
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        for f in sorted(folder.iterdir()):
            if f.is_file() and f.name not in _SKIP and not f.name.endswith(".safetensors") \
                    and not f.name.startswith("."):
                shutil.copyfile(f, tmp / f.name)
        writer = StreamingSafetensorsWriter(tmp / "model.safetensors", {"format": "pt"})
        st = {"f32": "F32", "bf16": "BF16", "f16": "F16"}[dtype]
        last, whole = None, None
        for i, (hf, src, e) in enumerate(names):
            yield Progress(i, len(names), f"tensor {i + 1}/{len(names)} {hf}")
            if src != last:
                whole, last = np.asarray(model.read(src), np.float32), src
            w = whole if e is None else whole[e]
            writer.add(hf, cast(w, dtype, hf), dtype=st)
        whole = None
        yield Progress(len(names), len(names), "finishing model.safetensors")
        writer.finish()
        writer = None
        size = sum(f.stat().st_size for f in tmp.iterdir() if f.is_file())
        os.chmod(tmp, 0o755)
        try:
            os.replace(tmp, out)
        except OSError as exc:
            raise WorkbenchError(f"cannot move the finished folder into place "
                                 f"({exc.strerror or exc}); nothing was written", path=str(out)) \
                from None
    except WorkbenchError as exc:
        if writer is not None:
            writer.abort()
        _discard(None, tmp)
        raise user_paths(exc, str(tmp), f"{model.path} (converting to {out})",
                         lambda what: str(out / what)) from None
    except BaseException as exc:
        if writer is not None:
            writer.abort()
        _discard(None, tmp)
        raise_write_failure(exc, out)
    return {"tensors": len(names), "bytes": size, "dtype": dtype}

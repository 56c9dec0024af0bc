"""PyTorch checkpoints (.bin/.pt/.pth): `torch.load(weights_only=True, mmap=True)`.

Loading never executes code from the file: a pickle that needs anything beyond tensors and
plain containers is refused. Nested state dicts ({"state_dict": ...}, {"model": ...}, ...)
are unwrapped; nested module dicts are flattened with dotted names.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path

import numpy as np

from ..dtypes import TORCH_TO_ST
from ..errors import WorkbenchError
from ..model import Model, TensorInfo

_WRAPPERS = ("state_dict", "model_state_dict", "model", "module", "weights", "params")


def _flatten(obj, prefix: str, out: dict) -> None:
    import torch
    if isinstance(obj, torch.Tensor):
        out[prefix] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)


def _unwrap(obj):
    while isinstance(obj, dict):
        for key in _WRAPPERS:
            if key in obj and isinstance(obj[key], dict):
                obj = obj[key]
                break
        else:
            return obj
    return obj


def _load(path: str):
    import torch
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as exc:
        # legacy (non-zip) serialization cannot be memory-mapped
        if "mmap" not in str(exc) and "zip" not in str(exc).lower():
            raise
        return torch.load(path, map_location="cpu", weights_only=True)


def open_torch(path: str | os.PathLike) -> Model:
    p = str(Path(path))
    if not os.path.exists(p):
        raise WorkbenchError("file not found", path=p)
    try:
        obj = _load(p)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        if "weights_only" in str(exc) or "Unsupported global" in str(exc):
            raise WorkbenchError("refused: this pickle needs to run code to load (only plain "
                                 "tensors and containers are allowed)", path=p) from None
        raise WorkbenchError(f"corrupt PyTorch checkpoint ({first[:200]})", path=p) from None
    except (EOFError, zipfile.BadZipFile) as exc:
        raise WorkbenchError(f"truncated or corrupt PyTorch checkpoint ({type(exc).__name__})",
                             path=p) from None
    except Exception as exc:  # noqa: BLE001 - torch.load of untrusted bytes fails in many ways
        msg = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise WorkbenchError(f"cannot load PyTorch checkpoint ({type(exc).__name__}: {msg})",
                             path=p) from None
    flat: dict = {}
    _flatten(_unwrap(obj), "", flat)
    if not flat:
        raise WorkbenchError("no tensors found in PyTorch checkpoint", path=p)
    tensors: dict[str, TensorInfo] = {}
    for name, t in flat.items():
        key = str(t.dtype).replace("torch.", "")
        if key not in TORCH_TO_ST:
            raise WorkbenchError(f"unsupported dtype {key}", path=p, tensor=name)
        tensors[name] = TensorInfo(name, tuple(t.shape), TORCH_TO_ST[key],
                                   t.numel() * t.element_size(), p)

    def raw(name: str) -> np.ndarray:
        import torch
        t = flat[name].contiguous()
        info = tensors[name]
        if info.dtype == "BF16":
            arr = t.view(torch.int16).numpy().view(np.uint16)
        elif info.dtype.startswith("F8_"):
            arr = t.view(torch.uint8).numpy()
        else:
            arr = t.numpy()
        return arr.reshape(info.matrix_shape)

    return Model(p, "pytorch", tensors, raw, {})


def open_torch_shards(index_path: str | os.PathLike) -> Model:
    """A sharded PyTorch checkpoint (`pytorch_model.bin.index.json` + its shard files)."""
    import json
    idx = Path(index_path)
    try:
        weight_map = json.loads(idx.read_text(encoding="utf-8"))["weight_map"]
        shards = sorted(set(weight_map.values()))
        if not all(isinstance(s, str) and s and "\x00" not in s for s in shards):
            raise ValueError("shard names must be non-empty strings")
    except FileNotFoundError:
        raise WorkbenchError("file not found", path=str(idx)) from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise WorkbenchError(f"malformed PyTorch index ({type(exc).__name__}: {exc})",
                             path=str(idx)) from None
    parts = [open_torch(idx.parent / s) for s in shards]
    tensors: dict[str, TensorInfo] = {}
    owner: dict[str, Model] = {}
    for part in parts:
        for name, info in part.tensors.items():
            if name in owner:
                raise WorkbenchError(f"tensor appears in two shards ({owner[name].path})",
                                     path=part.path, tensor=name)
            owner[name] = part
            tensors[name] = info
    return Model(str(idx), "pytorch", tensors, lambda name: owner[name].raw(name), {})

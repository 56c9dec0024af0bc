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

from workbench.formats.dtypes import TORCH_TO_ST
from workbench.core.errors import WorkbenchError
from workbench.formats.model import Model, TensorInfo

_WRAPPERS = ("state_dict", "model_state_dict", "model", "module", "weights", "params")


MAX_ENTRIES = 1_000_000   # dict entries visited while flattening (shared sub-dicts count each time)
MAX_SHARED = 64           # places one dict object may appear at (a DAG of dicts fans out 2^depth)


def _flatten(obj, prefix: str, out: dict, depth: int = 0, _path: set | None = None,
             _count: list | None = None) -> None:
    """Tensors of nested dicts under dotted names. A dict that contains itself (a cycle the
    pickle can express) is refused, and so is a nesting that fans out past MAX_ENTRIES visits
    (the same dict shared many times over)."""
    import torch
    path = set() if _path is None else _path
    count = [0, {}] if _count is None else _count
    if depth > 64:
        raise WorkbenchError("state dict nested more than 64 levels deep")
    if isinstance(obj, torch.Tensor):
        if prefix in out:
            raise WorkbenchError(f"two tensors flatten to the same name {prefix[:120]!r} "
                                 "(e.g. 'a.b' and 'a' -> 'b')")
        out[prefix] = obj
    elif isinstance(obj, dict):
        if id(obj) in path:
            raise WorkbenchError(f"state dict contains itself (at {prefix[:120]!r}): a "
                                 "self-referencing container")
        path.add(id(obj))
        count[0] += len(obj)
        visits = count[1][id(obj)] = count[1].get(id(obj), 0) + 1
        if count[0] > MAX_ENTRIES or visits > MAX_SHARED:
            raise WorkbenchError(f"state dict has more than {MAX_ENTRIES:,} entries or a dict "
                                 f"shared at more than {MAX_SHARED} places (nested dicts "
                                 "shared many times over)")
        for k, v in obj.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out, depth + 1, path, count)
        path.discard(id(obj))


def _unwrap(obj):
    """Follow {"state_dict": ...}-style wrappers; a wrapper chain that comes back to a dict
    already seen (a self-referencing container) is refused."""
    seen = set()
    while isinstance(obj, dict):
        if id(obj) in seen:
            raise WorkbenchError("state dict wrappers form a cycle (a self-referencing "
                                 "container)")
        seen.add(id(obj))
        for key in _WRAPPERS:
            if key in obj and isinstance(obj[key], dict):
                obj = obj[key]
                break
        else:
            return obj
    return obj


def _load(path: str):
    import warnings
    import torch
    # torch's own UserWarnings (e.g. about weights_only) would print before the one-line refusal
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        # the legacy (non-zip) serialization cannot be memory-mapped: read whole
        return torch.load(path, map_location="cpu", weights_only=True,
                          mmap=zipfile.is_zipfile(path))


def _check_zip_records(p: str) -> None:
    """torch.save stores tensor data uncompressed and mmap=True maps the bytes as they are: a
    compressed record would load as garbage, so it is refused. A plain text file is named."""
    with open(p, "rb") as fh:
        head = fh.read(4)
    if head[:2] != b"PK":
        if head[:1] != b"\x80":
            try:
                with open(p, "rb") as fh:
                    sample = fh.read(512)
                sample.decode("utf-8")
                printable = True
            except UnicodeDecodeError:
                printable = False
            if printable:
                raise WorkbenchError("this is a text file, not a PyTorch checkpoint", path=p)
        return
    try:
        with zipfile.ZipFile(p) as zf:
            infos = zf.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError, EOFError,
            RuntimeError) as exc:
        raise WorkbenchError(f"truncated or corrupt PyTorch checkpoint ({type(exc).__name__})",
                             path=p) from None
    if len(infos) > 1_000_000:
        raise WorkbenchError(f"PyTorch zip with {len(infos):,} records", path=p)
    size = os.path.getsize(p)
    for info in infos:
        if "/data/" in info.filename and info.compress_type != zipfile.ZIP_STORED:
            raise WorkbenchError(f"tensor record {info.filename} is compressed (torch.save "
                                 "stores them uncompressed; re-save the checkpoint)", path=p)
        if info.header_offset + info.file_size > size:
            raise WorkbenchError(f"record {info.filename} runs past the end of the file",
                                 path=p)


def _check_storage_records(p: str, flat: dict) -> None:
    """Every storage the pickle claims must be backed by its own record: a record cut short
    would make mmap=True map the following bytes of the file as weights. The records' sizes
    must add up to at least the storages' bytes."""
    if not zipfile.is_zipfile(p):
        return
    with zipfile.ZipFile(p) as zf:
        record_bytes = sum(i.file_size for i in zf.infolist() if "/data/" in i.filename
                           and not i.filename.endswith("/"))
    storages = {}
    import torch
    for t in flat.values():
        if t.layout != torch.strided or t.device.type == "meta":
            continue  # refused by name below
        st = t.untyped_storage()
        storages[st.data_ptr()] = st.nbytes()
    claimed = sum(storages.values())
    if claimed > record_bytes:
        raise WorkbenchError(f"tensor storages claim {claimed:,} bytes but the checkpoint's data "
                             f"records hold {record_bytes:,} (a record cut short)", path=p)


def _mapping_base(p: str, flat: dict):
    """The address torch's memory map of the file starts at (so a tensor's bytes lie at
    data_ptr - base in the file), found by matching the storages' addresses with the data
    records' offsets in the zip; None when it cannot be established (then tensors are read
    through the map)."""
    import torch
    try:
        if not zipfile.is_zipfile(p):
            return None
        with zipfile.ZipFile(p) as zf, open(p, "rb") as fh:
            offsets = set()
            for i in zf.infolist():
                if "/data/" not in i.filename or i.filename.endswith("/"):
                    continue
                fh.seek(i.header_offset)
                head = fh.read(30)
                if len(head) < 30 or head[:4] != b"PK\x03\x04":
                    return None
                n, m = int.from_bytes(head[26:28], "little"), int.from_bytes(head[28:30], "little")
                offsets.add(i.header_offset + 30 + n + m)
        ptrs = sorted({t.untyped_storage().data_ptr() for t in flat.values()
                       if t.layout == torch.strided and t.device.type != "meta"
                       and t.untyped_storage().nbytes()})
    except (OSError, zipfile.BadZipFile, ValueError, RuntimeError, EOFError):
        return None
    if not ptrs or not offsets:
        return None
    for off in sorted(offsets)[:64]:
        base = ptrs[0] - off
        if all(q - base in offsets for q in ptrs):
            return base
    return None


def open_torch(path: str | os.PathLike) -> Model:
    p = str(Path(path))
    if not os.path.exists(p):
        raise WorkbenchError("file not found", path=p)
    _check_zip_records(p)
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
    import torch
    flat: dict = {}
    try:
        _flatten(_unwrap(obj), "", flat)
    except WorkbenchError as exc:
        raise WorkbenchError(str(exc), path=p) from None
    if not flat:
        raise WorkbenchError("no tensors found in PyTorch checkpoint", path=p)
    tensors: dict[str, TensorInfo] = {}
    file_size = os.path.getsize(p)
    _check_storage_records(p, flat)
    for name, t in flat.items():
        if t.is_sparse or t.layout != torch.strided:
            raise WorkbenchError(f"sparse tensor ({t.layout}) is not supported: save it dense",
                                 path=p, tensor=name)
        if t.device.type == "meta":
            raise WorkbenchError("meta tensor has no data", path=p, tensor=name)
        logical = t.numel() * t.element_size()
        if logical > t.untyped_storage().nbytes() and t.numel() > 1:
            raise WorkbenchError(f"tensor is a broadcast view: {logical:,} bytes from a storage of "
                                 f"{t.untyped_storage().nbytes():,} (save it with .contiguous())",
                                 path=p, tensor=name)
        if logical > file_size:
            raise WorkbenchError(f"tensor claims {logical:,} bytes but the file holds "
                                 f"{file_size:,}", path=p, tensor=name)
        key = str(t.dtype).replace("torch.", "")
        if key not in TORCH_TO_ST:
            raise WorkbenchError(f"unsupported dtype {key}", path=p, tensor=name)
        tensors[name] = TensorInfo(name, tuple(t.shape), TORCH_TO_ST[key],
                                   t.numel() * t.element_size(), p)

    base = _mapping_base(p, flat)

    def raw(name: str) -> np.ndarray:
        import torch
        info = tensors[name]
        t = flat[name].detach()                # nn.Parameter requires grad
        if base is not None and t.is_contiguous() and info.nbytes:
            # read the bytes with pread where they lie in the file, not through torch's
            # memory map: a file truncated meanwhile is an error, not a SIGBUS
            # (a large tensor: a Region, read row chunk by row chunk)
            from workbench.formats.loaders.region import tensor_region
            off = t.data_ptr() - base
            np_t = {"BF16": np.uint16}.get(info.dtype) or (
                np.uint8 if info.dtype.startswith("F8_") else t.numpy().dtype)
            return tensor_region(p, off, info.nbytes, np_t).reshape(info.matrix_shape)
        if base is not None and info.nbytes and t.layout == torch.strided \
                and min(t.stride(), default=0) >= 0:
            # a strided view (e.g. a transposed tensor saved as such): the bytes it spans
            # read with pread, then arranged; torch's .contiguous() would read the map
            from workbench.formats.loaders.region import read_region
            np_t = {"BF16": np.uint16}.get(info.dtype) or (
                np.uint8 if info.dtype.startswith("F8_") else t.numpy().dtype)
            item = t.element_size()
            extent = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
            buf = read_region(p, t.data_ptr() - base, extent * item, np_t)
            arr = np.lib.stride_tricks.as_strided(
                buf, shape=tuple(t.shape), strides=tuple(s * item for s in t.stride()),
                writeable=False)
            return np.ascontiguousarray(arr).reshape(info.matrix_shape)
        t = t.contiguous()
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
    idx = Path(index_path)
    try:
        from workbench.core.limits import load_sidecar_json
        weight_map = load_sidecar_json(idx, "PyTorch index")["weight_map"]
        shards = sorted(set(weight_map.values()))
        if not all(isinstance(s, str) and s and "\x00" not in s for s in shards):
            raise ValueError("shard names must be non-empty strings")
    except FileNotFoundError:
        raise WorkbenchError("file not found", path=str(idx)) from None
    except WorkbenchError:
        raise
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise WorkbenchError(f"malformed PyTorch index ({type(exc).__name__}: {exc})",
                             path=str(idx)) from None
    from workbench.core.limits import shard_path
    parts = [open_torch(shard_path(idx, s)) for s in shards]
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

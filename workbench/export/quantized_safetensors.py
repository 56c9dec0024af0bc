"""Quantized safetensors: packed codes + scales per tensor, the scheme of each in metadata.

Layout: a tensor `W` quantized with scheme S is stored as one safetensors tensor per storage
array, named ``W::codes``, ``W::scales`` (and ``W::zeros`` ...), with exactly the bytes of
``QuantizedTensor.arrays``. Kept tensors are stored unchanged under their own name.
The header metadata key ``quant_workbench`` holds JSON::

    {"version": 1, "plan": {...plan JSON...},
     "tensors": {"W": {"scheme": "int4-g128", "shape": [4096, 4096], "dtype": "F32",
                       "arrays": ["codes", "scales"]}, ...}}

`open_model` recognises such a file and presents the original tensors, dequantized on
demand with the registry's reference dequantize: exactly the reference result.
"""

from __future__ import annotations

import json

import numpy as np

from ..dtypes import STORAGE
from ..errors import WorkbenchError
from ..evaluate import quantize
from .. import streaming
from ..model import Model, TensorInfo
from ..plan import KEEP
from ..progress import Progress
from ..schemes import QuantizedTensor, get_scheme
from . import register_exporter
from .st_writer import StreamingSafetensorsWriter

META_KEY = "quant_workbench"
SEP = "::"

KEPT_STREAM_BYTES = 64 << 20   # a kept tensor above this is written in row slices of:
KEPT_CHUNK_BYTES = 16 << 20


@register_exporter("safetensors", ".safetensors",
                   "quantized weights: packed codes + scales, scheme per tensor in metadata")
def export_quantized_safetensors(model, plan, out_path, strict: bool = False):
    from ..runtimes import check_strict, plan_decisions, summarize
    decisions = plan_decisions(model, plan, "any")
    if strict:
        check_strict(decisions.values(), path=model.path)
    names = list(model.tensors)
    total = sum(max(model.info(n).numel, 1) for n in names) or 1
    done = 0
    index = {}
    writer = StreamingSafetensorsWriter(out_path)
    try:
        for k, n in enumerate(names, 1):
            info = model.info(n)
            yield Progress(done, total, f"exporting {k}/{len(names)} {n}")
            scheme = decisions[n].applied
            if scheme == KEEP:
                raw = model.raw(n)
                if info.quant or info.dtype not in STORAGE:
                    # a GGUF block type or an already-quantized tensor: store its float32 decoding
                    writer.add(n, model.read(n).astype(np.float32))
                elif info.nbytes > KEPT_STREAM_BYTES and info.rows >= 2:
                    # a large tensor: its rows read and written a slice at a time (the loader
                    # reads the rows asked for), the same bytes
                    step = max(1, KEPT_CHUNK_BYTES // max(1, info.nbytes // info.rows))
                    writer.add_stream(n, (np.asarray(raw[r0:r0 + step]).reshape(-1)
                                          for r0 in range(0, info.rows, step)),
                                      dtype=info.dtype, shape=info.shape)
                else:
                    writer.add(n, np.asarray(raw).reshape(info.shape), dtype=info.dtype)
            elif streaming.export_streamed(model, info, scheme):
                # a big tensor: quantized and written a block of rows at a time, the same bytes
                key, blocks, spool = streaming.quantized_row_blocks(model, n, scheme)
                writer.add_stream(f"{n}{SEP}{key}", blocks)
                for k, parts in spool.items():
                    writer.add(f"{n}{SEP}{k}", np.concatenate(parts))
                index[n] = {"scheme": scheme, "shape": list(info.shape), "dtype": info.dtype,
                            "arrays": [key, *spool]}
            else:
                w = model.read_matrix(n)
                qt = model.quantize_tensor(n, w, scheme) if hasattr(
                    model, "quantize_tensor") else quantize(w, scheme, tensor=n)
                for key, arr in qt.arrays.items():
                    writer.add(f"{n}{SEP}{key}", arr)
                index[n] = {"scheme": scheme, "shape": list(info.shape), "dtype": info.dtype,
                            "arrays": list(qt.arrays)}
            done += max(info.numel, 1)
        writer.metadata[META_KEY] = json.dumps({"version": 1, "plan": plan.to_dict(),
                                                "tensors": index})
        yield Progress(total, total, "writing file")
        writer.finish()
    except BaseException:
        writer.abort()
        raise
    summary = summarize(decisions.values())
    return {"path": str(out_path), "format": "safetensors", "quantized": len(index),
            "tensors": len(names), "fallbacks": summary.to_dict(),
            "notes": {d.name: d.note for d in decisions.values()
                      if d.note and d.kind in ("fallback", "skipped")}}


def _check_layout(scheme, shape, array_keys, nbytes: int, path, name) -> None:
    """The stored arrays must be exactly what `scheme` writes for `shape`: metadata edited to
    another scheme (or arrays swapped) would otherwise decode to wrong values silently."""
    from ..limits import check_shape
    from ..schemes.base import matrix_shape
    check_shape(shape, path, name)
    want = scheme.nbytes(shape)
    if nbytes != want:
        raise WorkbenchError(f"stored arrays hold {nbytes:,} bytes but {scheme.name} of shape "
                             f"{list(shape)} needs {want:,}: the metadata does not match the data",
                             path=path, tensor=name)
    rows, cols = matrix_shape(shape)
    probe = scheme.quantize(np.zeros((1, cols), np.float32)) if cols else None
    if probe is not None and sorted(probe.arrays) != sorted(array_keys):
        raise WorkbenchError(f"stored arrays {sorted(array_keys)} are not {scheme.name}'s "
                             f"{sorted(probe.arrays)}", path=path, tensor=name)


def open_quantized(path: str, files, tensors: dict, owner: dict, metadata: dict) -> Model:
    """Present a quantized safetensors file as its original (dequantized) tensors."""
    try:
        from ..limits import loads
        meta = loads(metadata[META_KEY], path, "JSON")
        qindex = meta["tensors"]
        if meta.get("version") != 1 or not isinstance(qindex, dict):
            raise ValueError("unsupported version")
    except WorkbenchError as exc:
        raise WorkbenchError(f"corrupt quant_workbench metadata ({str(exc).split(': ', 1)[-1]})",
                             path=path) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise WorkbenchError(f"corrupt quant_workbench metadata ({exc})", path=path) from None
    infos: dict[str, TensorInfo] = {}
    storage: dict[str, tuple[str, list[str]]] = {}
    claimed = set()
    for name, entry in qindex.items():
        try:
            scheme = get_scheme(entry["scheme"])
            arrays = [f"{name}{SEP}{k}" for k in entry["arrays"]]
            shape = tuple(int(s) for s in entry["shape"])
        except (KeyError, TypeError, ValueError, WorkbenchError) as exc:
            raise WorkbenchError(f"corrupt quant_workbench metadata ({exc})", path=path,
                                 tensor=name) from None
        missing = [a for a in arrays if a not in tensors]
        if missing:
            raise WorkbenchError(f"quantized tensor is missing its array {missing[0]}",
                                 path=path, tensor=name)
        nbytes = sum(tensors[a].nbytes for a in arrays)
        _check_layout(scheme, shape, entry["arrays"], nbytes, path, name)
        infos[name] = TensorInfo(name, shape, "F32", nbytes, owner[arrays[0]].path,
                                 quant=scheme.name)
        storage[name] = (scheme.name, arrays)
        claimed.update(arrays)
    for name, info in tensors.items():
        if name not in claimed:
            infos[name] = info

    def qtensor(name: str) -> QuantizedTensor:
        scheme, arrays = storage[name]
        data = {a.split(SEP)[-1]: np.array(owner[a].raw(a)) for a in arrays}
        return QuantizedTensor(scheme, infos[name].shape, data)

    def raw(name: str) -> np.ndarray:
        info = infos[name]
        if name in storage:
            qt = qtensor(name)
            return get_scheme(qt.scheme).dequantize(qt).reshape(info.matrix_shape)
        return owner[name].raw(name).reshape(info.matrix_shape)

    m = Model(path, "quantized-safetensors", infos, raw,
              {k: v for k, v in metadata.items() if k != META_KEY})
    m.source = qtensor
    m.metadata["quant_workbench.plan"] = json.dumps(meta.get("plan"))
    return m

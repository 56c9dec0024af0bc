"""Reading the workbench's quantized safetensors (written by workbench.export.quantized_safetensors):
the tensors as the original (dequantized) ones, each checked against the layout its scheme
writes, and the packed codes as `model.source`.
"""

from __future__ import annotations

import json

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.formats.model import Model, TensorInfo
from workbench.schemes import QuantizedTensor, get_scheme

META_KEY = "quant_workbench"
SEP = "::"


def _check_layout(scheme, shape, array_keys, nbytes: int, path, name) -> None:
    """The stored arrays must be exactly what `scheme` writes for `shape`: metadata edited to
    another scheme (or arrays swapped) would otherwise decode to wrong values silently."""
    from workbench.core.limits import check_shape
    from workbench.schemes.base import matrix_shape
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
        from workbench.core.limits import loads
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

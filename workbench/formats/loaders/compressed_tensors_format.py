"""Read a vLLM compressed-tensors checkpoint (``pack-quantized``, ``float-quantized``) as its
dequantized tensors, for `quant-workbench diff`.

Format facts (compressed-tensors, as vLLM reads it): per quantized linear layer
``<layer>.weight_packed`` int32 [out, in·b/32] holding q + 2^(b−1), element i at bit i·b of
little-endian words; ``<layer>.weight_scale`` [out, in/group] (one column: per channel);
``<layer>.weight_shape`` [out, in]; ``<layer>.weight_zero_point`` (asymmetric) packed the same
way along dim 0. ``float-quantized`` FP8 layers keep ``<layer>.weight`` as float8_e4m3fn with a
``weight_scale`` per tensor ([1]), per channel ([out, 1]) or per block ([⌈out/bh⌉, ⌈in/bw⌉],
``block_structure`` [bh, bw], default 128×128). Values: (q − zp) · scale.
``nvfp4-pack-quantized`` / ``mxfp4-pack-quantized``: ``<layer>.weight_packed`` uint8 [out, in/2]
(two E2M1 codes per byte, weight 2k low), ``weight_scale`` float8_e4m3fn [out, in/16] with
``weight_global_scale`` [1] (w = e2m1·scale/global) or uint8 E8M0 [out, in/32] (w =
e2m1·2^(e−127)), decoded as workbench/schemes/microscaling.py does (float32, exact).
Every other tensor is read as stored. The header is checked against the tensors before any of
this (workbench/formats/loaders/ct_layout.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.formats.loaders.ct_layout import args_for
from workbench.formats.model import Model, TensorInfo

def is_compressed_tensors(path) -> bool:
    """A folder (or a .safetensors in one) whose config.json says compressed-tensors."""
    p = Path(path)
    folder = p if p.is_dir() else p.parent
    cfg = folder / "config.json"
    if not cfg.is_file():
        return False
    from workbench.core.limits import load_sidecar_json
    data = load_sidecar_json(cfg, "config.json")   # too large / deep / malformed: refused
    q = data.get("quantization_config") if isinstance(data, dict) else None
    return isinstance(q, dict) and q.get("quant_method") == "compressed-tensors"


def _unpack(words: np.ndarray, bits: int, n: int) -> np.ndarray:
    """Unsigned b-bit values, element i at bit i·b of little-endian 32-bit words, along the
    last axis: (..., words) -> (..., n)."""
    w = np.ascontiguousarray(words).astype("<u4", copy=False)
    as_bytes = w.view(np.uint8).reshape(*w.shape[:-1], w.shape[-1] * 4)
    bitarr = np.unpackbits(as_bytes, axis=-1, bitorder="little")
    need = n * bits
    bitarr = bitarr[..., :need].reshape(*w.shape[:-1], n, bits)
    weights = (1 << np.arange(bits, dtype=np.int64))
    return (bitarr.astype(np.int64) * weights).sum(-1)


_args_for = args_for    # the name tests/workbench/test_input_limits.py uses


def block_dequant(w: np.ndarray, s: np.ndarray, block) -> np.ndarray:
    """float32 w * s of its (bh, bw) block (s: [ceil(rows/bh), ceil(cols/bw)])."""
    bh, bw = block
    rows, cols = w.shape
    full = np.repeat(np.repeat(np.asarray(s, np.float32), bh, 0)[:rows], bw, 1)[:, :cols]
    return (w * full).astype(np.float32)


def _fp4_values(base, part, rows, cols) -> np.ndarray:
    from workbench.schemes import get_scheme
    arrays = {"packed": np.asarray(base.raw(part["fp4"])).view(np.uint8).reshape(rows, cols // 2),
              "scales": np.asarray(base.raw(part["scale"])).view(np.uint8).reshape(rows, -1)}
    if part["global"] is not None:
        arrays["global_scale"] = np.asarray(base.read(part["global"]), np.float32).reshape(1)
    return get_scheme(part["label"])._dequantize(arrays, rows, cols)


def _grouped(q: np.ndarray, scale: np.ndarray, zp, gs: int) -> np.ndarray:
    """(q - zp) * scale of each value's group: scale / zp [rows or 1, groups], gs values a
    group along the columns (the last group may be short)."""
    cols = q.shape[1]
    g = np.arange(cols) // gs
    if zp is not None:
        q = q - zp[:, g]
    return (q * scale[:, g]).astype(np.float32)


def open_compressed_tensors(path) -> Model:
    """The folder's dequantized tensors, its quantization_config checked against them first
    (workbench.formats.loaders.ct_layout): a contradiction is a one-line error naming the
    file and the tensor, before any data is read."""
    from workbench.formats.loaders.ct_layout import check_layers
    from workbench.formats.loaders.safetensors_format import open_safetensors
    p = Path(path)
    folder = p if p.is_dir() else p.parent
    from workbench.core.limits import load_sidecar_json
    config = load_sidecar_json(folder / "config.json", "config.json")
    try:
        qcfg = config["quantization_config"]
    except (KeyError, TypeError) as exc:
        raise WorkbenchError(f"cannot read the compressed-tensors config.json ({exc})",
                             path=str(folder / "config.json")) from None
    base = open_safetensors(p)
    parts, claimed = check_layers(base, qcfg, folder, p)
    infos: dict[str, TensorInfo] = {}
    for name, info in base.tensors.items():
        if name not in claimed:
            infos[name] = info
    for wname, part in parts.items():
        head = base.info(part["members"][0])
        infos[wname] = TensorInfo(wname, part["shape"], "F32",
                                  sum(base.info(m).nbytes for m in part["members"]), head.file,
                                  quant=part["label"])

    def raw(name: str) -> np.ndarray:
        info = infos[name]
        part = parts.get(name)
        if part is None:
            return base.raw(name)
        rows, cols = info.matrix_shape
        if rows * cols == 0:                                # an empty tensor has no scales to read
            return np.zeros(info.shape, np.float32)
        if "fp4" in part:
            return _fp4_values(base, part, rows, cols)
        scale = np.asarray(base.read(part["scale"]), np.float32).reshape(part["groups"])
        if "fp8" in part:
            w = base.read_matrix(part["fp8"]).reshape(rows, cols)
            if part["block"] is not None:
                return block_dequant(w, scale, part["block"])
            return _grouped(w, scale, None, part["group_size"])
        bits = part["bits"]
        half = 1 << (bits - 1)
        words = np.asarray(base.raw(part["packed"])).reshape(rows, -1)
        q = _unpack(words.view(np.uint32), bits, cols) - half
        zp = None
        if part["zp"] is not None:
            ng = part["groups"][1]
            zw = np.asarray(base.raw(part["zp"])).reshape(-1, ng).view(np.uint32)
            zp = _unpack(np.ascontiguousarray(zw.T), bits, part["groups"][0]).T - half
        return _grouped(q, scale, zp, part["group_size"])

    return Model(str(p), "compressed-tensors", infos, raw, dict(base.metadata))

"""Read a vLLM compressed-tensors checkpoint (``pack-quantized``, ``float-quantized``) as its
dequantized tensors, for `quant-workbench diff`.

Format facts (compressed-tensors, as vLLM reads it): per quantized linear layer
``<layer>.weight_packed`` int32 [out, in·b/32] holding q + 2^(b−1), element i at bit i·b of
little-endian words; ``<layer>.weight_scale`` [out, in/group] (one column: per channel);
``<layer>.weight_shape`` [out, in]; ``<layer>.weight_zero_point`` (asymmetric) packed the same
way along dim 0. ``float-quantized`` FP8 layers keep ``<layer>.weight`` as float8_e4m3fn with a
per-channel ``weight_scale``. Values: (q − zp) · scale. Every other tensor is read as stored.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.formats.model import Model, TensorInfo

PACKED = ".weight_packed"


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


def _scheme_label(args: dict) -> str:
    bits = args.get("num_bits")
    kind = args.get("type", "int")
    if kind == "float":
        return f"fp{bits}-e4m3" if bits == 8 else f"fp{bits}"
    strat = args.get("strategy")
    gran = f"g{args.get('group_size')}" if strat == "group" else str(strat or "channel")
    return f"int{bits}-{gran}" + ("" if args.get("symmetric", True) else "-asym")


def _layer_args(config: dict) -> list[tuple[list[str], dict]]:
    out = []
    groups = config.get("config_groups") or {}
    for g in groups.values() if isinstance(groups, dict) else []:
        if isinstance(g, dict) and isinstance(g.get("weights"), dict):
            out.append(([t for t in g.get("targets") or [] if isinstance(t, str)], g["weights"]))
    return out


def _args_for(layer: str, groups, path=None) -> dict | None:
    """The quantization args of the first group targeting `layer`. ``re:`` targets are
    untrusted regular expressions: matched on RE2 (linear time, no backtracking: a target
    ``re:(.*.*)*X`` cannot hang), with compressed-tensors' ``re.match`` semantics."""
    for targets, args in groups:
        for t in targets:
            if t.startswith("re:"):
                if _target(t[3:], path).match(layer):
                    return args
            elif t == layer or layer.endswith("." + t) or t == "Linear":
                return args
    return groups[0][1] if len(groups) == 1 else None


def _target(pattern: str, path):
    from workbench.core.patterns import compile_pattern
    try:
        return compile_pattern(pattern)
    except WorkbenchError as exc:
        raise WorkbenchError(f"quantization_config target re:{pattern[:80]}: {exc}",
                             path=str(path)) from None


def open_compressed_tensors(path) -> Model:
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
    groups = _layer_args(qcfg)
    infos: dict[str, TensorInfo] = {}
    parts: dict[str, dict] = {}
    claimed: set[str] = set()
    for name in base.tensors:
        if not name.endswith(PACKED):
            continue
        layer = name[:-len(PACKED)]
        scale = f"{layer}.weight_scale"
        shape_t = f"{layer}.weight_shape"
        if scale not in base.tensors or shape_t not in base.tensors:
            raise WorkbenchError("packed weight without its weight_scale / weight_shape",
                                 path=str(p), tensor=name)
        shape = tuple(int(v) for v in np.asarray(base.raw(shape_t)).reshape(-1))
        args = _args_for(layer, groups, folder / "config.json") or {}
        bits = int(args.get("num_bits") or 0)
        if not (1 <= bits <= 8) or len(shape) != 2:
            raise WorkbenchError(f"unsupported packed layout (num_bits {bits}, shape {shape})",
                                 path=str(p), tensor=name)
        zp = f"{layer}.weight_zero_point"
        members = [name, scale, shape_t] + ([zp] if zp in base.tensors else [])
        nbytes = sum(base.info(m).nbytes for m in members)
        wname = f"{layer}.weight"
        infos[wname] = TensorInfo(wname, shape, "F32", nbytes, base.info(name).file,
                                  quant=_scheme_label(args))
        parts[wname] = {"packed": name, "scale": scale, "zp": zp if zp in base.tensors else None,
                        "bits": bits}
        claimed.update(members)
    for name, info in base.tensors.items():
        if name in claimed:
            continue
        if name.endswith(".weight_scale") and name[:-len("_scale")] in base.tensors \
                and base.info(name[:-len("_scale")]).dtype.startswith("F8"):
            continue
        if name.endswith(".weight") and info.dtype.startswith("F8") \
                and f"{name}_scale" in base.tensors:
            layer = name[:-len(".weight")]
            args = _args_for(layer, groups, folder / "config.json") or {"num_bits": 8,
                                                                     "type": "float"}
            nbytes = info.nbytes + base.info(f"{name}_scale").nbytes
            infos[name] = TensorInfo(name, info.shape, "F32", nbytes, info.file,
                                     quant=_scheme_label(args))
            parts[name] = {"fp8": name, "scale": f"{name}_scale"}
            continue
        infos[name] = info

    def raw(name: str) -> np.ndarray:
        info = infos[name]
        part = parts.get(name)
        if part is None:
            return base.raw(name)
        rows, cols = info.matrix_shape
        scale = base.read_matrix(part["scale"]).reshape(rows, -1).astype(np.float32)
        if "fp8" in part:
            w = base.read_matrix(part["fp8"]).reshape(rows, cols)
            return (w * scale[:, :1]).astype(np.float32)
        bits = part["bits"]
        half = 1 << (bits - 1)
        words = np.asarray(base.raw(part["packed"])).reshape(rows, -1)
        q = _unpack(words.view(np.uint32), bits, cols) - half
        ng = scale.shape[1]
        gs = -(-cols // ng)
        if part["zp"] is not None:
            zw = np.asarray(base.raw(part["zp"])).reshape(-1, ng).view(np.uint32)
            zp = _unpack(np.ascontiguousarray(zw.T), bits, rows).T - half   # packed along dim 0
        else:
            zp = np.zeros((rows, ng), np.int64)
        g = np.minimum(np.arange(cols) // gs, ng - 1)
        return ((q - zp[:, g]) * scale[:, g]).astype(np.float32)

    m = Model(str(p), "compressed-tensors", infos, raw, dict(base.metadata))
    return m

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
Every other tensor is read as stored.
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


def block_dequant(w: np.ndarray, s: np.ndarray, block) -> np.ndarray:
    """float32 w * s of its (bh, bw) block (s: [ceil(rows/bh), ceil(cols/bw)])."""
    bh, bw = block
    rows, cols = w.shape
    full = np.repeat(np.repeat(np.asarray(s, np.float32), bh, 0)[:rows], bw, 1)[:, :cols]
    return (w * full).astype(np.float32)


def _fp8_block(base, name, args, path):
    """None for a per-tensor / per-channel FP8 scale, else the (bh, bw) of a block scale whose
    shape matches the weight's (checked here: a hostile header is one clear error)."""
    rows, cols = base.info(name).matrix_shape
    sshape = tuple(base.info(f"{name}_scale").shape)
    n = int(np.prod(sshape)) if sshape else 1
    if n == 1 or n == rows and (len(sshape) == 1 or sshape[-1] == 1):
        return None
    bs = args.get("block_structure") or [128, 128]
    if not (isinstance(bs, list) and len(bs) == 2 and all(isinstance(b, int) and 0 < b <= 1 << 20
                                                          for b in bs)):
        raise WorkbenchError(f"block_structure {str(bs)[:40]} is not two positive integers",
                             path=str(path), tensor=name)
    want = (-(-rows // bs[0]), -(-cols // bs[1]))
    if sshape != want:
        raise WorkbenchError(f"weight_scale shape {sshape} does not fit {bs[0]}x{bs[1]} blocks "
                             f"of a {rows}x{cols} weight (expected {want})", path=str(path),
                             tensor=f"{name}_scale")
    return tuple(bs)


def _fp4_part(base, layer, args, path):
    """(part, member tensors) of an NVFP4 / MXFP4 layer, its header checked."""
    name = f"{layer}.weight_packed"
    scale, gname = f"{layer}.weight_scale", f"{layer}.weight_global_scale"
    info = base.info(name)
    if len(info.shape) != 2 or scale not in base.tensors:
        raise WorkbenchError("uint8 weight_packed must be 2-D with a weight_scale",
                             path=str(path), tensor=name)
    rows, cols = int(info.shape[0]), 2 * int(info.shape[1])
    sdt = base.info(scale).dtype
    nv = sdt.startswith("F8")
    group = 16 if nv else 32
    if args.get("type", "float") != "float" or int(args.get("num_bits") or 4) != 4 or             int(args.get("group_size") or group) != group or sdt not in ("F8_E4M3", "U8"):
        raise WorkbenchError(f"unsupported FP4 layout (scale dtype {sdt}, args "
                             f"{str(args)[:80]})", path=str(path), tensor=name)
    if tuple(base.info(scale).shape) != (rows, cols // group) or cols % group:
        raise WorkbenchError(f"weight_scale shape {tuple(base.info(scale).shape)} does not fit "
                             f"groups of {group} of a {rows}x{cols} weight", path=str(path),
                             tensor=scale)
    members = [name, scale]
    if nv:
        if gname not in base.tensors or base.info(gname).numel != 1:
            raise WorkbenchError("NVFP4 weight without a one-element weight_global_scale",
                                 path=str(path), tensor=name)
        members.append(gname)
    return ({"fp4": name, "scale": scale, "global": gname if nv else None, "group": group,
             "shape": (rows, cols), "label": "nvfp4-g16" if nv else "mxfp4-g32"}, members)


def _fp4_values(base, part, rows, cols) -> np.ndarray:
    from workbench.schemes import get_scheme
    arrays = {"packed": np.asarray(base.raw(part["fp4"])).view(np.uint8).reshape(rows, cols // 2),
              "scales": np.asarray(base.raw(part["scale"])).view(np.uint8).reshape(rows, -1)}
    if part["global"] is not None:
        arrays["global_scale"] = np.asarray(base.read(part["global"]), np.float32).reshape(1)
    return get_scheme(part["label"])._dequantize(arrays, rows, cols)


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
        if base.info(name).dtype == "U8":                    # NVFP4 / MXFP4
            args = _args_for(layer, groups, folder / "config.json") or {}
            part, members = _fp4_part(base, layer, args, p)
            wname = f"{layer}.weight"
            infos[wname] = TensorInfo(wname, part["shape"], "F32",
                                      sum(base.info(m).nbytes for m in members),
                                      base.info(name).file, quant=part["label"])
            parts[wname] = part
            claimed.update(members)
            continue
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
            parts[name] = {"fp8": name, "scale": f"{name}_scale",
                           "block": _fp8_block(base, name, args, p)}
            continue
        infos[name] = info

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
        if "fp8" in part:
            w = base.read_matrix(part["fp8"]).reshape(rows, cols)
            s = np.asarray(base.read(part["scale"]), np.float32)
            if part["block"] is None:                       # per tensor or per channel
                s = s.reshape(-1)[:1].reshape(1, 1) if s.size == 1 else s.reshape(rows, 1)
                return (w * s).astype(np.float32)
            return block_dequant(w, s, part["block"])
        scale = base.read_matrix(part["scale"]).reshape(rows, -1).astype(np.float32)
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

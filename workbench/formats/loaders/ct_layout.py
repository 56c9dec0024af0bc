"""A compressed-tensors folder's ``quantization_config`` checked against its tensors, in one
place, when the model is opened: every quantized layer's companions (``weight_scale``,
``weight_shape``, ``weight_zero_point``, ``weight_global_scale``) present, of the dtype and the
shape its config group's args (num_bits, type, symmetric, strategy, group_size,
block_structure) and its packed data imply, or a one-line WorkbenchError naming the file and
the tensor. Shapes are checked against the bytes stored before anything is allocated; the
decoder (compressed_tensors_format) then only decodes what this module describes.

Defaults are the compressed-tensors package's: symmetric true; a strategy left out is
``group`` when a group_size is given, else ``tensor``; block_structure 128x128.
"""

from __future__ import annotations

from pathlib import Path

from workbench.core.errors import WorkbenchError

PACKED = ".weight_packed"
COMPANIONS = ("weight_scale", "weight_shape", "weight_zero_point", "weight_global_scale",
              "weight_g_idx")
FORMATS = ("pack-quantized", "float-quantized", "nvfp4-pack-quantized", "mxfp4-pack-quantized",
           "mixed-precision", "dense")
STRATEGIES = ("tensor", "channel", "group", "block", "tensor_group")
FLOATS = ("F32", "F16", "BF16")
MAX_DIM = 1 << 20


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _short(v) -> str:
    return repr(v)[:40]


def check_config(qcfg, cfg_path) -> list[tuple[list[str], dict]]:
    """(targets, weight args) of every config group, each field's type and range checked."""
    where = str(cfg_path)

    def bad(msg):
        raise WorkbenchError(f"quantization_config {msg}", path=where)

    if not isinstance(qcfg, dict):
        bad("is not an object")
    fmt = qcfg.get("format")
    if fmt is not None and fmt not in FORMATS:
        bad(f"format {_short(fmt)} is not one this reader decodes ({', '.join(FORMATS)})")
    groups = qcfg.get("config_groups")
    if groups is None:
        groups = {}
    if not isinstance(groups, dict):
        bad("config_groups is not an object")
    ignore = qcfg.get("ignore") or []
    if not isinstance(ignore, list) or not all(isinstance(t, str) for t in ignore):
        bad("ignore is not a list of layer names")
    out = []
    for key, g in groups.items():
        name = f"config_groups.{str(key)[:40]}"
        if not isinstance(g, dict):
            bad(f"{name} is not an object")
        targets = g.get("targets") or []
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            bad(f"{name}.targets is not a list of layer names")
        gfmt = g.get("format")
        if gfmt is not None and gfmt not in FORMATS:
            bad(f"{name}.format {_short(gfmt)} is not one this reader decodes")
        w = g.get("weights")
        if w is None:
            continue
        if not isinstance(w, dict):
            bad(f"{name}.weights is not an object")
        out.append((targets, _check_args(w, f"{name}.weights", bad, gfmt or fmt)))
    return out


def _check_args(w: dict, name: str, bad, fmt) -> dict:
    bits, kind = w.get("num_bits", 8), w.get("type", "int")
    if not _int(bits) or not 1 <= bits <= 8:
        bad(f"{name}.num_bits {_short(bits)} is not an integer in 1..8")
    if kind not in ("int", "float"):
        bad(f"{name}.type {_short(kind)} is not 'int' or 'float'")
    if kind == "float" and bits not in (4, 8):
        bad(f"{name}: type float with num_bits {bits} (float weights are 4 or 8 bits)")
    sym = w.get("symmetric", True)
    if not isinstance(sym, bool):
        bad(f"{name}.symmetric {_short(sym)} is not true or false")
    gs = w.get("group_size")
    if gs is not None and not (_int(gs) and 0 < gs <= MAX_DIM):
        bad(f"{name}.group_size {_short(gs)} is not a positive integer")
    strategy = w.get("strategy")
    if strategy is None:
        strategy = "group" if gs is not None else "tensor"
    if strategy not in STRATEGIES:
        bad(f"{name}.strategy {_short(strategy)} is not one of {', '.join(STRATEGIES)}")
    if strategy in ("group", "tensor_group") and gs is None:
        bad(f"{name}: strategy {strategy} without a group_size")
    bs = w.get("block_structure")
    if strategy == "block":
        bs = [128, 128] if bs is None else bs
        if not (isinstance(bs, list) and len(bs) == 2 and all(_int(b) and 0 < b <= MAX_DIM
                                                              for b in bs)):
            bad(f"{name}.block_structure {_short(bs)} is not two positive integers")
    return {"num_bits": bits, "type": kind, "symmetric": sym, "strategy": strategy,
            "group_size": gs, "block_structure": bs, "format": fmt}


def args_for(layer: str, groups, path=None) -> dict | None:
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


def scheme_label(args: dict) -> str:
    bits, strat = args["num_bits"], args["strategy"]
    if args["type"] == "float":
        return f"fp{bits}-e4m3" if bits == 8 else f"fp{bits}"
    gran = f"g{args['group_size']}" if strat == "group" else strat
    return f"int{bits}-{gran}" + ("" if args["symmetric"] else "-asym")


class _Layer:
    """One quantized layer's tensors, checked against its args."""

    def __init__(self, base, layer: str, head: str, args: dict | None, path):
        self.base, self.layer, self.path = base, layer, str(path)
        self.head = head
        self.args = args

    def fail(self, msg: str, tensor: str | None = None):
        tensor = tensor or self.head
        info = self.base.tensors.get(tensor)      # the file that holds it (a shard)
        raise WorkbenchError(msg, path=info.file if info is not None and info.file
                             else self.path, tensor=tensor)

    def info(self, suffix: str):
        name = f"{self.layer}.{suffix}"
        return self.base.tensors.get(name)

    def need(self, suffix: str, dtypes, what: str):
        info = self.info(suffix)
        if info is None:
            self.fail(f"quantized weight without its {suffix} ({what})")
        if info.dtype not in dtypes:
            self.fail(f"{suffix} is {info.dtype}, expected {' or '.join(dtypes)}",
                      tensor=info.name)
        return info

    def want(self, kind: str, bits: int | None, strategies=None) -> dict:
        a = self.args
        if a is None:
            self.fail(f"no quantization_config group targets layer {self.layer[:120]}")
        if a["type"] != kind or (bits is not None and a["num_bits"] != bits):
            self.fail(f"the data is {kind}{bits or ''} but the config group says "
                      f"{a['type']} num_bits {a['num_bits']}")
        if kind == "float" and not a["symmetric"]:
            self.fail("the config group says symmetric: false, but float weights are "
                      "symmetric (no zero point)")
        if strategies is not None and a["strategy"] not in strategies:
            self.fail(f"the data is scaled per group, but the config group's strategy is "
                      f"{a['strategy']} (expected {' or '.join(strategies)})")
        return a

    def scale_shape(self, rows: int, cols: int, a: dict) -> tuple:
        """The weight_scale shape the strategy implies, and the group size along cols."""
        s = a["strategy"]
        if s == "tensor":
            return (1, 1), cols
        if s == "channel":
            return (rows, 1), cols
        if s == "group":
            return (rows, -(-cols // a["group_size"])), a["group_size"]
        if s == "block" and a["type"] == "float":
            bh, bw = a["block_structure"]
            return (-(-rows // bh), -(-cols // bw)), None
        self.fail(f"strategy {s} is not supported for {a['type']}{a['num_bits']} weights")

    def check_scale(self, rows: int, cols: int, a: dict):
        info = self.need("weight_scale", FLOATS, "every quantized layer has one")
        want, gs = self.scale_shape(rows, cols, a)
        got = tuple(info.shape)
        if got == want or (0 in (rows, cols) and len(got) == 2 and info.numel == 0):
            # an empty weight's scales as the exporter writes them: [0, 0] / [rows, 0]
            return info, got, gs
        if (want == (1, 1) and info.numel == 1) or (a["strategy"] == "channel"
                                                    and got == (rows,)):
            return info, want, gs
        self.fail(f"weight_scale shape {list(got)} does not fit strategy {a['strategy']} of "
                  f"a {rows}x{cols} weight (expected {list(want)})", tensor=info.name)


def check_layers(base, qcfg, folder: Path, path) -> tuple[dict, set]:
    """(layer weight name -> its decode part, the tensor names the parts hold); a companion
    no layer claims is refused too (it would be listed as a tensor of its own)."""
    cfg_path = folder / "config.json"
    groups = check_config(qcfg, cfg_path)
    fmt = qcfg.get("format")
    parts: dict[str, dict] = {}
    claimed: set[str] = set()
    for name, info in base.tensors.items():
        if name.endswith(PACKED):
            layer = name[:-len(PACKED)]
        elif name.endswith(".weight") and (info.dtype.startswith("F8")
                                           or f"{name}_scale" in base.tensors):
            layer = name[:-len(".weight")]
        else:
            continue
        lay = _Layer(base, layer, name, args_for(layer, groups, cfg_path), path)
        if name.endswith(PACKED) and info.dtype == "U8":
            part = _fp4(lay, info)
        elif name.endswith(PACKED):
            part = _packed_int(lay, info)
        else:
            part = _fp8(lay, info)
        if lay.info("weight_g_idx") is not None:   # activation order: not decoded here
            lay.fail("weight_g_idx (activation-order groups) is not read: the weight would "
                     "decode with the wrong groups", tensor=f"{layer}.weight_g_idx")
        gfmt = lay.args.get("format") or fmt
        if gfmt not in (None, "mixed-precision") and gfmt != part["format"]:
            lay.fail(f"the data is {part['format']} but the config says format {gfmt}")
        parts[f"{layer}.weight"] = part
        claimed.update(part["members"])
    for name in base.tensors:
        if name in claimed:
            continue
        for c in COMPANIONS:
            if name.endswith("." + c):
                raise WorkbenchError(f"{c} without its quantized weight (no "
                                     f"{name[:-len(c)]}weight_packed or float8 weight)",
                                     path=base.tensors[name].file or str(path), tensor=name)
    return parts, claimed


def _packed_int(lay: _Layer, info) -> dict:
    if info.dtype != "I32" or len(info.shape) != 2:
        lay.fail(f"weight_packed is {info.dtype} {list(info.shape)}: expected 2-D int32 "
                 "(pack-quantized) or uint8 (nvfp4 / mxfp4)")
    a = lay.want("int", None)
    bits = a["num_bits"]
    rows, words = (int(v) for v in info.shape)
    sh = lay.need("weight_shape", ("I64", "I32"), "the unpacked [rows, cols]")
    if tuple(sh.shape) != (2,):
        lay.fail(f"weight_shape has shape {list(sh.shape)}, expected [2]", tensor=sh.name)
    import numpy as np
    shape = tuple(int(v) for v in np.asarray(lay.base.raw(sh.name)).reshape(-1))
    r, c = shape
    if r != rows or c < 0 or -(-c * bits // 32) != words or (c == 0) != (words == 0):
        lay.fail(f"weight_shape {list(shape)} does not match the packed data: {rows} rows of "
                 f"{words} int32 words hold {words * 32 // bits if bits else 0} or fewer "
                 f"{bits}-bit values a row (num_bits {bits})")
    sc, sshape, gs = lay.check_scale(r, c, a)
    zp = lay.info("weight_zero_point")
    if a["symmetric"] and zp is not None:
        lay.fail("weight_zero_point beside symmetric: true", tensor=zp.name)
    if not a["symmetric"]:
        zp = lay.need("weight_zero_point", ("I32",), "symmetric: false")
        want = (-(-sshape[0] * bits // 32), sshape[1])
        if tuple(zp.shape) != want:
            lay.fail(f"weight_zero_point shape {list(zp.shape)} does not fit {bits}-bit zero "
                     f"points of a {list(sshape)} scale packed along dim 0 (expected "
                     f"{list(want)})", tensor=zp.name)
    return {"format": "pack-quantized", "shape": shape, "label": scheme_label(a),
            "packed": info.name, "scale": sc.name, "zp": None if zp is None else zp.name,
            "bits": bits, "groups": sshape, "group_size": gs,
            "members": [info.name, sc.name, sh.name] + ([zp.name] if zp is not None else [])}


def _fp8(lay: _Layer, info) -> dict:
    if info.dtype != "F8_E4M3":
        where = "beside a weight_scale" if lay.info("weight_scale") else "without a weight_scale"
        lay.fail(f"a {info.dtype} weight {where}: only float8_e4m3fn weights "
                 "(float-quantized) or weight_packed carry one")
    if len(info.shape) != 2:
        lay.fail(f"float8 weight of shape {list(info.shape)}: only 2-D weights are read")
    a = lay.want("float", 8)
    rows, cols = (int(v) for v in info.shape)
    sc, sshape, gs = lay.check_scale(rows, cols, a)
    if lay.info("weight_zero_point") is not None:
        lay.fail("weight_zero_point beside a float8 weight (float weights are symmetric)",
                 tensor=f"{lay.layer}.weight_zero_point")
    part = {"format": "float-quantized", "shape": (rows, cols), "label": scheme_label(a),
            "fp8": info.name, "scale": sc.name, "groups": sshape, "group_size": gs,
            "block": tuple(a["block_structure"]) if a["strategy"] == "block" else None,
            "members": [info.name, sc.name]}
    return part


def _fp4(lay: _Layer, info) -> dict:
    """An NVFP4 (float8 scales per 16, a global scale) or MXFP4 (E8M0 scales per 32) layer."""
    if len(info.shape) != 2:
        lay.fail(f"uint8 weight_packed of shape {list(info.shape)}: expected 2-D")
    scale = lay.need("weight_scale", ("F8_E4M3", "U8"), "float8 (nvfp4) or uint8 (mxfp4)")
    nv = scale.dtype == "F8_E4M3"
    a = lay.want("float", 4, ("tensor_group",) if nv else ("group",))
    group = 16 if nv else 32
    if a["group_size"] != group:
        lay.fail(f"{'nvfp4' if nv else 'mxfp4'} scales ({scale.dtype}) are per {group} values, "
                 f"but the config's group_size is {a['group_size']}")
    rows, cols = int(info.shape[0]), 2 * int(info.shape[1])
    if tuple(scale.shape) != (rows, cols // group) or cols % group:
        lay.fail(f"weight_scale shape {list(scale.shape)} does not fit groups of {group} of a "
                 f"{rows}x{cols} weight", tensor=scale.name)
    members = [info.name, scale.name]
    sh = lay.info("weight_shape")
    if sh is not None:
        import numpy as np
        if sh.dtype not in ("I64", "I32") or tuple(sh.shape) != (2,) or tuple(
                int(v) for v in np.asarray(lay.base.raw(sh.name)).reshape(-1)) != (rows, cols):
            lay.fail(f"weight_shape ({sh.dtype} {list(sh.shape)}) is not [{rows}, {cols}], "
                     "the packed data's", tensor=sh.name)
        members.append(sh.name)
    if lay.info("weight_zero_point") is not None:
        lay.fail("weight_zero_point beside an FP4 weight (symmetric)",
                 tensor=f"{lay.layer}.weight_zero_point")
    g = lay.info("weight_global_scale")
    if nv:
        g = lay.need("weight_global_scale", FLOATS, "nvfp4 needs one")
        if g.numel != 1:
            lay.fail(f"weight_global_scale has {g.numel} elements, expected 1", tensor=g.name)
        members.append(g.name)
    elif g is not None:
        lay.fail("weight_global_scale beside mxfp4 (uint8) scales", tensor=g.name)
    return {"format": "nvfp4-pack-quantized" if nv else "mxfp4-pack-quantized",
            "shape": (rows, cols), "label": "nvfp4-g16" if nv else "mxfp4-g32",
            "fp4": info.name, "scale": scale.name, "global": g.name if nv else None,
            "group": group, "members": members}

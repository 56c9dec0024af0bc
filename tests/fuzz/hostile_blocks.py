"""What the fuzz worker does with issue 47's block-format kinds (tests/fuzz/cases_blocks.py).

A case builds one folder: a quantized layer packed as the format's own tools pack it (torch,
compressed-tensors' pack_to_int32), its float reference computed in torch, then one mutation.
Each mutation says what must happen: "valid" (opens; every tensor equals its reference exactly;
statistics count every value; `inspect` exit 0), "refuse" (a one-line WorkbenchError naming
the file and the tensor, or config.json; `inspect` exit 2 with the same line) or "either" (a
header still consistent with the data, e.g. a weight_shape a few columns short that the
packed words still hold: a clean end either way). Anything else is a Finding.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np

from workbench.core.errors import WorkbenchError


def _preload() -> None:
    """compressed-tensors' packer takes seconds to import: paid when the worker starts (it
    imports this module before its memory limit and outside the budget), not by a case."""
    try:
        import compressed_tensors.compressors.pack_quantized.helpers  # noqa: F401
        import safetensors.torch  # noqa: F401
    except ImportError:
        pass


_preload()

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
S, Z, SH, G = "l.weight_scale", "l.weight_zero_point", "l.weight_shape", "l.weight_global_scale"


def _finding(msg: str):
    from .hostile import Finding
    return Finding(msg)


def _save(folder: Path, tensors: dict, qcfg: dict) -> Path:
    from safetensors.torch import save_file
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"model_type": "test",
                                                    "quantization_config": qcfg}))
    return folder


def _outcome(folder: Path, refs: dict, expect: str, what: str) -> None:
    import workbench as qw
    from workbench.formats.loaders import open_model

    from .hostile import cli
    rc, err = cli(["inspect", folder])
    try:
        m = open_model(folder)
        got = {n: m.read(n) for n in m.tensors}
        stats = qw.statistics(m)
    except WorkbenchError as exc:
        if expect == "valid":
            raise _finding(f"{what}: a well-formed folder refused: {exc}") from None
        named = exc.tensor is not None or str(exc.path).endswith("config.json")
        if str(folder) not in str(exc) or not named:
            raise _finding(f"{what}: the error names neither file and tensor nor config.json: "
                           f"{exc}") from None
        lines = err.strip().splitlines()
        if rc != 2 or len(lines) != 1 or str(folder) not in lines[0]:
            raise _finding(f"{what}: the API refuses, inspect ends {rc}: {err[-300:]}") from None
        raise
    if rc != 0:
        raise _finding(f"{what}: opens in the API, inspect ends {rc}: {err[-300:]}")
    if expect == "refuse":
        raise _finding(f"{what}: a header that contradicts its tensors read without a word "
                       f"(tensors {sorted(got)[:4]})")
    if expect == "either":
        return
    for name, want in refs.items():
        have = got.get(name)
        if have is None or have.shape != want.shape or not np.array_equal(have, want):
            raise _finding(f"{what}: {name} decodes wrong (shape "
                           f"{None if have is None else have.shape}, want {want.shape})")
        if stats[name].count != want.size:
            raise _finding(f"{what}: statistics of {name} count {stats[name].count} values, "
                           f"not {want.size}")


# ---- compressed-tensors ---------------------------------------------------------------------
def _layout(strategy, gs, bs, rows, cols, kind):
    """The weight_scale shape a (defaulted) strategy implies, None where it is invalid."""
    if strategy is None:
        strategy = "group" if gs is not None else "tensor"
    if gs is not None and not (type(gs) is int and gs > 0):
        return None
    if strategy == "tensor":
        return (1,)
    if strategy == "channel":
        return (rows, 1)
    if strategy == "group" and gs:
        return (rows, -(-cols // gs))
    if strategy == "block" and kind == "fp8":
        if not (isinstance(bs, list) and len(bs) == 2 and all(type(b) is int and b > 0
                                                              for b in bs)):
            return None
        return (-(-rows // bs[0]), -(-cols // bs[1]))
    return None


def _same(a, b) -> bool:
    """Two scale layouts that read the same (one element either way, or equal shapes)."""
    if a is None or b is None:
        return False
    return tuple(a) == tuple(b) or (np.prod(a) == 1 and np.prod(b) == 1)


def _ct_build(spec):
    import torch
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    g = torch.Generator().manual_seed(spec["seed"])
    pick = random.Random(spec["pick"])
    kind, rows, cols, gs = spec["kind"], spec["rows"], spec["cols"], spec["gs"]
    sdt = pick.choice([torch.float32, torch.float32, torch.float16, torch.bfloat16])
    t, meta = {}, {"kind": kind, "rows": rows, "cols": cols}
    if kind == "int":
        bits = spec["bits"]
        strategy = spec["strategy"] if spec["strategy"] != "block" else "group"
        asym = spec["asym"] and strategy != "tensor"
        half = 1 << (bits - 1)
        q = torch.randint(-half, half, (rows, cols), generator=g, dtype=torch.int8)
        shape = {"group": (rows, cols // gs), "channel": (rows, 1), "tensor": (1,)}[strategy]
        scale = (torch.rand(shape, generator=g) + 0.01).to(sdt)
        s2 = scale.float().reshape(1 if strategy == "tensor" else rows, -1)
        step = gs if strategy == "group" else cols
        idx = torch.arange(cols) // step
        zp = torch.randint(-half, half, s2.shape, generator=g, dtype=torch.int8)
        want = (q.float() - (zp.float()[:, idx] if asym else 0)) * s2[:, idx]
        t = {"l.weight_packed": pack_to_int32(q, bits), S: scale,
             SH: torch.tensor([rows, cols], dtype=torch.int64)}
        if asym:
            t[Z] = pack_to_int32(zp, bits, packed_dim=0)
        args = {"num_bits": bits, "type": "int", "symmetric": not asym, "strategy": strategy}
        if strategy == "group":
            args["group_size"] = gs
        fmt, head = "pack-quantized", "l.weight_packed"
        meta.update(bits=bits, words=cols * bits // 32, strategy=strategy, gs=args.get(
            "group_size"), scale=tuple(shape), bs=None)
    elif kind == "fp8":
        strategy = spec["strategy"]
        w = (torch.randn(rows, cols, generator=g) * 40).to(torch.float8_e4m3fn)
        bs = pick.choice([[128, 128], [64, 64], [64, 128]])
        shape = _layout(strategy, gs if strategy == "group" else None, bs, rows, cols, "fp8")
        scale = (torch.rand(shape, generator=g) + 0.01).to(sdt)
        sf = scale.float()
        if strategy == "block":
            full = sf.repeat_interleave(bs[0], 0)[:rows].repeat_interleave(bs[1], 1)[:, :cols]
        elif strategy == "group":
            full = sf[:, torch.arange(cols) // gs]
        else:
            full = sf.reshape(-1, 1)
        want = w.float() * full
        t = {"l.weight": w, S: scale}
        args = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": strategy}
        if strategy == "group":
            args["group_size"] = gs
        if strategy == "block":
            args["block_structure"] = bs
        fmt, head = "float-quantized", "l.weight"
        meta.update(strategy=strategy, gs=args.get("group_size"), scale=tuple(shape), bs=bs)
    else:
        nv = kind == "nvfp4"
        group = 16 if nv else 32
        packed = torch.randint(0, 256, (rows, cols // 2), generator=g, dtype=torch.uint8)
        lut = torch.tensor(E2M1)
        vals = torch.stack([lut[(packed & 15).long()], lut[(packed >> 4).long()]], -1)
        vals = vals.reshape(rows, cols)
        idx = torch.arange(cols) // group
        if nv:
            sc = (torch.rand(rows, cols // group, generator=g) * 4 + 0.05).to(torch.float8_e4m3fn)
            gsc = torch.tensor([pick.choice([1.0, 3.0, 0.7])], dtype=torch.float32)
            want = vals * (sc.float() / gsc)[:, idx]
            t = {"l.weight_packed": packed, S: sc, G: gsc}
        else:
            sc = torch.randint(118, 136, (rows, cols // group), generator=g, dtype=torch.uint8)
            want = torch.ldexp(vals, (sc.int() - 127)[:, idx].float())
            t = {"l.weight_packed": packed, S: sc}
        args = {"num_bits": 4, "type": "float", "symmetric": True,
                "strategy": "tensor_group" if nv else "group", "group_size": group}
        fmt, head = ("nvfp4" if nv else "mxfp4") + "-pack-quantized", "l.weight_packed"
        meta.update(strategy=args["strategy"], gs=group, scale=(rows, cols // group), bs=None)
    meta.update(fmt=fmt, head=head)
    return t, args, fmt, {"l.weight": want.numpy()}, meta, pick


def _ct_mutate(mut, t, args, qcfg, refs, meta, pick):
    """Applies `mut`; returns what must happen ("valid", "refuse" or "either")."""
    import torch
    kind, rows, cols = meta["kind"], meta["rows"], meta["cols"]
    group = qcfg["config_groups"]["group_0"]
    if mut == "none":
        return "valid"
    if mut == "benign-extra":
        t["extra.weight"] = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        t["l.input_scale"] = torch.tensor([0.5])
        refs["extra.weight"] = t["extra.weight"].numpy()
        return "valid"
    if mut == "benign-format":
        qcfg["format"] = "mixed-precision"
        group["format"] = meta["fmt"]
        return "valid"
    if mut == "benign-targets":
        group["targets"] = [pick.choice(["re:.*", "l", "re:^l$", "Linear"])]
        qcfg["config_groups"]["group_1"] = {"targets": ["zzz"], "weights": dict(args)}
        return "valid"
    if mut == "benign-keys":
        args.update(dynamic=False, observer="minmax", actorder=None)
        qcfg.update(quantization_status="compressed", version="0.9", ignore=["lm_head"])
        return "valid"
    if mut.startswith("drop-"):
        name = {"drop-scale": S, "drop-zp": Z, "drop-shape": SH, "drop-global": G}[mut]
        return "refuse" if t.pop(name, None) is not None else "valid"
    if mut == "scale-dtype":
        s = t[S]
        if s.dtype == torch.uint8:
            t[S] = s.view(torch.int8)
        elif s.dtype == torch.float8_e4m3fn:
            t[S] = s.float()
        else:
            dt = pick.choice([torch.bool, torch.int64, torch.int32, torch.int8, torch.float64])
            t[S] = (s.float() != 0) if dt is torch.bool else s.float().to(dt)
        return "refuse"
    if mut == "scale-shape":
        s = t[S]
        s2 = s.reshape(s.shape[0], -1)
        op = pick.choice(["cut", "row", "col"])
        if op == "cut" and s2.shape[1] > 1:
            t[S] = s2[:, :-1].clone()
        elif op == "row" or s2.shape[1] <= 1:
            t[S] = torch.cat([s2, s2[:1]], 0)
        else:
            t[S] = torch.cat([s2, s2[:, :1]], 1)
        return "refuse"
    if mut in ("zp-dtype", "zp-shape"):
        if Z in t and mut == "zp-dtype":
            t[Z] = t[Z].to(pick.choice([torch.int8, torch.float32, torch.int64]))
        elif Z in t:
            t[Z] = torch.cat([t[Z], t[Z][:1]], 0)
        else:
            t[Z] = torch.zeros(1, 1, dtype=torch.int32)
        return "refuse"
    if mut.startswith("shape-"):
        if kind != "int" or mut == "shape-huge":
            t[SH] = pick.choice([torch.tensor([2**31, 2**31]), torch.tensor([2**40, 3]),
                                 torch.tensor([rows, cols + 2])])
            return "refuse"
        if mut == "shape-dtype":
            t[SH] = t[SH].float()
            return "refuse"
        if mut == "shape-rank":
            t[SH] = pick.choice([torch.tensor([rows, cols, 1]), torch.tensor([rows * cols])])
            return "refuse"
        r, c = pick.choice([(rows, cols - 8), (rows, cols + 32), (rows + 1, cols),
                            (cols, rows), (rows, -cols)])
        t[SH] = torch.tensor([r, c])
        bits, words = meta["bits"], meta["words"]
        if r != rows or c < 0 or -(-c * bits // 32) != words:
            return "refuse"
        if not _same(_layout(meta["strategy"], meta["gs"], None, r, c, kind),
                     _layout(meta["strategy"], meta["gs"], None, rows, cols, kind)):
            return "refuse"
        return "either"
    if mut == "packed-dtype":
        if kind == "fp8":
            t["l.weight"] = t["l.weight"].float()
        elif kind == "int":
            t["l.weight_packed"] = t["l.weight_packed"].to(pick.choice(
                [torch.int64, torch.int16, torch.float32]))
        else:
            t["l.weight_packed"] = t["l.weight_packed"].view(torch.int8)
        return "refuse"
    if mut == "packed-cut":
        head = meta["head"]
        t[head] = t[head][:, :-1].clone()
        return "either" if kind == "fp8" else "refuse"
    if mut == "weight-dtype":
        if kind == "fp8":
            w = t["l.weight"]
            t["l.weight"] = pick.choice([w.float(), w.to(torch.float16), w.to(torch.bfloat16),
                                         w.view(torch.int8), w.view(torch.float8_e5m2)])
        else:
            t["l.weight"] = torch.ones(rows, cols)
        return "refuse"
    if mut == "num_bits":
        old = args["num_bits"]
        args["num_bits"] = pick.choice([v for v in (old - 1, old + 1, 0, 9, 16, "4", True, 4.0)
                                        if v != old or type(v) is not int])
        return "refuse"
    if mut == "group_size":
        new = pick.choice([meta["gs"] * 2 if meta["gs"] else 64, (meta["gs"] or 64) // 2, 0,
                           -1, True, "16", None, 64])
        args["group_size"] = new
        if new is None:
            args.pop("group_size")
        if new is not None and not (type(new) is int and new > 0):
            return "refuse"
        if kind in ("nvfp4", "mxfp4"):
            return "refuse" if new != meta["gs"] else "valid"
        strat = args.get("strategy")
        return "valid" if _same(_layout(strat, args.get("group_size"), meta["bs"], rows, cols,
                                        kind), meta["scale"]) else "refuse"
    if mut == "strategy":
        new = pick.choice(["group", "channel", "tensor", "block", "tensor_group", "rows", None,
                           5])
        if new is None:
            args.pop("strategy")
        else:
            args["strategy"] = new
        if kind in ("nvfp4", "mxfp4"):
            eff = new if new is not None else "group"
            return "valid" if eff == meta["strategy"] else "refuse"
        if new == "tensor_group" or new not in (None, *STRATEGIES):
            return "refuse"
        if new == "block" and kind == "int":
            return "refuse"
        return "valid" if _same(_layout(new, args.get("group_size"), args.get(
            "block_structure", [128, 128]), rows, cols, kind), meta["scale"]) else "refuse"
    if mut == "symmetric":
        new = pick.choice([not args["symmetric"], "no", 1])
        args["symmetric"] = new
        return "refuse"
    if mut == "type":
        args["type"] = pick.choice(["int" if args["type"] == "float" else "float", "posit", 4])
        return "refuse"
    if mut == "format":
        qcfg["format"] = pick.choice([f for f in ("pack-quantized", "float-quantized",
                                                  "nvfp4-pack-quantized", "mxfp4-pack-quantized",
                                                  "naive-quantized", "marlin-24", 7, "dense")
                                      if f != meta["fmt"]])
        group.pop("format", None)
        return "refuse"
    if mut == "block_structure":
        new = pick.choice([[64, 128], [128, 64], [256, 256], [0, 128], [128], "x", [True, 128]])
        args["block_structure"] = new
        if meta["strategy"] != "block":
            return "valid"
        return "valid" if _same(_layout("block", None, new, rows, cols, kind),
                                meta["scale"]) else "refuse"
    if mut == "targets-none":
        group["targets"] = ["zzz"]
        qcfg["config_groups"]["group_1"] = {"targets": ["yyy"], "weights": dict(args)}
        return "refuse"
    if mut == "orphan":
        t[pick.choice(["o.weight_scale", "o.weight_zero_point", "o.weight_shape",
                       "o.weight_global_scale"])] = torch.ones(2, 2)
        return "refuse"
    if mut == "groups-type":
        qcfg["config_groups"] = pick.choice(["x", [], 5, {"g": 5}, {},
                                             {"g": {"targets": "l", "weights": args}},
                                             {"g": {"targets": ["l"], "weights": [1]}}])
        return "refuse"
    if mut == "g-idx":      # activation-order groups: never decoded as if absent
        t["l.weight_g_idx"] = torch.arange(cols, dtype=torch.int32) % 2
        return "refuse"
    raise AssertionError(mut)


STRATEGIES = ("tensor", "channel", "group", "block", "tensor_group")


def exercise_ct(path: str) -> None:
    spec = json.loads(Path(path).read_text())
    t, args, fmt, refs, meta, pick = _ct_build(spec)
    qcfg = {"quant_method": "compressed-tensors", "format": fmt,
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": args}}}
    expect = _ct_mutate(spec["mutation"], t, args, qcfg, refs, meta, pick)
    folder = _save(Path(path).parent / "m", t, qcfg)
    _outcome(folder, refs, expect, f"{spec['kind']} {meta['strategy']} {spec['mutation']}")


# ---- DeepSeek FP8 ---------------------------------------------------------------------------
W, SI = "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.up_proj.weight_scale_inv"


def exercise_fp8(path: str) -> None:
    import torch
    spec = json.loads(Path(path).read_text())
    g = torch.Generator().manual_seed(spec["seed"])
    pick = random.Random(spec["pick"])
    rows, cols, bs, mut = spec["rows"], spec["cols"], spec["block"], spec["mutation"]
    w = (torch.randn(rows, cols, generator=g) * 40).to(torch.float8_e4m3fn)
    shape = (-(-rows // bs[0]), -(-cols // bs[1]))
    s = (torch.rand(shape, generator=g) + 0.01).to(pick.choice([torch.float32, torch.bfloat16]))
    full = s.float().repeat_interleave(bs[0], 0)[:rows].repeat_interleave(bs[1], 1)[:, :cols]
    norm = torch.randn(cols, generator=g).bfloat16()
    t = {W: w, SI: s, "model.norm.weight": norm}
    refs = {W: (w.float() * full).numpy(), "model.norm.weight": norm.float().numpy()}
    q = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
         "weight_block_size": bs}
    expect = "refuse"
    if mut in ("none", "benign-extra"):
        expect = "valid"
        if mut == "benign-extra":
            t["lm_head.weight"] = torch.ones(3, cols, dtype=torch.bfloat16)
            refs["lm_head.weight"] = np.ones((3, cols), np.float32)
    elif mut == "drop-scale":
        del t[SI]
    elif mut == "orphan":
        t["model.layers.0.mlp.gate_proj.weight_scale_inv"] = torch.ones(1, 1)
    elif mut == "scale-dtype":
        dt = pick.choice([torch.int64, torch.bool, torch.float64, torch.int32])
        t[SI] = (s.float() != 0) if dt is torch.bool else s.float().to(dt)
    elif mut == "scale-shape":
        t[SI] = torch.cat([s, s[:1]], 0) if pick.random() < 0.5 else torch.cat([s, s[:, :1]], 1)
    elif mut == "weight-dtype":
        t[W] = pick.choice([w.float(), w.to(torch.bfloat16), w.view(torch.float8_e5m2),
                            w.view(torch.int8)])
    elif mut == "block-size":
        new = pick.choice([b for b in ([128, 128], [64, 64], [128, 64], [256, 256]) if b != bs])
        q["weight_block_size"] = new
        expect = "valid" if (-(-rows // new[0]), -(-cols // new[1])) == shape else "refuse"
    elif mut == "block-bad":
        q["weight_block_size"] = pick.choice([[0, 128], [128], "x", [True, 128],
                                              [128, 2**21], [-1, 5], None, 128])
    elif mut == "fmt":
        q["fmt"] = pick.choice(["e5m2", 5, "E4M3"])
    elif mut == "unscaled-f8":
        t["model.layers.0.mlp.down_proj.weight"] = w.clone()
    folder = _save(Path(path).parent / "m", t, q)
    _outcome(folder, refs, expect, f"deepseek fp8 {rows}x{cols} {bs} {mut}")


# ---- gpt-oss MXFP4 --------------------------------------------------------------------------
def _mx_ref(blocks, scales):
    import torch
    lut = torch.tensor(E2M1)
    v = torch.stack([lut[(blocks & 15).long()], lut[(blocks >> 4).long()]], -1)
    v = v.reshape(*blocks.shape[:-1], 32)
    v = torch.ldexp(v, (scales.int() - 127)[..., None].float())
    v = v.reshape(*blocks.shape[:-2], -1)
    return (v.transpose(1, 2) if v.ndim == 3 else v).contiguous().numpy()


def exercise_mxfp4(path: str) -> None:
    import torch
    spec = json.loads(Path(path).read_text())
    g = torch.Generator().manual_seed(spec["seed"])
    pick = random.Random(spec["pick"])
    e, rows, groups, mut = spec["experts"], spec["rows"], spec["groups"], spec["mutation"]
    prefix = (e, rows) if e else (rows,)
    stem = "model.layers.0.mlp.experts.gate_up_proj" if e else "model.layers.0.x.w"
    b = torch.randint(0, 256, (*prefix, groups, 16), generator=g, dtype=torch.uint8)
    s = torch.randint(100, 150, (*prefix, groups), generator=g, dtype=torch.uint8)
    router = torch.randn(max(e, 1), 32, generator=g).bfloat16()
    t = {f"{stem}_blocks": b, f"{stem}_scales": s, "model.layers.0.mlp.router.weight": router}
    refs = {stem: _mx_ref(b, s), "model.layers.0.mlp.router.weight": router.float().numpy()}
    expect = "refuse"
    if mut in ("none", "benign-extra"):
        expect = "valid"
        if mut == "benign-extra":
            t[f"{stem}_bias"] = torch.ones(*prefix)
    elif mut == "drop-scales":
        del t[f"{stem}_scales"]
    elif mut == "drop-blocks":
        del t[f"{stem}_blocks"]
    elif mut == "blocks-last":
        t[f"{stem}_blocks"] = b[..., :15].clone() if pick.random() < 0.5 else torch.cat([b, b], -1)
    elif mut == "scales-shape":
        t[f"{stem}_scales"] = torch.cat([s, s[..., :1]], -1)
    elif mut == "blocks-dtype":
        t[f"{stem}_blocks"] = pick.choice([b.view(torch.int8), b.float()])
    elif mut == "scales-dtype":
        t[f"{stem}_scales"] = pick.choice([s.view(torch.int8), s.int(), s.float()])
    elif mut == "rank":
        t[f"{stem}_blocks"] = b.reshape(1, 1, *b.shape)      # 5-D or more
        t[f"{stem}_scales"] = s.reshape(1, 1, *s.shape)
    folder = _save(Path(path).parent / "m", t, {"quant_method": "mxfp4",
                                                "modules_to_not_convert": []})
    _outcome(folder, refs, expect, f"gpt-oss mxfp4 {prefix} x {groups} groups {mut}")


EXERCISES = {"r5-ct": exercise_ct, "r5-fp8": exercise_fp8, "r5-mxfp4": exercise_mxfp4}

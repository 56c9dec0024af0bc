"""mlx-lm folders: a quantized MLX checkpoint opened as its dequantized float32 tensors, exactly
as ``mlx.core.dequantize`` computes them (bit for bit: tests/workbench/formats/test_mlx_format.py).

A folder holds ``config.json`` (the Hugging Face config plus ``"quantization": {"group_size": G,
"bits": B, "mode": M}``, where per-module entries keyed by the module path override it: an
object of its own, ``true`` for the default or ``false`` for "left float") and its safetensors.
A quantized module ``p`` stores

* ``p.weight`` uint32 ``[..., out, in·B/32]``: the codes packed from the least significant bit,
  crossing word boundaries for B = 3, 5, 6;
* ``p.scales`` ``[..., out, in/G]`` and, for affine, ``p.biases`` of the same shape;
* for nvfp4 switch layers, optionally ``p.global_scale`` float32 (one per expert).

Modes (mlx.core.quantize's table): affine B ∈ {1, 2, 3, 4, 5, 6, 8}, G ∈ {32, 64, 128}, scales
and biases in the model's float dtype, ``w = scales · q + biases`` computed in that dtype (the
product rounded to it, then the sum: what mx.dequantize does); mxfp4 (E2M1 codes, E8M0 uint8
scales 2^(s−127), G 32), nvfp4 (E2M1 codes, E4M3 uint8 scales, G 16, ``w = v · (s · (gs /
2688))`` with a global scale), mxfp8 (E4M3 codes, E8M0 scales, G 32). An E8M0 scale of 255 is
2^128 (infinite in float32), as mlx reads it.

Every quantized module is checked against the config (its own entry or the default) before any
tensor is read: a contradiction is a one-line WorkbenchError naming the file and the tensor.
Tensors decode one at a time; one whose float32 values exceed loaders.region.PREAD_LIMIT bytes
is dequantized by row chunks as the passes slice it (:class:`DequantRows`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.formats.model import Model, TensorInfo
# the decoding is the MLX schemes' numpy reference (one implementation of mx.dequantize)
from workbench.schemes.mlx.reference import dequantize

#: mode -> (allowed bits, allowed group sizes, mlx's defaults (group, bits))
MODES = {"affine": ((1, 2, 3, 4, 5, 6, 8), (32, 64, 128), (64, 4)),
         "mxfp4": ((4,), (32,), (32, 4)),
         "nvfp4": ((4,), (16,), (16, 4)),
         "mxfp8": ((8,), (32,), (32, 8))}
FLOAT_SCALES = ("F16", "BF16", "F32")
_ENTRY_KEYS = {"group_size", "bits", "mode", "global_scale"}


def mlx_quantization(path) -> tuple[Path, dict] | None:
    """(config.json's path, its mlx "quantization" object) for an mlx-lm folder (or a file in
    one); None when the folder's config has no quantization of mlx's shape."""
    from workbench.formats.loaders.sidecar import folder_config
    found = folder_config(path)
    if found is None or not isinstance(found[1], dict):
        return None
    cfg, data = found
    for holder in (data, data.get("text_config")):
        if not isinstance(holder, dict):
            continue
        for key in ("quantization", "quantization_config"):
            q = holder.get(key)
            if isinstance(q, dict) and "quant_method" not in q and (
                    "bits" in q or "group_size" in q or "mode" in q):
                return cfg, q
    return None


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _params(entry: dict, cfg: Path, where: str) -> dict:
    """group_size / bits / mode / global_scale of one entry, with mlx's defaults for what it
    leaves out (nn.QuantizedLinear's: those of its mode, not the top-level ones)."""
    extra = sorted(set(entry) - _ENTRY_KEYS)
    if extra:
        raise WorkbenchError(f"quantization entry {where} has key {str(extra[0])[:40]!r} "
                             f"(mlx-lm folders take {', '.join(sorted(_ENTRY_KEYS))})",
                             path=str(cfg))
    mode = entry.get("mode", "affine")
    if not isinstance(mode, str) or mode not in MODES:
        raise WorkbenchError(f"quantization entry {where} has mode {str(mode)[:40]!r} (mlx has "
                             f"{', '.join(MODES)})", path=str(cfg))
    bits_ok, groups_ok, (g0, b0) = MODES[mode]
    group = g0 if entry.get("group_size") is None else entry["group_size"]
    bits = b0 if entry.get("bits") is None else entry["bits"]
    if not _int(bits) or bits not in bits_ok:
        raise WorkbenchError(f"quantization entry {where}: bits {str(bits)[:20]} is not one of "
                             f"{', '.join(map(str, bits_ok))} ({mode})", path=str(cfg))
    if not _int(group) or group not in groups_ok:
        raise WorkbenchError(f"quantization entry {where}: group_size {str(group)[:20]} is not "
                             f"one of {', '.join(map(str, groups_ok))} ({mode})", path=str(cfg))
    gs = entry.get("global_scale", False)
    if not isinstance(gs, bool) or (gs and mode != "nvfp4"):
        raise WorkbenchError(f"quantization entry {where}: global_scale {str(gs)[:20]} "
                             "(only nvfp4 takes one, as true)", path=str(cfg))
    return {"group_size": group, "bits": bits, "mode": mode, "global_scale": gs}


def _module_params(q: dict, cfg: Path) -> tuple[dict, dict]:
    """(the default params, {module path: params or False}) of a quantization object."""
    top = {k: q[k] for k in ("group_size", "bits", "mode") if k in q}
    default = _params(top, cfg, "(the default)")
    per: dict = {}
    for key, value in q.items():
        if key in ("group_size", "bits", "mode"):
            continue
        if value is False:
            per[key] = False
        elif value is True:
            per[key] = default
        elif isinstance(value, dict):
            # nn.quantize hands an entry's dict to to_quantized: its own mode's defaults
            per[key] = _params(value, cfg, str(key)[:80])
        else:
            raise WorkbenchError(f"quantization entry {str(key)[:80]} is "
                                 f"{json.dumps(value, default=str)[:40]}: expected an object, true or false",
                                 path=str(cfg))
    return default, per


def _label(p: dict) -> str:
    if p["mode"] == "affine":
        return f"mlx-affine-b{p['bits']}-g{p['group_size']}"
    return f"mlx-{p['mode']}-g{p['group_size']}"


def _check_module(base: Model, mod: str, p: dict, path: str) -> dict:
    """The stored arrays of quantized module `mod`, checked against params `p`: their names,
    and the float shape of the weight."""
    w, s, b, g = (f"{mod}.weight", f"{mod}.scales", f"{mod}.biases", f"{mod}.global_scale")
    if w not in base.tensors:
        raise WorkbenchError(".scales without its .weight", path=path, tensor=s)
    wi, si = base.tensors[w], base.tensors[s]
    wshape, sshape = tuple(wi.shape), tuple(si.shape)
    bits, group, mode = p["bits"], p["group_size"], p["mode"]
    where = f"{_label(p)} (config.json)"
    if wi.dtype != "U32" or len(wshape) < 2:
        raise WorkbenchError(f"a quantized weight is uint32 of 2+ dimensions, got {wi.dtype} "
                             f"{list(wshape)}", path=wi.file or path, tensor=w)
    want_scale = FLOAT_SCALES if mode == "affine" else ("U8",)
    if si.dtype not in want_scale:
        raise WorkbenchError(f"{where} scales are {'/'.join(want_scale)}, got {si.dtype}",
                             path=si.file or path, tensor=s)
    cols = sshape[-1] * group if sshape else 0
    if (len(sshape) != len(wshape) or sshape[:-1] != wshape[:-1]
            or wshape[-1] * 32 != cols * bits):
        inner = wshape[-1] * 32 // bits
        raise WorkbenchError(f"{where}: weight {list(wshape)} holds {inner} inputs per row but "
                             f"scales {list(sshape)} cover {cols}; expected scales "
                             f"{list(wshape[:-1]) + [inner // group]}", path=si.file or path,
                             tensor=s)
    arrays = {"weight": w, "scales": s}
    if mode == "affine":
        if b not in base.tensors:
            raise WorkbenchError(f"{where} needs .biases beside .scales", path=path, tensor=b)
        bi = base.tensors[b]
        if bi.dtype != si.dtype or tuple(bi.shape) != sshape:
            raise WorkbenchError(f"biases {bi.dtype} {list(bi.shape)} do not match scales "
                                 f"{si.dtype} {list(sshape)}", path=bi.file or path, tensor=b)
        arrays["biases"] = b
    elif b in base.tensors:
        raise WorkbenchError(f"{where} has no biases, but the file has them", path=path,
                             tensor=b)
    if g in base.tensors:
        gi = base.tensors[g]
        if mode != "nvfp4" or gi.dtype != "F32" or math.prod(gi.shape) != math.prod(
                wshape[:-2]) or len(gi.shape) > max(1, len(wshape) - 2):
            raise WorkbenchError(f"global_scale {gi.dtype} {list(gi.shape)}: {where} of weight "
                                 f"{list(wshape)} takes float32 {list(wshape[:-2]) or [1]} "
                                 "(nvfp4 only)", path=gi.file or path, tensor=g)
        arrays["global_scale"] = g
    elif p["global_scale"]:
        raise WorkbenchError(f"config.json gives {mod} a global_scale, but the file has none",
                             path=path, tensor=g)
    arrays["shape"] = (*wshape[:-1], cols)
    return arrays


def _unnamed_module(base: Model, mod: str, default: dict, path: str) -> tuple[dict, dict]:
    """A module config.json does not name: the default params, or (as mlx-lm's
    infer_quant_config does, from the shapes and the scales' dtype) the one setting its arrays
    fit when the default does not; none or several is an error."""
    try:
        return default, _check_module(base, mod, default, path)
    except WorkbenchError as exc:
        first = exc
    fits = []
    for mode, (bits_ok, groups_ok, _) in MODES.items():
        for bits in bits_ok:
            for group in groups_ok:
                p = {"group_size": group, "bits": bits, "mode": mode, "global_scale": False}
                try:
                    fits.append((p, _check_module(base, mod, p, path)))
                except WorkbenchError:
                    pass
    if len(fits) == 1:
        return fits[0]
    if fits:
        raise WorkbenchError(f"the default {_label(default)} does not fit this module and "
                             f"config.json does not name it; its arrays fit "
                             f"{', '.join(_label(p) for p, _ in fits)}", path=path,
                             tensor=f"{mod}.weight")
    raise first


def open_mlx(base: Model, cfg: Path, q: dict) -> Model:
    """`base` (the folder's safetensors, opened) presented as the mlx-lm model it holds."""
    path = base.path
    default, per = _module_params(q, cfg)
    modules: dict[str, dict] = {}
    for name in base.tensors:
        if name.endswith(".scales"):
            mod = name[:-len(".scales")]
            p = per.get(mod, default)
            if p is False:
                raise WorkbenchError("config.json leaves this module float (false), but it is "
                                     "stored quantized", path=str(cfg), tensor=f"{mod}.weight")
            if mod in per:
                modules[mod] = (p, _check_module(base, mod, p, path))
            else:
                modules[mod] = _unnamed_module(base, mod, default, path)
        elif name.endswith((".biases", ".global_scale")):
            mod = name.rsplit(".", 1)[0]
            if f"{mod}.scales" not in base.tensors:
                raise WorkbenchError(f".{name.rsplit('.', 1)[1]} without .scales", path=path,
                                     tensor=name)
    for mod, p in per.items():
        if p is not False and mod not in modules and f"{mod}.weight" in base.tensors:
            raise WorkbenchError(f"config.json quantizes this module ({_label(p)}), but it is "
                                 f"stored {base.tensors[f'{mod}.weight'].dtype} with no .scales",
                                 path=str(cfg), tensor=f"{mod}.weight")
    infos: dict[str, TensorInfo] = {}
    parts: dict[str, tuple[dict, dict]] = {}
    claimed = {a for _, arrays in modules.values() for k, a in arrays.items() if k != "shape"}
    for name, info in base.tensors.items():
        mod = name[:-len(".weight")] if name.endswith(".weight") else None
        if mod in modules:
            p, arrays = modules[mod]
            nbytes = sum(base.tensors[a].nbytes for k, a in arrays.items() if k != "shape")
            infos[name] = TensorInfo(name, arrays["shape"], "F32", nbytes, info.file,
                                     quant=_label(p))
            parts[name] = (p, arrays)
        elif name not in claimed:
            infos[name] = info

    def raw(name: str):
        part = parts.get(name)
        if part is None:
            return base.raw(name)
        from workbench.formats.loaders import region
        rows = DequantRows(base, infos[name], *part)
        if rows.nbytes <= region.PREAD_LIMIT:
            return rows[0:rows.shape[0]]
        return rows

    meta = dict(base.metadata)
    meta["mlx.quantization"] = ", ".join(sorted({_label(p) for p, _ in modules.values()}))
    m = Model(path, "mlx", infos, raw, meta)
    m.folder = str(cfg.parent)
    return m


class DequantRows:
    """A quantized tensor's float32 matrix (rows x cols), dequantized by the rows sliced: the
    stored arrays' rows (base.raw, a loaders.region.Region for a large one) are read for them
    only. ``np.asarray`` of it dequantizes the whole tensor."""

    def __init__(self, base: Model, info: TensorInfo, p: dict, arrays: dict):
        self.base, self.info, self.p, self.arrays = base, info, p, arrays
        self.shape = tuple(info.matrix_shape)
        self.dtype = np.dtype(np.float32)
        wshape = base.tensors[arrays["weight"]].shape
        self.stored_rows = math.prod(wshape[:-1])
        self.per_expert = wshape[-2] if len(wshape) > 2 else self.stored_rows
        self.scale_dtype = base.tensors[arrays["scales"]].dtype
        # stored rows per matrix row (the matrix's rows are whole runs of stored rows)
        self.k = self.stored_rows // self.shape[0] if self.shape[0] else 1

    ndim = 2

    @property
    def size(self) -> int:
        return self.shape[0] * self.shape[1]

    @property
    def nbytes(self) -> int:
        return self.size * 4

    def __len__(self) -> int:
        return self.shape[0]

    def _rows(self, r0: int, r1: int) -> np.ndarray:
        s0, s1 = r0 * self.k, r1 * self.k
        if s1 <= s0 or not self.shape[1]:
            return np.zeros((max(0, r1 - r0), self.shape[1]), np.float32)
        got = {}
        for key in ("weight", "scales", "biases"):
            if key in self.arrays:
                a = self.base.raw(self.arrays[key])
                got[key] = np.asarray(a.reshape(self.stored_rows, -1)[s0:s1])
        if "global_scale" in self.arrays:
            gs = np.asarray(self.base.raw(self.arrays["global_scale"]), np.float32).reshape(-1)
            got["global_scale"] = gs[np.arange(s0, s1) // self.per_expert]
        return dequantize(got, self.p, self.scale_dtype).reshape(r1 - r0, self.shape[1])

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop, step = key.indices(self.shape[0])
            if step == 1:
                return self._rows(start, max(start, stop))
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            i = int(key) % self.shape[0] if -self.shape[0] <= int(key) < self.shape[0] else None
            if i is None:
                raise IndexError(f"index {key} is out of bounds for axis 0 with size "
                                 f"{self.shape[0]}")
            return self._rows(i, i + 1)[0]
        return np.asarray(self)[key]

    def __array__(self, dtype=None, copy=None):
        a = self._rows(0, self.shape[0])
        return a if dtype is None else a.astype(dtype)

    def reshape(self, *shape):
        return np.asarray(self).reshape(*shape)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(np.asarray(self), name)


def quantized_without_config(base: Model) -> str | None:
    """The name of a tensor stored as mlx-lm quantizes (uint32 .weight beside .scales) in a
    checkpoint whose config.json has no mlx quantization object; None when there is none."""
    for name, info in base.tensors.items():
        if name.endswith(".scales"):
            w = base.tensors.get(name[:-len(".scales")] + ".weight")
            if w is not None and w.dtype == "U32":
                return w.name
    return None

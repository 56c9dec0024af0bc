"""What an mlx-lm folder written for a plan holds, tensor by tensor, without quantizing: the
layout both the MLX export (mlx_folder.py) and the size prediction (``layout_bytes``, the
``mlx`` target's file size) read, so the prediction is the written safetensors' size to the
byte.

mlx-lm's conventions (mlx_lm.utils.load_model, the model classes' ``sanitize``):

* names are the Hugging Face checkpoint's, less what ``sanitize`` drops (``rotary_emb.inv_freq``;
  ``lm_head.weight`` when ``tie_word_embeddings``: the quantized or float embedding then serves
  as the head, ``as_linear``);
* a mixture-of-experts layer's experts are stacked per projection into one SwitchLinear,
  ``<moe>.switch_mlp.<proj>`` of shape ``[E, out, in]`` (Mixtral's ``w1``/``w2``/``w3`` as
  ``gate_proj``/``down_proj``/``up_proj``), written already stacked (sanitize stacks float
  experts only);
* a quantized module ``p`` stores ``p.weight`` uint32, ``p.scales`` and (affine) ``p.biases``
  (workbench.schemes.mlx); everything else stays float in the export's dtype: config.json's
  ``torch_dtype`` when it is float16, bfloat16 or float32 (what mlx_lm.convert uses), else the
  dtype most 2-D float weights have;
* config.json's ``"quantization"`` (and ``"quantization_config"``, as mlx-lm writes both): the
  default ``{group_size, bits, mode}`` (the most common scheme's) and one entry per module
  whose scheme differs; modules left float have no entry and no ``.scales`` (nn.quantize's
  predicate then leaves them float).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter

from workbench.quant.mlx_target import export_dtype
from dataclasses import dataclass, field

from workbench.core.errors import WorkbenchError
from workbench.quant.plan import KEEP

ITEMSIZE = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8, "U32": 4, "U8": 1, "I8": 1, "I16": 2,
            "I32": 4, "I64": 8, "U16": 2, "U64": 8, "BOOL": 1}
_EXPERT = re.compile(r"^(?P<pre>.*)\.experts\.(?P<e>\d+)\.(?P<proj>[^.]+)\.weight$")
MIXTRAL_PROJ = {"w1": "gate_proj", "w2": "down_proj", "w3": "up_proj"}
#: safetensors files are split at this size (mlx_lm.utils.save's max_file_size_gb default: 5)
SHARD_BYTES = 5 << 30
METADATA = {"format": "mlx"}


@dataclass
class Module:
    """One written module: its output name, its source tensors (one, or one per expert in
    expert order), the scheme applied (KEEP: float) and the float shape."""
    path: str
    sources: list
    scheme: str
    shape: tuple
    arrays: dict = field(default_factory=dict)     # output tensor name -> (dtype, shape)


def dropped(name: str, config: dict | None) -> bool:
    """A tensor mlx-lm's sanitize drops (not written)."""
    if "rotary_emb.inv_freq" in name:
        return True
    tied = bool((config or {}).get("tie_word_embeddings", False))
    return tied and name in ("lm_head.weight", "language_model.lm_head.weight")


def _stacked_path(m) -> str:
    proj = m.group("proj")
    return f"{m.group('pre')}.switch_mlp.{MIXTRAL_PROJ.get(proj, proj)}"


def modules(model, decisions: dict, config: dict | None) -> list[Module]:
    """The written modules in order (the model's tensor order; a stacked expert projection at
    its first expert's place), each expert group checked to share one scheme."""
    from workbench.schemes import get_scheme
    dtype = export_dtype(model, config)
    out: list[Module] = []
    stacks: dict[str, Module] = {}
    for name in model.tensors:
        if dropped(name, config):
            continue
        d = decisions[name]
        info = model.info(name)
        m = _EXPERT.match(name)
        if m and info.ndim == 2:
            path = _stacked_path(m)
            mod = stacks.get(path)
            if mod is None:
                mod = stacks[path] = Module(path, [], d.applied, tuple(info.shape))
                out.append(mod)
            if d.applied != mod.scheme or tuple(info.shape) != mod.shape:
                raise WorkbenchError(
                    f"MLX stacks the experts of {path} into one SwitchLinear with one scheme; "
                    f"{mod.sources[0]} is {mod.scheme}, {name} is {d.applied}", path=model.path,
                    tensor=name)
            if int(m.group("e")) != len(mod.sources):
                raise WorkbenchError(f"expert {m.group('e')} of {path} out of order "
                                     f"(expected {len(mod.sources)})", path=model.path,
                                     tensor=name)
            mod.sources.append(name)
            continue
        base = name[:-len(".weight")] if name.endswith(".weight") else name
        out.append(Module(base if d.applied != KEEP else name, [name], d.applied,
                          tuple(info.shape)))
    for mod in out:
        lead = (len(mod.sources),) if mod.path in stacks else ()
        shape = lead + mod.shape
        if mod.scheme == KEEP:
            info = model.info(mod.sources[0])
            kind = dtype if info.is_float else info.dtype
            name = mod.path if mod.path not in stacks else f"{mod.path}.weight"
            mod.arrays = {name: (kind, shape)}
            continue
        s = get_scheme(mod.scheme).for_dtype(dtype)
        rows, cols = math.prod(shape[:-1]), shape[-1]
        g = s.group
        mod.arrays = {f"{mod.path}.weight": ("U32", (*shape[:-1], cols * s.bits // 32))}
        if s.mode == "affine":
            mod.arrays[f"{mod.path}.scales"] = (s.scale_dtype, (*shape[:-1], cols // g))
            mod.arrays[f"{mod.path}.biases"] = (s.scale_dtype, (*shape[:-1], cols // g))
        else:
            mod.arrays[f"{mod.path}.scales"] = ("U8", (*shape[:-1], cols // g))
        assert rows * cols * s.bits // 8 + sum(
            math.prod(sh) * ITEMSIZE[dt] for k, (dt, sh) in mod.arrays.items()
            if not k.endswith(".weight")) == s.nbytes(shape)
    return out


def quantization_config(mods: list[Module]) -> dict | None:
    """config.json's "quantization" object (None: nothing quantized)."""
    from workbench.schemes import get_scheme
    quant = [m for m in mods if m.scheme != KEEP]
    if not quant:
        return None
    counts = Counter(get_scheme(m.scheme).name for m in quant)
    default = get_scheme(counts.most_common(1)[0][0]).mlx_config
    q = dict(default)
    for m in quant:
        c = get_scheme(m.scheme).mlx_config
        if c != default:
            q[m.path] = c
    return q


def shards(mods: list[Module], limit: int = SHARD_BYTES) -> list[list[Module]]:
    """The modules of each safetensors file, in order (a new file when the next module would
    take one past `limit`, as mlx-lm splits)."""
    out: list[list[Module]] = [[]]
    size = 0
    for m in mods:
        b = module_bytes(m)
        if out[-1] and size + b > limit:
            out.append([])
            size = 0
        out[-1].append(m)
        size += b
    return out


def module_bytes(m: Module) -> int:
    return sum(math.prod(sh) * ITEMSIZE.get(dt, 8) for dt, sh in m.arrays.values())


def header_bytes(mods: list[Module]) -> int:
    """The bytes of a safetensors file's 8-byte length and JSON header for `mods`, exactly as
    workbench.export.st_writer writes it."""
    head, off = {}, 0
    for m in mods:
        for name, (dt, sh) in m.arrays.items():
            n = math.prod(sh) * ITEMSIZE.get(dt, 8)
            head[name] = {"dtype": dt, "shape": list(sh), "data_offsets": [off, off + n]}
            off += n
    head["__metadata__"] = METADATA
    blob = len(json.dumps(head, separators=(",", ":")).encode("utf-8"))
    return 8 + blob + (-blob) % 8


def shard_names(n: int) -> list[str]:
    if n == 1:
        return ["model.safetensors"]
    return [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]


def layout_bytes(model, plan) -> dict:
    """{"file": the bytes of every safetensors file the MLX export of `plan` writes, "tensors":
    {source tensor: its written bytes (an expert: its share of the stacked module)},
    "shards": files}: computed from the layout, nothing quantized."""
    from workbench.formats.llama_names import read_config
    from workbench.quant.runtimes import plan_decisions
    config = read_config(model)
    mods = modules(model, plan_decisions(model, plan, "mlx"), config)
    files = shards(mods)
    per = {}
    for m in mods:
        b = module_bytes(m)
        for src in m.sources:
            per[src] = b // len(m.sources)
    total = sum(header_bytes(f) + sum(module_bytes(m) for m in f) for f in files)
    return {"file": total, "tensors": per, "shards": len(files), "alignment": 1}

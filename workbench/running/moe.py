"""Mixture-of-experts as one structure: plan selectors, expert groups, per-expert statistics and
how often the router picks each expert (docs/moe.md).

Roles come from names (workbench.formats.catalog): ``router``, ``expert`` (Hugging Face per-expert
tensors with their index, or a merged 3-D tensor of every expert of a layer) and
``shared_expert``.

**Selectors** (``moe:KIND[.PROJ][@LAYERS]`` rules) are parsed by workbench.formats.moe_selectors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from workbench.formats import catalog
from workbench.core.errors import WorkbenchError
from workbench.core.progress import Progress
from workbench.formats.moe_selectors import is_selector, parse_selector


def expand_pins(model, pins) -> dict[str, str]:
    """{tensor: scheme} of allocate's pins ({tensor or moe: selector: scheme}): a selector
    becomes one pin per tensor it addresses (an exact name before it wins); scheme names are
    resolved, and a pinned tensor the model lacks is a WorkbenchError."""
    from workbench.schemes import get_scheme
    out: dict[str, str] = {}
    for n, s in pins.items():
        s = get_scheme(s).name
        if not is_selector(n):
            out[n] = s
            continue
        hit = [t for t in model.tensors if parse_selector(n).matches(t)]
        if not hit:
            raise WorkbenchError(f"pins={n!r}: no tensor of the model matches", path=model.path,
                                 params=("pins",))
        for t in hit:
            out.setdefault(t, s)
    for p in out:
        if p not in model.tensors:
            raise WorkbenchError(f"pinned tensor {p!r} is not in the model", path=model.path)
    return out


# ---- groups -----------------------------------------------------------------------------------
def expert_groups(model, names=None) -> dict[str, list[str]]:
    """{'layer N experts PROJ': [tensor names]}: one projection's experts of one layer, in
    expert order (Hugging Face per-expert tensors), or the one merged 3-D tensor (GGUF)."""
    out: dict[str, list[str]] = {}
    for n in (model.tensors if names is None else names):
        g = catalog.expert_group(n)
        if g is not None:
            out.setdefault(g, []).append(n)
    for g, ns in out.items():
        ns.sort(key=lambda n: (catalog.expert_index(n) is not None, catalog.expert_index(n) or 0))
    return out


#: how a target runtime stores a layer's experts, i.e. which experts must share one scheme:
#: llama.cpp one merged tensor per projection (ffn_{gate,up,down}_exps); vLLM's FusedMoE one
#: quantized layer for every projection of every expert of a layer
RUNTIME_EXPERT_UNIT = {"llama.cpp": "projection", "vllm": "layer"}


def decision_groups(model, names, runtime: str) -> dict[str, list[str]]:
    """{key: names} of the expert tensors among `names` that `runtime` stores together (one
    scheme for all); {} for a runtime that takes each tensor on its own."""
    unit = RUNTIME_EXPERT_UNIT.get(runtime)
    if unit is None:
        return {}
    groups = expert_groups(model, names)
    if unit == "layer":
        merged: dict[str, list[str]] = {}
        for key, ns in groups.items():
            merged.setdefault(key.rsplit(" ", 1)[0], []).extend(ns)
        groups = merged
    return {k: ns for k, ns in groups.items() if len(ns) > 1}


def expert_count(model, names) -> int:
    """Experts held by the tensors `names` (a merged tensor counts its first dimension)."""
    return sum(model.info(n).n_experts for n in names)


# ---- per-expert statistics ---------------------------------------------------------------------
@dataclass
class ExpertSpread:
    """Per expert of one group: absmax, std and excess kurtosis of its weights."""
    group: str
    experts: list[int]
    names: list[str]               # the tensor holding each expert
    absmax: np.ndarray
    std: np.ndarray
    kurtosis: np.ndarray

    def to_dict(self) -> dict:
        return {"group": self.group, "experts": list(self.experts), "tensors": list(self.names),
                "absmax": self.absmax.tolist(), "std": self.std.tolist(),
                "kurtosis": self.kurtosis.tolist()}


def _moments(w: np.ndarray) -> tuple[float, float, float]:
    w = np.asarray(w, dtype=np.float64).reshape(-1)
    if w.size == 0:
        return 0.0, 0.0, 0.0
    mean = w.mean()
    d = w - mean
    m2 = float((d * d).mean())
    m4 = float((d ** 4).mean())
    kurt = m4 / (m2 * m2) - 3.0 if m2 > 0 else 0.0
    return float(np.abs(w).max()), float(np.sqrt(m2)), float(kurt)


def expert_slices(model, name: str):
    """Yield (expert index, float32 (rows, cols) weights) for each expert a tensor holds: every
    slice of a merged 3-D tensor (one expert decoded at a time), or the per-expert tensor."""
    from workbench.formats.dtypes import decode_rows
    from workbench.core.errors import context
    info = model.info(name)
    if info.merged_experts:
        per = info.shape[1]
        raw = model.raw(name)
        for e in range(info.shape[0]):
            with context(info.file or model.path, name):
                yield e, decode_rows(raw[e * per:(e + 1) * per], info)
        return
    idx = info.expert
    yield (0 if idx is None else idx), model.read_matrix(name)


def expert_spread(model, group: str, names=None):
    """Job: the ExpertSpread of an expert group (a key of `expert_groups`, or the name of one
    merged tensor)."""
    if names is None:
        groups = expert_groups(model)
        if group in groups:
            names = groups[group]
        elif group in model.tensors and model.info(group).role == "expert":
            names = [group]
        else:
            raise WorkbenchError(f"no expert group {group!r} in this model", path=model.path)
    total = max(expert_count(model, names), 1)
    experts, owners, vals = [], [], []
    done = 0
    for n in names:
        for e, w in expert_slices(model, n):
            yield Progress(done, total, f"experts {group}")
            experts.append(e)
            owners.append(n)
            vals.append(_moments(w))
            done += 1
    yield Progress(total, total, "done")
    a = np.array(vals, dtype=np.float64).reshape(-1, 3)
    return ExpertSpread(group, experts, owners, a[:, 0], a[:, 1], a[:, 2])


# ---- router usage on calibration inputs -------------------------------------------------------
def _routers(net) -> list[tuple[str, object]]:
    """(module name, module) of the network's routers: modules whose own parameter `weight`
    has the router role's name."""
    out = []
    for mname, mod in net.named_modules():
        w = getattr(mod, "_parameters", {}).get("weight")
        if w is not None and catalog.moe_role(f"{mname}.weight") == "router" \
                and "shared_expert" not in mname:
            out.append((mname, mod))
    return out


def _indices(output):
    """The top-k expert indices from a router's output: transformers 5 routers return
    (logits, weights, indices); older ones the logits alone (then top-k is taken here)."""
    import torch
    if isinstance(output, (tuple, list)):
        for t in reversed(output):
            if isinstance(t, torch.Tensor) and not t.is_floating_point():
                return t.reshape(-1, t.shape[-1])
        output = output[0]
    return None if not isinstance(output, torch.Tensor) else output


def usage_from_network(net, forward, data, top_k: int | None = None):
    """{block: counts per expert (float64)} and the number of tokens, from forward hooks on the
    router modules of a transformers network. `forward(sample)` runs one sample (unpadded, so
    every routed token is a real one)."""
    import torch
    routers = _routers(net)
    if not routers:
        raise WorkbenchError("no router modules found in the network (not a mixture of experts)")
    counts: dict[int, np.ndarray] = {}
    handles = []

    def hook_for(block, mod):
        n_exp = int(mod.weight.shape[0])

        def hook(_m, _inp, out):
            idx = _indices(out)
            if idx is not None and idx.is_floating_point():   # logits: take the top-k here
                k = top_k or 1
                idx = torch.topk(idx.reshape(-1, n_exp), k, dim=-1).indices
            c = np.bincount(idx.reshape(-1).cpu().numpy().astype(np.int64), minlength=n_exp)
            counts[block] = counts.get(block, 0) + c[:n_exp].astype(np.float64)
        return hook

    for mname, mod in routers:
        b = catalog.block_index(mname)
        handles.append(mod.register_forward_hook(hook_for(-1 if b is None else b, mod)))
    n_tok = 0
    try:
        for s in data:
            forward(s)
            n_tok += len(s)
    finally:
        for h in handles:
            h.remove()
    return counts, n_tok


def usage_by_tensor(model, counts: dict[int, np.ndarray], n_tok: int) -> dict:
    """{workbench name of each expert weight: fraction of tokens routed to its expert} (a
    per-expert tensor gets a float; a merged 3-D tensor an array, one fraction per expert).
    Fractions over a layer's experts sum to top-k: an expert every token reaches counts 1.0,
    like a dense layer."""
    out = {}
    for n in model.tensors:
        info = model.info(n)
        if info.role != "expert":
            continue
        c = counts.get(info.block)
        if c is None:
            continue
        frac = c / max(n_tok, 1)
        if info.merged_experts:
            out[n] = frac[:info.shape[0]].copy()
        elif info.expert is not None and info.expert < len(frac):
            out[n] = float(frac[info.expert])
    return out


def _net_with_weights(model):
    """A whole transformers network of the model's config with the file's weights, built from
    the config (``from_config``: nothing downloaded, no code from the folder executed), the
    per-expert tensors stacked into the fused expert parameters transformers keeps in memory.
    (Small models: the routing counts of `workbench.running.runner_jobs.expert_usage`, where the runner has
    it, come from its layer-by-layer pass instead.)"""
    from workbench.running.runner_config import _import_transformers, read_config
    import torch
    transformers = _import_transformers()
    cfg = read_config(model)
    mt = cfg.get("model_type", "")
    if mt not in transformers.CONFIG_MAPPING:
        raise WorkbenchError(f"not runnable: transformers has no model_type {mt!r}",
                             path=str(model.path))
    config = transformers.CONFIG_MAPPING[mt](**{k: v for k, v in cfg.items()
                                                if not k.startswith("_")})
    torch.manual_seed(0)
    net = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    net = net.float().eval()
    names = set(model.tensors)
    for hf, p in net.named_parameters():
        w = _assemble(model, names, hf, tuple(p.shape))
        if w is None:
            raise WorkbenchError(f"not runnable: no tensor in the file for the network's {hf}",
                                 path=str(model.path))
        with torch.no_grad():
            p.data.copy_(torch.from_numpy(np.array(w, dtype=np.float32)))
    return net


# in-memory module paths whose checkpoint names differ (transformers' conversion mapping):
# Mixtral keeps ``mlp.`` in memory and ``block_sparse_moe.`` in the file
_FILE_ALIASES = ((".mlp.", ".block_sparse_moe."),)


def _assemble(model, names, hf: str, shape):
    def get(n):
        if n in names:
            return model.read(n)
        return None
    cands = [hf] + [hf.replace(a, b) for a, b in _FILE_ALIASES if a in hf]
    cands += [f"model.{c}" for c in cands if not c.startswith("model.")]
    for c in cands:
        w = get(c)
        if w is not None:
            return w.reshape(shape)
    m = re.match(r"^(.*\.experts)\.(gate_up_proj|down_proj)$", hf)
    if not m:
        return None
    which = m.group(2)
    bases = [m.group(1)] + [m.group(1).replace(a, b) for a, b in _FILE_ALIASES if a in hf]
    base = next((b for b in bases if f"{b}.0.w1.weight" in names
                 or f"{b}.0.down_proj.weight" in names), None)
    if base is None:
        return None
    mix = f"{base}.0.w1.weight" in names
    parts = []
    for e in range(shape[0]):
        if which == "gate_up_proj":
            keys = ([f"{base}.{e}.w1.weight", f"{base}.{e}.w3.weight"] if mix else
                    [f"{base}.{e}.gate_proj.weight", f"{base}.{e}.up_proj.weight"])
            ws = [get(k) for k in keys]
            if any(x is None for x in ws):
                return None
            parts.append(np.concatenate(ws, 0))
        else:
            x = get(f"{base}.{e}.w2.weight" if mix else f"{base}.{e}.down_proj.weight")
            if x is None:
                return None
            parts.append(x)
    w = np.stack(parts)
    return w.reshape(shape) if w.size == np.prod(shape) else None


def expert_usage(model, calib=None, samples=None, max_len: int = 128):
    """Job: {workbench name of each expert weight: fraction of calibration tokens routed to
    that expert} (see `usage_by_tensor`), counted with forward hooks on the router modules."""
    import torch
    from workbench.running.calibration import calibration_samples
    net = _net_with_weights(model)
    top_k = getattr(net.config, "num_experts_per_tok", None)
    data = yield from calibration_samples(model, calib, samples, max_len)
    yield Progress(0, len(data), "routing calibration samples")

    def fwd(s):
        with torch.no_grad():
            ids = torch.from_numpy(np.asarray(s, dtype=np.int64)[None, :])
            net(input_ids=ids, attention_mask=torch.ones_like(ids))

    counts, n_tok = usage_from_network(net, fwd, data, top_k)
    yield Progress(len(data), len(data), "routed")
    return usage_by_tensor(model, counts, n_tok)


def find_expert_usage():
    """The runner's expert_usage job (workbench.running.runner_jobs) when it provides one, else
    this module's."""
    from workbench.running import runner_jobs
    return getattr(runner_jobs, "expert_usage", None) or expert_usage

"""The model map: a network drawn as its blocks (embeddings → N blocks → final norm / head),
every tensor a cell, grouped by role (issue 23). Pure data: `app/model_map.py` draws it,
`quant-workbench map` prints the same blocks, per-block totals and overlay values.

:func:`layout` groups a model's tensors into :class:`MapBlock` rows, each a list of
:class:`MapSection` (attention q/k/v/o, MLP gate/up/down, router, one section per expert
projection holding every expert's tensor in expert order, shared expert, norms & biases,
other). :func:`block_totals` sums a block's bytes and bits per weight for a plan;
:func:`overlay_values` gives each tensor's number for an overlay; :func:`colour_range` the
scale a legend shows.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from workbench.core.progress import Progress

OVERLAYS = ("bits", "sqnr", "sensitivity", "output", "kurtosis", "outliers")
OVERLAY_TEXT = {"bits": "scheme / bits per weight", "sqnr": "SQNR (dB)",
                "sensitivity": "sensitivity (predicted error)",
                "output": "measured output change", "kurtosis": "excess kurtosis",
                "outliers": "outlier fraction"}
# overlays drawn on a log10 scale (values spanning decades)
LOG_OVERLAYS = ("bits", "sensitivity", "output", "outliers")
# overlays where a larger value is better (the colour scale runs the other way)
HIGHER_IS_BETTER = ("bits", "sqnr")

_SECTION_OF = {"attn_q": "attention", "attn_k": "attention", "attn_v": "attention",
               "attn_qkv": "attention", "attn_o": "attention",
               "mlp_gate": "mlp", "mlp_up": "mlp", "mlp_down": "mlp",
               "router": "router", "shared_expert": "shared expert",
               "norm": "norms & biases", "bias": "norms & biases",
               "embedding": "embeddings", "lm_head": "head", "conv": "other", "other": "other"}
_ROLE_ORDER = {r: i for i, r in enumerate(
    ("embedding", "attn_q", "attn_k", "attn_v", "attn_qkv", "attn_o", "mlp_gate", "mlp_up",
     "mlp_down", "router", "expert", "shared_expert", "lm_head", "norm", "bias", "conv",
     "other"))}
_SECTION_ORDER = ("embeddings", "attention", "mlp", "router", "experts gate", "experts up",
                  "experts gate_up", "experts down", "experts ?", "shared expert", "head",
                  "norms & biases", "other")
_LABEL = {"attn_q": "q", "attn_k": "k", "attn_v": "v", "attn_qkv": "qkv", "attn_o": "o",
          "mlp_gate": "gate", "mlp_up": "up", "mlp_down": "down", "norm": "norm",
          "bias": "bias", "embedding": "emb", "lm_head": "head", "router": "router",
          "conv": "conv", "other": "·"}


@dataclass(slots=True)
class MapCell:
    name: str
    role: str
    label: str
    params: int
    expert: int | None = None     # expert index of a per-expert tensor


@dataclass
class MapSection:
    title: str
    cells: list[MapCell] = field(default_factory=list)

    @property
    def experts(self) -> bool:
        return self.title.startswith("experts")


@dataclass
class MapBlock:
    key: str            # "embeddings", "layer N", "head", "other"
    title: str
    index: int | None   # the block number of a layer
    sections: list[MapSection] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return [c.name for s in self.sections for c in s.cells]

    def to_dict(self) -> dict:
        return {"key": self.key, "title": self.title,
                "sections": [{"title": s.title, "tensors": [c.name for c in s.cells]}
                             for s in self.sections]}


_INDEX_RE = re.compile(r"(?<=\.)\d+(?=\.|$)")
_SENTINEL = 1_000_000


def _template_facts(name: str, ndim: int) -> tuple:
    """(role, section, label, block position, expert position) of a name template: positions
    index the name's whole-number components (None: not there)."""
    from workbench.formats import catalog
    k = [0]

    def sentinel(_m):
        k[0] += 1
        return str(_SENTINEL + k[0] - 1)
    probe = _INDEX_RE.sub(sentinel, name)
    role = catalog.infer_role(probe, ndim)
    blk = catalog.block_index(probe)
    blk_pos = blk - _SENTINEL if blk is not None and blk >= _SENTINEL else None
    exp_pos = None
    if role == "expert":
        e = catalog.expert_index(probe)
        exp_pos = e - _SENTINEL if e is not None and e >= _SENTINEL else None
        sec = f"experts {catalog.projection(probe) or '?'}"
    else:
        sec = _SECTION_OF.get(role, "other")
    if role in ("expert", "shared_expert"):
        label = catalog.projection(probe) or "?"
    else:
        label = _LABEL.get(role, "·")
    embedding = role == "embedding" or key_is_embedding(name)
    return role, sec, label, blk_pos, exp_pos, embedding


def layout(model) -> list[MapBlock]:
    """The model's blocks in reading order: embeddings, layers by index, head, other."""
    from workbench.core.progress import run
    return run(layout_job(model))


#: tensors laid out between two progress events of :func:`layout_job`
LAYOUT_CHUNK = 4096


def layout_job(model):
    """:func:`layout` as a job (workbench.core.progress): a Progress every LAYOUT_CHUNK tensors, so
    the GUI's compute thread can lay out a 100,000-tensor catalog in the background and still
    answer a selection in between."""
    blocks: dict[str, MapBlock] = {}
    sections: dict[tuple[str, str], MapSection] = {}
    memo: dict[tuple, tuple] = {}
    layer_keys: dict[int, str] = {}
    total = len(model.tensors)
    for k, (name, info) in enumerate(model.tensors.items()):
        if k % LAYOUT_CHUNK == 0 and k:
            yield Progress(k, total, "laying out the model map")
        ndim = len(info.shape)
        nums = _INDEX_RE.findall(name)
        tkey = (_INDEX_RE.sub("0", name), ndim)
        facts = memo.get(tkey)
        if facts is None:
            facts = memo[tkey] = _template_facts(name, ndim)
        role, sec, label, blk_pos, exp_pos, embedding = facts
        idx = int(nums[blk_pos]) if blk_pos is not None else None
        if idx is not None:
            key = layer_keys.get(idx)
            if key is None:
                key = layer_keys[idx] = f"layer {idx}"
        elif embedding:
            key = "embeddings"
        elif role in ("lm_head", "norm"):
            key = "head"
        else:
            key = "other"
        b = blocks.get(key)
        if b is None:
            title = f"block {idx}" if idx is not None else \
                {"embeddings": "embeddings", "head": "final norm / head"}.get(key, "other")
            b = blocks[key] = MapBlock(key, title, idx)
        expert = int(nums[exp_pos]) if exp_pos is not None else None
        if expert is not None and role == "expert":
            label = f"{label}{expert}"
        s = sections.get((key, sec))
        if s is None:
            s = sections[(key, sec)] = MapSection(sec)
            b.sections.append(s)
        s.cells.append(MapCell(name, role, label, info.numel, expert))
    for b in blocks.values():
        b.sections.sort(key=lambda s: _SECTION_ORDER.index(s.title)
                        if s.title in _SECTION_ORDER else len(_SECTION_ORDER))
        for s in b.sections:
            if s.experts:
                s.cells.sort(key=lambda c: (-1 if c.expert is None else c.expert))
            else:
                s.cells.sort(key=lambda c: _ROLE_ORDER.get(c.role, 99))

    def order(b: MapBlock):
        if b.key == "embeddings":
            return (0, 0)
        if b.index is not None:
            return (1, b.index)
        return (2, 0) if b.key == "head" else (3, 0)
    return sorted(blocks.values(), key=order)


def key_is_embedding(name: str) -> bool:
    low = name.lower()
    return "embed" in low or low.startswith(("wte", "wpe", "token_embd", "position_embd"))


@dataclass
class BlockTotals:
    tensors: int
    params: int
    bytes: int

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.bytes / self.params if self.params else 0.0

    def to_dict(self) -> dict:
        return {"tensors": self.tensors, "params": self.params, "bytes": self.bytes,
                "bits_per_weight": self.bits_per_weight}


def block_totals(block: MapBlock, bytes_of) -> BlockTotals:
    """Tensors, parameters and stored bytes of a block; `bytes_of(name)` gives a tensor's
    bytes under the plan (workbench.planning.estimate / the evaluated result)."""
    params = nbytes = n = 0
    for s in block.sections:
        for c in s.cells:
            params += c.params
            nbytes += int(bytes_of(c.name))
            n += 1
    return BlockTotals(n, params, nbytes)


def plan_bytes_of(model, plan):
    """bytes_of(name) for a plan, from each scheme's size formula (no data read)."""
    from workbench.core.errors import WorkbenchError
    from workbench.quant.plan import KEEP
    from workbench.schemes import get_scheme
    assignment = plan.resolve(model)

    def bytes_of(name: str) -> int:
        info = model.info(name)
        s = assignment.get(name, KEEP)
        if s == KEEP or not info.is_float:
            return info.nbytes
        try:
            sch = get_scheme(s)
            if sch.ineligible_reason(info.shape) is None:
                return int(sch.nbytes(info.shape))
        except (WorkbenchError, NotImplementedError):
            pass
        return info.nbytes
    return bytes_of, assignment


def overlay_values(names, overlay: str, *, bytes_of=None, params=None, sqnr=None,
                   sensitivity=None, output=None, stats=None) -> np.ndarray:
    """One float per name for an overlay (NaN: not known yet). Sources are callables
    name -> value (None when unknown) or the stats dict of workbench.quant.stats.TensorStats."""
    out = np.full(len(names), np.nan)
    for i, n in enumerate(names):
        v = None
        if overlay == "bits":
            p = params(n) if params else 0
            v = 8.0 * bytes_of(n) / p if p else None
        elif overlay == "sqnr":
            v = sqnr(n) if sqnr else None
        elif overlay == "sensitivity":
            v = sensitivity(n) if sensitivity else None
        elif overlay == "output":
            v = output(n) if output else None
        elif overlay in ("kurtosis", "outliers") and stats is not None:
            st = stats.get(n)
            if st is not None:
                v = st.kurtosis if overlay == "kurtosis" else st.outlier_frac
        if v is not None:
            out[i] = float(v)
    return out


def colour_range(values: np.ndarray, overlay: str) -> tuple[float, float, bool]:
    """(lo, hi, log) of the legend's scale: the finite values' range (log10 for the overlays
    that span decades, over the positive values); SQNR's +inf (exact) sits at the top."""
    v = np.asarray(values, np.float64)
    log = overlay in LOG_OVERLAYS
    ok = np.isfinite(v) & ((v > 0) if log else True)
    if not ok.any():
        return (0.0, 1.0, log)
    x = np.log10(v[ok]) if log else v[ok]
    lo, hi = float(x.min()), float(x.max())
    if hi <= lo:
        hi = lo + (1.0 if lo == 0 else abs(lo) * 0.1)
    return (lo, hi, log)


def normalise(values: np.ndarray, lo: float, hi: float, log: bool) -> np.ndarray:
    """Values to [0, 1] on the scale (NaN stays NaN; +inf → 1, -inf → 0)."""
    v = np.asarray(values, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.where(v > 0, np.log10(np.where(v > 0, v, 1.0)), -np.inf) if log else v
        t = (x - lo) / (hi - lo)
    t = np.where(np.isposinf(v), 1.0, t)
    return np.where(np.isnan(v), np.nan, np.clip(t, 0.0, 1.0))


def summary(model, plan) -> dict:
    """What `quant-workbench map --json` prints: blocks, their sections' tensors, totals."""
    bytes_of, assignment = plan_bytes_of(model, plan)
    blocks = layout(model)
    out = []
    for b in blocks:
        d = b.to_dict()
        d["totals"] = block_totals(b, bytes_of).to_dict()
        out.append(d)
    params = sum(i.numel for i in model.tensors.values())
    nbytes = sum(bytes_of(n) for n in model.tensors)
    return {"model": str(model.path), "blocks": out,
            "totals": {"tensors": len(model.tensors), "params": params, "bytes": nbytes,
                       "bits_per_weight": 8.0 * nbytes / params if params else 0.0},
            "schemes": {n: assignment.get(n) for n in model.tensors}}


#: the overlays `map` computes without the window (sensitivity and output: `sensitivity`)
MAP_OVERLAYS = ("bits", "sqnr", "kurtosis", "outliers")


def map_values_job(model, plan, overlay: str = "bits"):
    """Job: {tensor: the overlay's value} for `map`: bits per weight (from the plan's sizes,
    None for an empty tensor), SQNR dB (the plan evaluated under runtime "any"), excess
    kurtosis or outlier fraction (every tensor read)."""
    from workbench.core.errors import WorkbenchError
    from workbench.core.progress import Progress
    if overlay not in MAP_OVERLAYS:
        raise WorkbenchError(f"overlay={overlay!r}: choose {', '.join(MAP_OVERLAYS)}",
                             params=("overlay",))
    if overlay == "bits":
        bytes_of, _ = plan_bytes_of(model, plan)
        return {n: (8.0 * bytes_of(n) / i.numel if i.numel else None)
                for n, i in model.tensors.items()}
    names = list(model.tensors)
    out = {}
    for i, n in enumerate(names):
        yield Progress(i, len(names), f"{overlay} of {n}")
        if overlay == "sqnr":
            from workbench.quant.evaluate import evaluate_tensor
            from workbench.quant.runtimes import plan_decisions
            d = plan_decisions(model, plan, "any", [n])[n]
            out[n] = evaluate_tensor(model, n, d.requested, decision=d).error.sqnr_db
        else:
            from workbench.quant.stats import tensor_stats
            st = yield from tensor_stats(model, n)
            out[n] = st.kurtosis if overlay == "kurtosis" else st.outlier_frac
    return out


def finite_or_none(x: float):
    return x if isinstance(x, float) and math.isfinite(x) else None

"""A GGUF source run the way the command line runs it: every model-level command (check,
sensitivity, allocate, ...) reads a GGUF that has no config.json beside it as the float
Hugging Face model `convert --to hf` would write, converted on the fly
(workbench.export.convert.live). The window keeps the GGUF's own tensors (its names, its
stored types: the map, the table and the sizes are the file's); the model-level work runs on
that live model, with the plan's schemes carried over by name (llama.cpp name <-> Hugging
Face name, the gguf package's map: workbench.formats.llama_names.gguf_names) and the results
carried back.
"""

from __future__ import annotations

import threading

from workbench.api.plans import KEEP, Plan, Rule

_LOCK = threading.Lock()
_OPEN: dict[int, tuple] = {}      # id(GGUF model) -> (the GGUF model, LiveSource)


class LiveSource:
    """The live (Hugging Face named, float32) model of a GGUF source and the name maps."""

    def __init__(self, raw, live):
        from workbench.api.models import gguf_names
        self.raw, self.live = raw, live
        self.to_gguf = {h: g for h, g in gguf_names(live).items() if g in raw.tensors}
        self.to_hf: dict[str, str] = {}
        for h, g in self.to_gguf.items():
            self.to_hf.setdefault(g, h)

    def plan(self, plan: Plan) -> Plan:
        """The GGUF plan on the live model's names: each tensor's scheme, method and
        fallback carried over (keep: the stored values, which the live model holds)."""
        a = plan.resolve(self.raw)
        rules = [Rule(h, a.get(g, KEEP), plan.fallback_for(g), plan.method_for(g))
                 for h, g in self.to_gguf.items()]
        return Plan(default=KEEP, rules=rules, method=plan.method,
                    activations={self.to_hf.get(k, k): v for k, v in plan.activations.items()
                                 if k in self.to_hf})

    def back(self, plan: Plan) -> Plan:
        """A plan on the live model's names (an allocation) on the GGUF's names: its exact
        rules renamed, its default and its pattern rules as they are; a GGUF tensor the live
        model has no place for stays as it is."""
        rules = [Rule(g, KEEP) for g in self.raw.tensors if g not in self.to_hf]
        for r in plan.rules:
            if r.is_regex:
                rules.append(r)
            elif r.match in self.to_gguf:
                rules.append(Rule(self.to_gguf[r.match], r.scheme, r.fallback, r.method))
        return plan._copy(rules=rules)   # noqa: SLF001 - the plan with other rules

    def pins(self, pins: dict) -> dict:
        return {self.to_hf[n]: s for n, s in pins.items() if n in self.to_hf}


def wants_live(model) -> bool:
    """Whether model-level work reads `model` (a GGUF without a config.json beside it, of an
    architecture transformers runs) through the live conversion, as the CLI does."""
    if getattr(model, "format", None) != "gguf":
        return False
    from workbench.api.models import wants_live as _wants
    return _wants(model.path)


def live_source(raw):
    """Job: the LiveSource of the GGUF model `raw` (converted once, then reused until
    :func:`release`), or None when `raw` runs as it is."""
    with _LOCK:
        hit = _OPEN.get(id(raw))
    if hit is not None and hit[0] is raw:
        return hit[1]
    if not wants_live(raw):
        return None
    from workbench.api.models import open_live
    live = yield from open_live(raw.path)
    src = LiveSource(raw, live)
    with _LOCK:
        _OPEN[id(raw)] = (raw, src)
    return src


def release(raw) -> None:
    """The GGUF model is closed: its live model too (its companion folder removed)."""
    with _LOCK:
        hit = _OPEN.pop(id(raw), None)
    if hit is not None:
        hit[1].live.close()

"""Every edit is a command (DESIGN.md example 7): `do`, `undo`, `label` — Qt-free.

Commands are thin wrappers over immutable :class:`workbench.quant.plan.Plan` edits: each keeps
the plan (and tier setup) before and after, so undo is exact. `app.undo` puts them on a
QUndoStack. The target `doc` needs `.plan`, `.tiers`, `.model` and `.set_state(plan, tiers)`.
"""

from __future__ import annotations

from workbench.api.plans import KEEP, Plan
from workbench.api.plans import get_scheme

from . import tiers as tier_model
from .tiers import Tier, on_board


class Command:
    label = ""

    def do(self, doc) -> None:
        raise NotImplementedError

    def undo(self, doc) -> None:
        raise NotImplementedError


class StateCommand(Command):
    """Replace (plan, tiers) by new ones; undo restores the old ones."""

    def __init__(self, label: str, before: tuple, after: tuple, targets: dict | None = None):
        self.label = label
        self.before = before
        self.after = after
        self.targets = targets or {}  # name -> scheme the edit assigns (assign, move to tier)

    def do(self, doc) -> None:
        doc.set_state(*self.after)

    def undo(self, doc) -> None:
        doc.set_state(*self.before)


def _short(name: str) -> str:
    """'model.layers.0.self_attn.q_proj.weight' -> 'L0 self_attn.q_proj' (the layer named)."""
    import re
    stem = name[:-7] if name.endswith(".weight") else name
    m = re.search(r"(?:^|\.)(?:layers|layer|h|blk|blocks|block)\.(\d+)\.(.+)$", stem)
    if m:
        return f"L{m.group(1)} {m.group(2)}"
    parts = stem.split(".")
    return ".".join(parts[-3:]) if len(parts) > 3 else stem


def _what(names) -> str:
    names = list(names)
    return _short(names[0]) if len(names) == 1 else f"{len(names)} tensors"


def eligible(doc, names, scheme: str) -> tuple[list[str], list[str]]:
    """(names that can take `scheme`, names that cannot)."""
    if scheme == KEEP:
        return list(names), []
    s = get_scheme(scheme)
    ok, bad = [], []
    for n in names:
        info = doc.model.info(n)
        (ok if info.is_float and s.ineligible_reason(info.shape) is None else bad).append(n)
    return ok, bad


def assign(doc, names, scheme: str) -> StateCommand | None:
    """Assign `scheme` to tensors by exact-name rules (ineligible tensors are skipped)."""
    ok, _ = eligible(doc, names, scheme)
    if not ok:
        return None
    plan = doc.plan.with_assignments({n: scheme for n in ok})
    return StateCommand(f"Assign {scheme} to {_what(ok)}", (doc.plan, doc.tiers),
                        (plan, doc.tiers), {n: scheme for n in ok})


def set_method(doc, names, method: str) -> StateCommand | None:
    """Give tensors a quantization method (rtn, imatrix, gptq, awq) by exact-name rules that
    keep their schemes; 1-D / non-float tensors are skipped."""
    ok = [n for n in names if doc.model.info(n).is_float and doc.model.info(n).ndim >= 2
          and doc.plan.method_for(n) != method]
    if not ok:
        return None
    plan = doc.plan.with_method(method, ok)
    return StateCommand(f"Method {method} for {_what(ok)}", (doc.plan, doc.tiers),
                        (plan, doc.tiers))


def assign_with_method(doc, names, scheme: str, method: str) -> StateCommand | None:
    """Assign `scheme` and `method` together (the comparison view's method rows): one edit, so
    one undo restores both. Tensors that cannot take the scheme are skipped; 1-D / non-float
    ones get the scheme only; tensors that already have both are left alone."""
    ok, _ = eligible(doc, names, scheme)
    ok = [n for n in ok if doc.scheme_of(n) != scheme or doc.plan.method_for(n) != method]
    if not ok:
        return None
    plan = doc.plan.with_assignments({n: scheme for n in ok})
    takes = [n for n in ok if doc.model.info(n).is_float and doc.model.info(n).ndim >= 2]
    if takes:
        plan = plan.with_method(method, takes)
    return StateCommand(f"Assign {scheme} · {method} to {_what(ok)}", (doc.plan, doc.tiers),
                        (plan, doc.tiers), {n: scheme for n in ok})


def move_to_tier(doc, names, tier: int, scheme: str | None = None) -> StateCommand | None:
    """Assign tier `tier`'s scheme (or `scheme`: the one its box shows) to `names`."""
    t: Tier = doc.tiers[tier]
    scheme = scheme or t.scheme
    ok, _ = eligible(doc, [n for n in names if on_board(doc.model.info(n))], scheme)
    if not ok:
        return None
    plan = doc.plan.with_assignments({n: scheme for n in ok})
    return StateCommand(f"Move {_what(ok)} to {t.name}", (doc.plan, doc.tiers), (plan, doc.tiers),
                        {n: scheme for n in ok})


def set_tier_scheme(doc, tier: int, scheme: str, members) -> StateCommand:
    """Change a tier's scheme and re-assign its members (those that can take it)."""
    old = doc.tiers[tier]
    tiers = tuple(Tier(t.name, scheme, t.min_bits) if i == tier else t
                  for i, t in enumerate(doc.tiers))
    ok, _ = eligible(doc, members, scheme)
    plan = doc.plan.with_assignments({n: scheme for n in ok}) if ok else doc.plan
    return StateCommand(f"Set tier {old.name} to {scheme}", (doc.plan, doc.tiers), (plan, tiers))


def add_tier(doc, after: int, name: str, scheme: str) -> StateCommand:
    """Insert a tier after tier `after`; the plan is unchanged (tiers are a view of it).

    Raises WorkbenchError for an empty or duplicate name or an unknown scheme."""
    tiers = tier_model.insert_tier(doc.tiers, after, name, scheme)
    new = tiers[after + 1]
    return StateCommand(f"Add tier '{new.name}'", (doc.plan, doc.tiers), (doc.plan, tiers))


def rename_tier(doc, index: int, name: str) -> StateCommand | None:
    """Rename tier `index` (None when the name is unchanged). Raises WorkbenchError."""
    old = doc.tiers[index]
    if name.strip() == old.name:
        return None
    tiers = tier_model.rename_tier(doc.tiers, index, name)
    return StateCommand(f"Rename tier '{old.name}' to '{tiers[index].name}'",
                        (doc.plan, doc.tiers), (doc.plan, tiers))


def remove_tier(doc, index: int) -> StateCommand:
    """Remove tier `index`: its members keep their schemes and show in the tier their bits
    reach (app.tiers). Raises WorkbenchError for the last remaining tier."""
    old = doc.tiers[index]
    tiers = tier_model.remove_tier(doc.tiers, index)
    return StateCommand(f"Remove tier '{old.name}'", (doc.plan, doc.tiers), (doc.plan, tiers))


def add_rule(doc, match: str, scheme: str, index: int | None = None) -> StateCommand:
    plan = doc.plan.with_rule(match, scheme, index)
    return StateCommand(f"Add rule {match} → {scheme}", (doc.plan, doc.tiers), (plan, doc.tiers))


def remove_rule(doc, index: int) -> StateCommand:
    rule = doc.plan.rules[index]
    plan = doc.plan.without_rule(index)
    return StateCommand(f"Remove rule {rule.match}", (doc.plan, doc.tiers), (plan, doc.tiers))


def set_default(doc, scheme: str) -> StateCommand:
    return StateCommand(f"Set default scheme to {scheme}", (doc.plan, doc.tiers),
                        (doc.plan.with_default(scheme), doc.tiers))


def replace_plan(doc, plan: Plan, label: str = "Load plan") -> StateCommand:
    return StateCommand(label, (doc.plan, doc.tiers), (plan, doc.tiers))


def is_quantizing(scheme: str) -> bool:
    """Below 16 bits (keep, fp32, fp16 and bf16 are not quantizing)."""
    if scheme == KEEP:
        return False
    try:
        return get_scheme(scheme).nominal_bits < 16
    except Exception:  # noqa: BLE001 - an unknown scheme is refused elsewhere
        return False


def gguf_names_of(model):
    """llama.cpp's names of the model's tensors (None: unmapped architecture), computed once
    per model (the window asks for them when the model opens, off the GUI thread)."""
    from workbench.core.errors import WorkbenchError
    gnames = getattr(model, "_app_gguf_names", False)
    if gnames is False:
        try:
            from workbench.api.models import gguf_names
            gnames = gguf_names(model)
        except (WorkbenchError, Exception):  # noqa: BLE001 - unmapped architecture: ndim only
            gnames = None
        try:
            model._app_gguf_names = gnames
        except AttributeError:
            pass
    return gnames


def never_retyped(model, targets: dict, runtime: str = "llama.cpp") -> list[tuple[str, str]]:
    """(name, why) for each tensor `targets` would quantize that `runtime` never re-types
    (workbench.quant.runtimes: llama.cpp keeps norms, biases, position and token-type embeddings)."""
    from workbench.api.plans import get_runtime
    rt = get_runtime(runtime)
    gnames = gguf_names_of(model)
    out = []
    for n, scheme in targets.items():
        if not is_quantizing(scheme):
            continue
        info = model.info(n)
        why = rt.never_retyped(info, gnames.get(n) if gnames else None)
        if why is None and info.role in ("norm", "bias", "pos_embed", "position_embed",
                                         "token_type_embed"):
            why = f"a {info.role} tensor"
        if why:
            out.append((n, why))
    return out


_ELIGIBLE: dict[tuple, list[str]] = {}


def unavailable_for(info) -> dict[str, str]:
    """{scheme: why it cannot take this float tensor} for every registered scheme it cannot
    (the scheme's own reason: a row length, a block size); none for a non-float tensor."""
    if not info.is_float or info.ndim < 1:
        return {}
    from workbench.api.plans import list_schemes
    out = {}
    for s in list_schemes():
        why = get_scheme(s).ineligible_reason(info.shape)
        if why is not None:
            out[s] = why
    return out


def schemes_for(info) -> list[str]:
    """`keep` plus every registered scheme that can take this tensor (registry order)."""
    key = (tuple(info.shape), info.is_float)
    if key not in _ELIGIBLE:
        from workbench.api.plans import list_schemes
        names = [KEEP]
        if info.is_float and info.ndim >= 1:
            names += [s for s in list_schemes() if get_scheme(s).ineligible_reason(info.shape) is None]
        _ELIGIBLE[key] = names
    return _ELIGIBLE[key]

"""Size / predicted-error frontier: optimal plans over a range of budgets, beside the uniform plans
and llama.cpp's ftype recipes (Q4_K_M, Q5_K_M ... as llama-quantize assigns them), all counted
as `evaluate` counts them (a plan's ``totals.bytes`` / ``totals.bits_per_weight`` for the target
runtime) and scored with the same SensitivityTable.

Recipes: llama.cpp's ``src/llama-quant.cpp`` (llama-cpp-python 0.3.36),
``llama_tensor_get_type_impl`` for a dense model without an imatrix, encoded as data in
:data:`RECIPES`:

* every tensor llama-quantize re-types starts at the ftype's default type;
* ``output.weight`` (and ``token_embd.weight`` when there is no ``output.weight``: tied
  embeddings) becomes Q8_0 when its row length is not a multiple of the default type's block,
  else Q6_K unless the default is Q8_0;
* attention-v-like tensors (``attn_v``, ``attn_qkv``, ``attn_kv_b``) and ``ffn_down`` get the
  recipe's bigger type when the rule says so: ``use_more_bits(i, n) = i < n/8 or i >= 7n/8 or
  (i - n/8) % 3 == 2`` (integer division), where i counts those tensors in llama.cpp's order
  (non-block tensors first, then by block, then by name) and n is their count (attn_v) or the
  number of blocks (ffn_down);
* finally ``tensor_type_fallback``: a row length the type's block does not divide gives Q2_K/Q3_K
  -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, then F16.

Not modelled: MoE / 8-expert and 70B special cases, Falcon, the IQ* ftypes, imatrix-dependent
rules (Q4_0/Q5_0 ffn_down with an imatrix).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from workbench.core.errors import WorkbenchError
from workbench.quant.plan import KEEP, Plan
from workbench.schemes.registry import block_sizes, llama_fallbacks

# ftype -> default type and per-category rules: (condition, type). Conditions: "more_bits"
# (use_more_bits on the category's counter), "first_eighth" (i < n/8), "first4" (i < 4).
RECIPES: dict[str, dict] = {
    "Q4_K_M": {"default": "q4_k", "attn_v": ("more_bits", "q6_k"),
               "ffn_down": ("more_bits", "q6_k")},
    "Q5_K_M": {"default": "q5_k", "attn_v": ("more_bits", "q6_k"),
               "ffn_down": ("more_bits", "q6_k")},
    "Q4_K_S": {"default": "q4_k", "attn_v": ("first4", "q5_k"),
               "ffn_down": ("first_eighth", "q5_k")},
    "Q5_K_S": {"default": "q5_k"},
    "Q6_K": {"default": "q6_k"},
    "Q8_0": {"default": "q8_0"},
    "Q4_0": {"default": "q4_0"},
    "Q4_1": {"default": "q4_1"},
    "Q5_0": {"default": "q5_0"},
    "Q5_1": {"default": "q5_1"},
}
# weights per block and llama-quant.cpp's tensor_type_fallback: the scheme registry's
BLOCK = block_sizes()
FALLBACK = llama_fallbacks()


@dataclass
class FrontierPoint:
    """One plan on the size / error axes. `kind`: allocated | uniform | recipe | current."""
    kind: str
    label: str
    budget_bpw: float | None
    bits_per_weight: float
    bytes: int
    predicted: float | None          # total sensitivity (the table's measure)
    assignment: dict = field(default_factory=dict)   # tensor -> scheme requested
    plan: Plan | None = None
    exact: bool | None = None        # allocated: proven optimal
    checked: dict | None = None      # end-to-end figures (runner.check), when measured

    def to_dict(self, with_assignment: bool = False) -> dict:
        d = {"kind": self.kind, "label": self.label, "budget_bpw": self.budget_bpw,
             "bits_per_weight": self.bits_per_weight, "bytes": self.bytes,
             "predicted": self.predicted, "exact": self.exact, "checked": self.checked}
        if with_assignment:
            d["assignment"] = dict(self.assignment)
        return d


def _check_target(table, target):
    if target is not None and target != table.runtime:
        raise WorkbenchError(f"the sensitivity table was built for runtime {table.runtime!r}, "
                             f"not {target!r}")


def frontier(model, schemes, table, budgets_bpw: list[float], pins=None,
             target: str | None = None) -> list[FrontierPoint]:
    """Allocated (least total sensitivity) plans at each budget in bits per weight, as
    `evaluate` counts them for the table's runtime (`target`, default the table's). Budgets
    below the smallest possible size are left out. `schemes`: the candidates (default: the
    table's)."""
    _check_target(table, target)
    if schemes:
        schemes = list(schemes)
        missing = [s for s in schemes if s not in table.schemes]
        if missing:
            raise WorkbenchError(f"schemes not in the sensitivity table: {', '.join(missing)}")
        if schemes != table.schemes:
            import copy
            table = copy.copy(table)
            table.schemes = schemes
    out = []
    for b in budgets_bpw:
        budget = table.budget_bytes(None, float(b))
        try:
            plan, sol = table.solve(budget, pins)
        except WorkbenchError:
            continue
        a = table.assignment_of(plan, model)
        nbytes = table.bytes_of(a)
        out.append(FrontierPoint("allocated", f"allocated {b:.3g} bpw", float(b),
                                 8.0 * nbytes / table.params, nbytes, table.predicted(a), a,
                                 plan, sol.exact))
    return out


def uniform_points(model, table, schemes=None, target: str | None = None) -> list[FrontierPoint]:
    """One point per scheme applied to every tensor with a choice (the runtime's fallbacks
    included, as evaluate applies them). Schemes the table did not measure are left out."""
    _check_target(table, target)
    out = []
    for s in (schemes or table.schemes):
        if any((n, s) not in table.bytes for n in table.names):
            continue
        a = {n: s for n in table.names}
        nbytes = table.bytes_of(a)
        out.append(FrontierPoint("uniform", s, None, 8.0 * nbytes / table.params, nbytes,
                                 table.predicted(a), a, table.plan_for(a)))
    return out


# ---- llama.cpp recipes ------------------------------------------------------------------------
def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _category(g: str) -> str:
    if g == "output.weight":
        return "output"
    if g in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for key, cat in (("attn_qkv.weight", "attn_v"), ("attn_kv_b.weight", "attn_v"),
                     ("attn_v.weight", "attn_v"), ("attn_k.weight", "attn_k"),
                     ("attn_q.weight", "attn_q"), ("attn_output.weight", "attn_output"),
                     ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"), ("ffn_down", "ffn_down")):
        if key in g:
            return cat
    return "other"


def _llama_order(g: str):
    m = re.match(r"blk\.(\d+)\.", g)
    return (int(m.group(1)) if m else -1, g)


def recipe_types(ftypes) -> list[str]:
    """Every type the recipes can assign (to measure them in a SensitivityTable's `extra`)."""
    out = []
    for f in ftypes:
        r = RECIPES.get(f.upper())
        if r is None:
            raise WorkbenchError(f"unknown recipe {f!r} (known: {', '.join(RECIPES)})")
        out += [r["default"], "q6_k", "q8_0"] + [v[1] for k, v in r.items() if k != "default"]
        out += [FALLBACK[t] for t in list(out) if t in FALLBACK] + ["fp16"]
    return list(dict.fromkeys(out))


def recipe_assignment(model, ftype: str) -> dict[str, str]:
    """{workbench name: type} that llama-quantize assigns for `ftype` (see the module doc) to
    each tensor it re-types; the others (norms, biases, position / token-type embeddings) are
    absent (kept)."""
    from workbench.formats.llama_names import gguf_names
    from workbench.quant.runtimes import get_runtime
    key = ftype.upper()
    if key not in RECIPES:
        raise WorkbenchError(f"unknown recipe {ftype!r} (known: {', '.join(RECIPES)})")
    r = RECIPES[key]
    default = r["default"]
    rt = get_runtime("llama.cpp")
    gmap = gguf_names(model)
    items = []
    for n, g in gmap.items():
        if g is None:
            continue
        info = model.info(n)
        if not info.is_float or rt.never_retyped(info, g):
            continue
        items.append((g, n))
    items.sort(key=lambda t: _llama_order(t[0]))
    gset = {g for g, _ in items}
    tied = "output.weight" not in gset
    n_blocks = len({int(m.group(1)) for g in gmap.values() if g
                    for m in [re.match(r"blk\.(\d+)\.", g)] if m})
    n_attn_v = sum(1 for g, _ in items if _category(g) == "attn_v")
    counters = {"attn_v": 0, "ffn_down": 0}
    totals = {"attn_v": n_attn_v, "ffn_down": n_blocks}
    out = {}
    for g, n in items:
        info = model.info(n)
        ncols = int(info.shape[-1])            # ggml's ne[0]: the row length
        cat = _category(g)
        t = default
        if cat == "output" or (tied and cat == "token_embd"):
            if ncols % BLOCK[default] != 0:
                t = "q8_0"
            elif default != "q8_0":
                t = "q6_k"
        elif cat in ("attn_v", "ffn_down"):
            i, tot = counters[cat], totals[cat]
            rule = r.get(cat)
            if rule is not None:
                cond, typ = rule
                if (cond == "more_bits" and _use_more_bits(i, tot)) or \
                        (cond == "first_eighth" and i < tot // 8) or (cond == "first4" and i < 4):
                    t = typ
            counters[cat] += 1
        if ncols % BLOCK[t] != 0:              # tensor_type_fallback
            f = FALLBACK.get(t, t)
            t = f if ncols % BLOCK[f] == 0 else "fp16"
        out[n] = t
    return out


def recipe_points(model, ftypes=("Q4_K_M", "Q5_K_M"), table=None,
                  target: str | None = None) -> list[FrontierPoint]:
    """The plans llama-quantize would make for each ftype (module doc), counted as evaluate
    counts them for the table's runtime (default llama.cpp without a table). `predicted` is
    None where the table lacks one of the recipe's types for a tensor."""
    from workbench.quant.evaluate import evaluate
    from workbench.core.progress import run
    out = []
    for f in ftypes:
        a = recipe_assignment(model, f)
        plan = Plan(default=KEEP).with_assignments(a)
        if table is not None:
            _check_target(table, target)
            full = {n: a.get(n, KEEP) for n in table.names}
            if all((n, s) in table.bytes for n, s in full.items()):
                nbytes = table.bytes_of(full)
                pred = table.predicted(full)
                out.append(FrontierPoint("recipe", f.upper(), None, 8.0 * nbytes / table.params,
                                         nbytes, pred, full, plan))
                continue
        ev = run(evaluate(model, plan, runtime=target or (table.runtime if table else
                                                          "llama.cpp")))
        full = {n: a.get(n, KEEP) for n in (table.names if table else a)}
        pred = None
        if table is not None and all((n, s) in table.values for n, s in full.items()):
            pred = table.predicted(full)
        out.append(FrontierPoint("recipe", f.upper(), None, ev.totals.bits_per_weight,
                                 ev.totals.bytes_after, pred, full, plan))
    return out


def check_points(model, points, calib=None, samples=None, runtime: str = "any", progress=None,
                 cancel=None) -> list[FrontierPoint]:
    """Measure each point end to end (workbench.running.runner_jobs.check: cosine for encoders, KL / top-1 /
    perplexity for causal LMs) with the scheme `runtime` applies to each tensor; fills
    `point.checked`."""
    from workbench.core.progress import run
    return run(check_points_job(model, points, calib, samples, runtime), progress, cancel)


def check_points_job(model, points, calib=None, samples=None, runtime: str = "any"):
    """Job: :func:`check_points`, one progress over every point ('check 2/17 q4_k: ...')."""
    from workbench.core.progress import Progress, prefixed, subjob
    from workbench.running.runner_jobs import check
    from workbench.quant.streaming import dequantized
    from workbench.quant.runtimes import plan_decisions
    for k, p in enumerate(points):
        what = f"check {k + 1}/{len(points)} {p.label}: "
        yield Progress(k, len(points), what + "quantizing")
        dec = plan_decisions(model, p.plan, runtime)
        weights = {n: dequantized(model, n, d.applied) for n, d in dec.items()
                   if d.applied != KEEP}
        job = subjob(check(model, p.plan, calib, samples, weights=weights), k, 1, len(points))
        p.checked = yield from prefixed(job, what)
    return points

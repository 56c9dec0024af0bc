"""Per-tensor, per-scheme sensitivity: four measures, one table the CLI, GUI and allocator share.

* ``weight``: squared reconstruction error (evaluate's sse).
* ``activation``: sum_j E[x_j^2] * ||dW[:, j]||^2 with E[x_j^2] from calibration (or an imatrix),
  the quantity llama.cpp's imatrix weights the K-quant search with. Embedding tables (whose input
  is a one-hot token / position / type) are weighted by how often each row is used in the
  calibration samples: sum_t p(t) * ||dW[t, :]||^2, the same per-token output error.
* ``fisher``: 1/2 sum_ij F_ij * dW_ij^2 with F the diagonal of the output measure's Fisher
  information per weight, estimated from one calibration pass with random probes (see
  `fisher_diagonals`): the activation-weighted error with each weight also weighted by how much
  a change of its output reaches the model's output (E[g_i^2 x_j^2], g the gradient arriving at
  the layer's output). Its value estimates the ``output`` measure (second order) without running
  the model once per tensor and scheme.
* ``output``: the measured change of the model's outputs with only that tensor quantized (all
  others original): mean KL divergence of next-token distributions (causal LM, nats per token) or
  mean 1 - cosine of the mean-pooled sentence embeddings (encoders), over the calibration samples.
  Cached on disk (workbench.core.cache) by the content of the model's files and config.json, the
  calibration samples' token ids, the device, tensor and applied scheme, under
  ``$XDG_CACHE_HOME/quant-workbench/output-sensitivity`` (``~/.cache`` without it).

Mixture-of-experts (docs/moe.md): routers are not a choice (they stay in float unless pinned);
with target ``llama.cpp`` one projection's experts of a layer are one decision (llama.cpp stores
them as one merged tensor of one type: `SensitivityTable.groups`), with ``vllm`` every expert of a
layer (vLLM's FusedMoE quantizes them as one layer); and where the measure does
not already see the routing (``weight`` with --calib, ``activation``), each expert's value is
weighted by the fraction of calibration tokens the router sends to it (`expert_usage`), so an
expert every token reaches counts like a dense layer and a rarely picked one little.

Every value is for the scheme the runtime applies (workbench.quant.runtimes.decide: a scheme whose
block does not divide a tensor's rows falls back), so values and bytes describe the same tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from workbench.core.errors import WorkbenchError, one_line
from workbench.quant.plan import KEEP
from workbench.quant.runtimes import runtime_and_names
from workbench.core.progress import Progress, run as run_job
from workbench.quant.streaming import activation_error
from workbench.planning.measures import get_measure, list_measures, measure_names
from workbench.planning.sizes import _bytes_as, below_smallest_message

#: the measures' names (workbench.planning.measures holds their facts)
MEASURES = measure_names()


# ---- activation statistics -------------------------------------------------------------------
def embedding_usage(model, calib=None, samples=None, max_len: int = 128):
    """Job: {workbench name: p(row)} for the runnable model's embedding tables (token, position,
    token type) from the calibration samples: how often each row is looked up, per token."""
    import torch
    from workbench.running.calibration import calibration_samples
    from workbench.running.runner_passes import get_runner
    runner = get_runner(model)
    data = yield from calibration_samples(model, calib, samples, max_len)
    n_tok = sum(len(s) for s in data)
    out = {}
    for n, slot in runner.slots.items():
        mod, attr = runner._owner[slot.param]
        if not isinstance(mod, torch.nn.Embedding) or runner.block_of(n) != "pre":
            continue
        rows = int(mod.num_embeddings)
        hf = slot.param.lower()
        cnt = np.zeros(rows)
        if "position" in hf or ".wpe." in hf:
            off = int(runner.cfg.get("pad_token_id") or 0) + 1 \
                if runner.cfg.get("model_type") in ("roberta", "xlm-roberta") else 0
            for s in data:
                idx = np.arange(len(s)) + off
                np.add.at(cnt, idx[idx < rows], 1.0)
        elif "token_type" in hf:
            cnt[0] = n_tok
        else:
            for s in data:
                np.add.at(cnt, s[s < rows], 1.0)
        out[n] = cnt / max(n_tok, 1)
    return out


def activation_errors(model, schemes, moments: dict, usage: dict | None = None,
                      runtime: str = "any", executor=None):
    """Job: {(name, scheme): activation-weighted error} for the tensors with moments (and the
    embedding tables in `usage`). Values are for the scheme `runtime` applies. `executor`
    (workbench.jobs.cluster): one task per tensor on its workers."""
    from workbench.quant.runtimes import decide
    out = {}
    usage = usage or {}
    items = [n for n in model.tensors if n in moments or n in usage]
    if executor is not None:
        from workbench.jobs.cluster import is_plain
        if is_plain(model):
            return (yield from _activation_errors_cluster(executor, model, schemes, moments,
                                                          usage, runtime, items))
    for i, n in enumerate(items):
        yield Progress(i, len(items), f"sensitivity {i + 1}/{len(items)} {n}")
        info = model.info(n)
        for s in schemes:
            applied = decide(info, s, runtime).applied
            if applied == KEEP:
                out[(n, s)] = 0.0
            elif n in moments:
                out[(n, s)] = activation_error(model, n, applied, moments[n])
            else:
                out[(n, s)] = activation_error(model, n, applied, usage[n], rows=True)
    yield Progress(len(items), len(items), "done")
    return out


def _activation_errors_cluster(executor, model, schemes, moments, usage, runtime, items):
    from workbench.jobs.cluster import activation_task, signature
    from workbench.quant.runtimes import decide
    sig = signature(model)
    tasks, plans = [], []
    for n in items:
        info = model.info(n)
        applied = {s: decide(info, s, runtime).applied for s in schemes}
        todo = list(dict.fromkeys(a for a in applied.values() if a != KEEP))
        plans.append((n, applied, todo))
        if n in moments:
            tasks.append((sig, n, todo, moments[n], False))
        else:
            tasks.append((sig, n, todo, usage[n], True))
    weights = [max(model.info(n).numel, 1) * max(len(t), 1) for n, _a, t in plans]
    got = yield from executor.sweep(activation_task, tasks, "sensitivity", weights)
    out = {}
    for (n, applied, todo), vals in zip(plans, got):
        by = dict(zip(todo, vals))
        for s in schemes:
            out[(n, s)] = 0.0 if applied[s] == KEEP else by[applied[s]]
    return out


def predicted_unit(model, measure: str) -> str:
    """What a table's totals (the allocator's objective, frontier's "predicted") are in:
    ``kl`` (mean KL divergence of the next-token distributions, nats per token: the fisher and
    output measures on a causal LM; `check`'s ``kl_mean`` measures the same), ``1-cosine``
    (the same measures on an encoder: mean 1 - cosine of the pooled embeddings, `check`'s
    1 - ``cosine_mean``), else ``sensitivity`` (weight / activation: no output units)."""
    if not get_measure(measure).output_units:
        return "sensitivity"
    try:
        from workbench.running.runner_config import model_kind, read_config
        kind = model_kind(read_config(model))
    except Exception:                                # not runnable: no output units
        return "sensitivity"
    return "1-cosine" if kind == "encoder" else "kl"


def best_measure(model, calib=None, imatrix=None) -> tuple[str, str]:
    """(measure, why): the best sensitivity measure the inputs allow, the one of highest
    ``auto_rank`` (workbench.planning.measures) they can feed: fisher (an estimate of the
    output change, rank correlation 0.99 with it on MiniLM) when the model is runnable: a
    config.json of a supported architecture, the [model] extra installed and calibration
    inputs that tokenize; activation with an imatrix; weight otherwise."""
    ranked = sorted((m for m in list_measures() if m.auto_rank is not None),
                    key=lambda m: -m.auto_rank)
    why_not = None                     # why the model does not run ("" once it ran)
    for m in ranked:
        if m.refusal(calib, imatrix):
            continue
        if imatrix and m.takes_imatrix:
            return m.name, "an imatrix was given"
        if not m.runs_network(imatrix):
            return m.name, (f"the model is not runnable: {why_not}" if why_not
                            else "it reads the weights alone")
        if why_not is None:
            why_not = _not_runnable(model, calib)
        if not why_not:
            return m.name, "the model is runnable"
    raise WorkbenchError("no sensitivity measure takes these inputs")


def _not_runnable(model, calib) -> str:
    """Why the model cannot run on the calibration inputs, "" when it can."""
    if calib:       # a bad file given is refused, never taken as "not runnable"
        from workbench.running.inputs import validate_calibration_inputs
        validate_calibration_inputs(model, calib)
    try:
        from workbench.running.calibration import calibration_samples
        from workbench.running.runner_config import _import_transformers, model_kind, read_config
        model_kind(read_config(model))
        _import_transformers()
        run_job(calibration_samples(model, calib, 1))
    except WorkbenchError as exc:
        return one_line(str(exc)) or "it cannot run"
    return ""


# ---- the table --------------------------------------------------------------------------------
@dataclass
class SensitivityTable:
    """Per tensor x scheme: the measure and the bytes `evaluate` counts for `runtime`."""
    model_path: str
    measure: str
    runtime: str
    schemes: list[str]
    names: list[str]                                   # tensors with a choice
    values: dict = field(default_factory=dict)         # (name, scheme) -> float
    bytes: dict = field(default_factory=dict)          # (name, scheme) -> int
    applied: dict = field(default_factory=dict)        # (name, scheme) -> applied scheme
    params: int = 0                                    # every tensor's params (evaluate's)
    fixed_bytes: int = 0                               # bytes of the tensors without a choice
    fixed_names: list[str] = field(default_factory=list)
    #: tensors the runtime fuses into one layer (vLLM's q/k/v, gate/up): one scheme per group
    groups: list = field(default_factory=list)
    #: {expert tensor: fraction of calibration tokens routed to it} the values were weighted by
    usage: dict = field(default_factory=dict)
    #: {(name, scheme): method} where a method other than rtn gave the value
    #: (workbench.planning.allocate_methods; absent pairs are rtn)
    methods: dict = field(default_factory=dict)

    def copy(self) -> "SensitivityTable":
        """A shallow copy whose values and methods can change without touching this one's."""
        import copy
        out = copy.copy(self)
        out.values, out.methods = dict(self.values), dict(self.methods)
        return out

    def value(self, name: str, scheme: str) -> float:
        return self.values[(name, scheme)]

    def bytes_of(self, assignment: dict[str, str]) -> int:
        """Total bytes of a plan assigning `assignment` (every tensor in `names`)."""
        return self.fixed_bytes + sum(self.bytes[(n, assignment[n])] for n in self.names)

    def bits_per_weight(self, assignment: dict[str, str]) -> float:
        return 8.0 * self.bytes_of(assignment) / self.params if self.params else 0.0

    def predicted(self, assignment: dict[str, str]) -> float:
        """Total sensitivity of an assignment (the allocator's objective)."""
        return float(sum(self.values[(n, assignment[n])] for n in self.names))

    def budget_bytes(self, budget_bytes: int | None = None, budget_bpw: float | None = None) -> int:
        if budget_bytes is None:
            if budget_bpw is None:
                raise WorkbenchError("give budget_bpw= or budget_bytes=",
                                     params=("budget_bpw", "budget_bytes"))
            budget_bytes = int(np.floor(budget_bpw * self.params / 8.0 + 1e-9))
        return int(budget_bytes)

    def plan_for(self, assignment: dict[str, str]):
        from workbench.quant.plan import Plan
        default = self.schemes[0] if self.schemes else KEEP
        return Plan(default=default).with_assignments(
            {n: assignment[n] for n in self.names})

    def solve(self, budget_bytes: int, pins: dict[str, str] | None = None):
        """(Plan, allocate.Solution): least total sensitivity within `budget_bytes` (the plan's
        totals.bytes as evaluate counts them), pinned tensors kept."""
        from workbench.planning.allocate import BelowSmallest, solve_detailed
        pins = dict(pins or {})
        for p, s in pins.items():
            if p not in self.names and p not in self.fixed_names:
                raise WorkbenchError(f"pinned tensor {p!r} is not in the model",
                                     path=self.model_path)
            if p in self.names and (p, s) not in self.bytes:
                raise WorkbenchError(f"pinned scheme {s} was not measured for {p}")
        # items: single tensors, or a fused group whose members take one scheme together
        grouped = {n: g for g in self.groups for n in g if all(m in self.names for m in g)}
        items, seen = [], set()
        for n in self.names:
            if n in seen:
                continue
            item = grouped.get(n, [n])
            seen.update(item)
            items.append(item)
        costs, errs, opts = [], [], []
        for item in items:
            pinned = {pins[m] for m in item if m in pins}
            if len(pinned) > 1:
                raise WorkbenchError(f"pins differ within a fused group the {self.runtime} "
                                     f"runtime needs one scheme for: {', '.join(item)}",
                                     path=self.model_path)
            cands = sorted(pinned) if pinned else [s for s in self.schemes
                                                   if all((m, s) in self.bytes for m in item)]
            opts.append(cands)
            costs.append([sum(int(self.bytes[(m, s)]) for m in item) for s in cands])
            errs.append([sum(float(self.values[(m, s)]) for m in item) for s in cands])
        try:
            sol = solve_detailed(costs, errs, budget_bytes - self.fixed_bytes)
        except BelowSmallest as exc:
            cheapest = self.fixed_bytes + sum(min(c) for c in costs)
            raise WorkbenchError(self._below_smallest(budget_bytes, cheapest),
                                 path=self.model_path) from exc
        assignment = {m: o[k] for item, o, k in zip(items, opts, sol.choice) for m in item}
        return self.plan_for(assignment), sol

    def _below_smallest(self, budget_bytes: int, cheapest: int) -> str:
        from workbench.formats.loaders import open_model
        try:
            model = open_model(self.model_path)
        except WorkbenchError:
            model = None
        return below_smallest_message(model, budget_bytes, cheapest, self.params,
                                      self.schemes, self.runtime)

    def assignment_of(self, plan, model) -> dict[str, str]:
        """The table's view of a plan: the scheme it requests per tensor with a choice."""
        out = {}
        for n in self.names:
            info = model.info(n)
            out[n] = plan.scheme_and_source(n, info.ndim, info.is_float)[0]
        return out

    def rows(self, scheme: str | None = None) -> list[str]:
        """Tensor names, most sensitive first (by `scheme`'s value, else the mean over schemes)."""
        def key(n):
            if scheme is not None:
                return self.values[(n, scheme)]
            return float(np.mean([self.values[(n, s)] for s in self.schemes]))
        return sorted(self.names, key=key, reverse=True)

    def to_dict(self) -> dict:
        return {"model": self.model_path, "measure": self.measure, "runtime": self.runtime,
                "schemes": list(self.schemes), "params": self.params,
                "fixed_bytes": self.fixed_bytes,
                "tensors": {n: {s: {"value": self.values[(n, s)], "bytes": self.bytes[(n, s)],
                                    "applied": self.applied[(n, s)]}
                                for s in self.schemes if (n, s) in self.values}
                            for n in self.rows()},
                **({"groups": [list(g) for g in self.groups]} if self.groups else {}),
                **({"expert_usage": {n: (v.tolist() if isinstance(v, np.ndarray) else v)
                                     for n, v in self.usage.items()}} if self.usage else {})}


def merged_expert_errors(model, name: str, scheme: str) -> np.ndarray:
    """Squared error per expert of a merged 3-D expert tensor under `scheme` (each expert's
    rows quantized alone: the row-wise schemes give the same bytes as the whole tensor)."""
    from workbench.quant.evaluate import quantize
    from workbench.running.moe import expert_slices
    from workbench.schemes import get_scheme
    out = []
    sch = get_scheme(scheme)
    for _e, w in expert_slices(model, name):
        if sch.ineligible_reason(w.shape):
            out.append(0.0)
            continue
        q = np.asarray(sch.dequantize(quantize(w, scheme, tensor=name)),
                       dtype=np.float64).reshape(w.shape)
        out.append(float(((q - w) ** 2).sum()))
    return np.array(out)


def build_table(model, schemes, errors: dict | None = None, runtime: str = "any",
                pins: dict | None = None, measure: str = "weight", missing_scale: float = 1.0,
                extra=(), usage: dict | None = None, executor=None):
    """Job: a SensitivityTable from given `errors[(name, scheme)]`; entries missing there (all of
    them when `errors` is None) are evaluate's sse times `missing_scale`. Bytes are
    evaluate_tensor's under `runtime`. `usage`: {expert tensor: routed-token fraction} to weight
    the experts' values by (workbench.running.moe.expert_usage). Routers are not a choice unless
    pinned; with llama.cpp one projection's experts of a layer form one group (`groups`).
    `executor` (workbench.jobs.cluster): every tensor x scheme is measured on its workers first."""
    from workbench.quant.evaluate import DEFAULT_EVAL_CACHE, evaluate_tensor
    from workbench.core.progress import subjob
    from workbench.quant.runtimes import decide
    rt, gnames = runtime_and_names(model, runtime)
    pins = dict(pins or {})
    for p in pins:
        if p not in model.tensors:
            raise WorkbenchError(f"pinned tensor {p!r} is not in the model", path=model.path)
    names, fixed, fixed_bytes, params = [], [], 0, 0
    values, nbytes, applied = {}, {}, {}
    all_names = list(model.tensors)
    rows = []   # (name, info, choosable, {scheme: decision}, KEEP's decision)
    for n in all_names:
        info = model.info(n)
        g = gnames.get(n) if gnames else None
        cands = list(dict.fromkeys(list(schemes) + list(extra)
                                   + ([pins[n]] if n in pins else [])))
        choosable = (info.ndim >= 2 and info.is_float and info.role != "router") or n in pins
        decs = {}
        if choosable:
            for s in cands:
                decs[s] = decide(info, s, rt, explicit=True, gguf_name=g)
            if all(d.kind in ("kept", "skipped") for d in decs.values()) and n not in pins:
                choosable = False
        rows.append((n, info, choosable, decs, decide(info, KEEP, rt)))
    span = 0
    if executor is not None:
        from workbench.jobs.cluster import is_plain, prefetch_evaluations
        if is_plain(model):
            reqs = [(n, KEEP, dk) for n, _i, _c, _d, dk in rows]
            reqs += [(n, s, d) for n, _i, c, decs, _dk in rows if c for s, d in decs.items()]
            span = 95
            yield from subjob(prefetch_evaluations(executor, model, reqs, DEFAULT_EVAL_CACHE,
                                                   "measuring"), 0, span, 100)
    for i, (n, info, choosable, decs, dk) in enumerate(rows):
        yield Progress(span + (100 - span) * i / max(len(rows), 1), 100,
                       f"sizes {i + 1}/{len(rows)} {n}")
        params += info.numel
        if not choosable:
            fixed_bytes += _bytes_as(info, dk)
            fixed.append(n)
            continue
        names.append(n)
        nbytes[(n, KEEP)] = _bytes_as(info, dk)
        values[(n, KEEP)] = 0.0
        applied[(n, KEEP)] = KEEP
        for s, d in decs.items():
            applied[(n, s)] = d.applied
            if errors is not None and (n, s) in errors:
                # the measure gave the value: the bytes follow from the shape (the same count
                # evaluate makes), so the tensor is not quantized a second time here
                nbytes[(n, s)] = _bytes_as(info, d)
                values[(n, s)] = float(errors[(n, s)])
                from_sse = False
            else:
                r = evaluate_tensor(model, n, s, decision=d)
                nbytes[(n, s)] = int(r.bytes)
                values[(n, s)] = float(r.error.sse) * missing_scale
                from_sse = True
            u = (usage or {}).get(n)
            if u is not None and d.applied != KEEP:   # weight by the routed-token fraction
                if not isinstance(u, np.ndarray):
                    values[(n, s)] *= float(u)
                elif from_sse and missing_scale:      # merged: sum_e f_e * sse_e
                    values[(n, s)] = float(merged_expert_errors(model, n, d.applied) @ u) \
                        * missing_scale
                else:
                    values[(n, s)] *= float(np.mean(u))
    yield Progress(100, 100, "sizes")
    from workbench.running.moe import decision_groups
    from workbench.quant.runtimes import fused_groups
    groups = merge_groups(fused_groups(names, rt.name)
                          + list(decision_groups(model, names, rt.name).values()))
    return SensitivityTable(str(model.path), measure, rt.name, list(schemes), names, values,
                            nbytes, applied, params, fixed_bytes, fixed, groups,
                            dict(usage or {}))


def merge_groups(groups) -> list[list[str]]:
    """Groups that share a tensor joined into one (vLLM's fused gate/up of an expert and
    a runtime's expert group are one decision together), in first-seen order."""
    out: list[list[str]] = []
    for g in groups:
        g = list(dict.fromkeys(g))
        hit = [o for o in out if set(o) & set(g)]
        for o in hit:
            out.remove(o)
            g = list(dict.fromkeys(o + g))
        out.append(g)
    return out


def _has_experts(model) -> bool:
    return any(model.info(n).role == "expert" for n in model.tensors)


def routing_usage(model, calib=None, samples=None):
    """Job: {expert tensor: routed-token fraction} (workbench.running.moe.find_expert_usage: the
    runner's expert_usage when it has one), or {} when the model cannot run."""
    from workbench.running.moe import find_expert_usage
    try:
        return (yield from find_expert_usage()(model, calib, samples))
    except WorkbenchError:
        return {}


def sensitivity_table_job(model, schemes, measure: str = "weight", calib=None, imatrix=None,
                          samples=None, runtime: str = "any", pins: dict | None = None,
                          extra=(), expert_weighting: bool | None = None, executor=None,
                          use_cache: bool = True):
    """Job: the SensitivityTable for `measure` (see the module doc). Activation measure: tensors
    the statistics do not reach get their weight error times the mean second moment. `extra`:
    schemes measured too (e.g. a recipe's types) that the allocator does not choose from.
    `expert_weighting`: weight experts by how often the router picks them (None: for the
    ``activation`` measure, and ``weight`` when `calib` is given, on a mixture of experts; the
    ``fisher`` and ``output`` measures already see the routing). `executor`
    (workbench.jobs.cluster): the per-tensor weight and activation work runs on its workers.
    `use_cache` False: the output measure's cache is neither read nor written."""
    from workbench.core.progress import subjob
    from workbench.planning.measure_jobs import MeasureInputs
    from workbench.schemes import get_scheme
    schemes = [get_scheme(s).name for s in schemes]
    m = get_measure(measure)           # an unknown name: refused, the measures listed
    extra = [get_scheme(s).name for s in extra]
    cands = list(dict.fromkeys(list(schemes) + extra + list((pins or {}).values())))
    errors, scale = None, 1.0
    if m.values is not None:
        errors, scale = yield from subjob(m.values(MeasureInputs(
            model, cands, calib, imatrix, samples, runtime, executor, use_cache)), 0, 80, 100)
    start = 0 if errors is None else 80
    if expert_weighting is None:
        expert_weighting = m.weighs_experts(calib)
    usage = {}
    if expert_weighting and not imatrix and _has_experts(model):
        usage = yield from subjob(routing_usage(model, calib, samples), start, 5, 100)
        start += 5
    table = yield from subjob(build_table(model, schemes, errors, runtime, pins, measure, scale,
                                          extra, usage, executor),
                              start, 100 - start, 100)
    return table


def sensitivity_table(model, schemes, measure: str = "weight", calib=None, imatrix=None,
                      samples=None, progress=None, cancel=None, runtime: str = "any",
                      pins: dict | None = None, extra=(), executor=None) -> SensitivityTable:
    """Per tensor x scheme: the measure (weight | activation | output) plus the bytes evaluate
    counts, the one table the CLI, the GUI and the allocator share. `progress(Progress)`,
    `cancel() -> bool` (raises workbench.core.errors.Cancelled)."""
    return run_job(sensitivity_table_job(model, schemes, measure, calib, imatrix, samples,
                                         runtime, pins, extra, executor=executor),
                   progress, cancel)

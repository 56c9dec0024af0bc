"""The jobs behind :mod:`app.effects`, Qt-free generators run on the compute thread: the
sensitivity table (SensTable, from workbench.api.measure_sensitivity), the budget's
allocation (workbench.api.allocate_plan, as `quant-workbench allocate`), the end-to-end check,
and the size / predicted-error frontier (Point: allocations over the cached table by
workbench.planning.allocate), with the predicted error and the bytes of a plan."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.api.plans import KEEP
from workbench.core.progress import Progress

FRONTIER_POINTS = 12


def reads_calibration(measure: str) -> bool:
    """Whether the table of `measure` reads the calibration text (the registry's fact;
    "auto" may choose a measure that does)."""
    from workbench.api.choices import get_measure
    return measure == "auto" or get_measure(measure).reads_calibration


def allocatable(model) -> list[str]:
    """Tensors the allocator chooses a scheme for (float matrices, as workbench.planning.allocate)."""
    return [n for n, i in model.tensors.items() if i.ndim >= 2 and i.is_float]


# ---- the sensitivity table ------------------------------------------------------------------------

@dataclass
class SensTable:
    """Per (tensor, scheme): sensitivity under one measure and the bytes evaluate counts."""
    measure: str
    names: list[str]
    schemes: list[str]
    err: dict = field(default_factory=dict)       # (name, scheme) -> float
    nbytes: dict = field(default_factory=dict)    # (name, scheme) -> int
    params: int = 0
    #: the allocator's / frontier's candidates (`schemes` may also hold the current plan's
    #: other schemes, so the current plan can be placed on the same axes)
    candidates: list = field(default_factory=list)
    #: why the measure was chosen (workbench.api.resolve_measure's reason) and the samples read
    reason: str = "given"
    samples: int | None = None

    def __post_init__(self):
        if not self.candidates:
            self.candidates = list(self.schemes)

    def merged(self, other: "SensTable") -> "SensTable":
        extra = [s for s in other.schemes if s not in self.schemes]
        return SensTable(self.measure, self.names, self.schemes + extra,
                         {**other.err, **self.err}, {**other.nbytes, **self.nbytes}, self.params,
                         list(self.candidates), self.reason, self.samples)

    def row(self, name: str) -> np.ndarray:
        return np.array([self.err.get((name, s), np.nan) for s in self.schemes], np.float64)

    def matrix(self) -> np.ndarray:
        return np.array([self.row(n) for n in self.names], np.float64).reshape(
            len(self.names), len(self.schemes))

    def value(self, name: str, scheme: str) -> float | None:
        v = self.err.get((name, scheme))
        return None if v is None or not np.isfinite(v) else float(v)


def table_job(model, schemes, measure: str, calib=None, samples=None, runner=None):
    """Job: a SensTable from the API's workbench.api.measure_sensitivity (what `quant-workbench
    sensitivity` / `allocate` measure): `schemes` "auto" (or ["auto"]) is the runtime's
    candidates, `measure` "auto" the best measure the model allows (the table's `measure` is
    the one chosen, `reason` why); `calib` None: the shipped text; `samples` None: the API's
    default. Its stages run on the compute thread (app.api_jobs: progress, cancel). `runner`:
    its cluster setting (app.cluster_setting) says where the per-tensor work runs."""
    from workbench import api

    from .api_jobs import api_job
    from .cluster_setting import executor_of
    from .gguf_source import live_source
    executor = executor_of(runner) if runner is not None else None
    src = yield from live_source(model)       # a GGUF: its live model, as the CLI runs it
    name = src.to_gguf.get if src is not None else (lambda n: n)
    req = schemes if isinstance(schemes, str) else ",".join(schemes)
    res = yield from api_job(lambda d: api.measure_sensitivity(
        src.live if src is not None else model, req, measure=measure,
        calib=calib if reads_calibration(measure) else None, samples=samples, executor=executor,
        driver=d))
    schemes = list(res.schemes)
    err = {(name(n), s): float(v) for (n, s), v in res.values.items()
           if s in schemes and name(n) is not None}
    nbytes = {(name(n), s): int(v) for (n, s), v in res.bytes.items() if name(n) is not None}
    names = [name(n) for n in res.names if name(n) is not None]
    return SensTable(res.measure, names, schemes, err, nbytes, int(res.params),
                     reason=getattr(res, "measure_reason", "given"),
                     samples=getattr(res, "samples", samples))


# ---- allocation and the frontier -------------------------------------------------------------------

@dataclass
class Point:
    """One plan on the frontier plot: its size (as evaluate counts it) and predicted error."""
    kind: str                  # "allocated" | "uniform" | "recipe"
    label: str
    bytes: int
    bits_per_weight: float
    predicted: float           # sum of the table's sensitivity over the allocatable tensors
    assignment: dict           # name -> scheme (allocatable tensors + pins)
    budget_bpw: float | None = None


def predicted_error(table: SensTable, assignment: dict) -> float | None:
    """Sum of the sensitivity of each allocatable tensor under its scheme (None if unknown)."""
    total = 0.0
    for n in table.names:
        s = assignment.get(n, KEEP)
        if s == KEEP:
            continue
        v = table.value(n, s)
        if v is None:
            return None
        total += v
    return total


def plan_bytes(model, assignment: dict, table: SensTable | None = None) -> int:
    """Total bytes of an assignment as evaluate counts them: a (tensor, scheme) the table
    measured has the bytes the API counted for it (nothing quantized again); any other is
    evaluated (cached per tensor)."""
    from workbench.api.tensors import evaluate_tensor
    known = table.nbytes if table is not None else {}
    total = 0
    for n in model.tensors:
        s = assignment.get(n, KEEP)
        b = known.get((n, s))
        total += b if b is not None else evaluate_tensor(model, n, s).bytes
    return int(total)


def allocation_job(model, budget_bpw=None, budget_bytes=None, schemes="auto",
                   measure: str = "auto", calib=None, samples=None, pins=None, runner=None):
    """Job: (workbench.api.Allocation, [its notes], its plan on `model`'s names) from
    workbench.api.allocate_plan with the API's defaults, as `quant-workbench allocate` runs
    it: the same candidates (those of the budget), measure, methods weighed and rules, so the
    plan is the one the command writes for the same model, budget and options (a GGUF: on
    its live model, as the CLI; the plan's names then carried back to the GGUF's). `pins`:
    the user's {tensor: scheme}."""
    from workbench import api

    from .api_jobs import api_job
    from .cluster_setting import executor_of
    from .gguf_source import live_source
    src = yield from live_source(model)
    if src is not None:
        model, pins = src.live, src.pins(pins or {})
    budget = (api.Budget.tensor_bytes(int(budget_bytes)) if budget_bytes is not None
              else api.Budget.bits_per_weight(float(budget_bpw)))
    executor = executor_of(runner) if runner is not None else None
    notes: list[str] = []
    req = schemes if isinstance(schemes, str) else ",".join(schemes)
    a = yield from api_job(lambda d: api.allocate_plan(
        model, budget, schemes=req, measure=measure, calib=calib, samples=samples,
        pins=dict(pins or {}), executor=executor, driver=d, say=notes.append))
    return a, notes, (src.back(a.plan) if src is not None else a.plan)


def llama_bound(model, plan) -> bool:
    """Whether the window plans `model` for llama.cpp: llama.cpp stores every scheme the plan
    asks, and the source is a GGUF or one scheme at least is a block type (a plan of
    q4_k / q6_k; not one of fp16 alone: the scheme's own block_size says which)."""
    from workbench.api.plans import get_runtime, get_scheme
    used = {s for s in plan.resolve(model).values() if s != KEEP}
    if any(get_runtime("llama.cpp").unsupported(s) for s in used):
        return False
    return getattr(model, "format", None) == "gguf" or any(
        get_scheme(s).block_size is not None for s in used)


def check_job(model, plan, calib, samples):
    """Job: the end-to-end check's figures, as `check --scoring lines` computes them
    (workbench.api.check_plan: the plan's methods fitted and applied, the fits cached); a GGUF
    source runs as the CLI runs it, converted on the fly (app.gguf_source). A plan bound to
    llama.cpp (:func:`llama_bound`) is checked with llama.cpp's activation rounding modelled
    (``emulate="llama.cpp"``, as `check --target llama.cpp`; the figures then carry
    "emulate")."""
    from workbench import api

    from .api_jobs import api_job
    from .gguf_source import live_source
    emulate = "llama.cpp" if llama_bound(model, plan) else None
    src = yield from live_source(model)
    if src is not None:
        model, plan = src.live, src.plan(plan)
    return (yield from api_job(lambda d: api.check_plan(
        model, plan, calib=calib, samples=samples, scoring="lines", emulate=emulate,
        driver=d)))


def allocate_job(model, table: SensTable, budget_bytes=None, budget_bpw=None, pins=None):
    """Job: (assignment, budget_bytes) from workbench.planning.allocate.allocate over the cached table."""
    from workbench.api.choices import allocate
    plan, budget = yield from allocate(model, table.candidates, budget_bytes, budget_bpw,
                                       pins or {}, table.err)
    assign = {r.match: r.scheme for r in plan.rules if not r.is_regex}
    return assign, budget


def _point(model, table, kind, label, assignment, budget_bpw=None) -> Point | None:
    pred = predicted_error(table, assignment)
    if pred is None:
        return None
    nb = plan_bytes(model, assignment, table)
    return Point(kind, label, nb, 8.0 * nb / max(table.params, 1), pred, assignment, budget_bpw)


def frontier_job(model, table: SensTable, pins=None, n_points: int = FRONTIER_POINTS):
    """Job: [Point]: allocated plans over a range of budgets, uniform plans, llama.cpp's
    Q4_K_M / Q5_K_M recipes (workbench.planning.frontier.recipe_points, where it exists)."""
    pins = dict(pins or {})
    names = table.names
    points: list[Point] = []
    uniform = []
    for s in table.candidates:
        a = {n: pins.get(n, s) for n in names}
        a.update({n: v for n, v in pins.items() if n not in a})
        p = _point(model, table, "uniform", s, a)
        if p is not None:
            uniform.append(p)
    points += uniform
    yield Progress(5, 100, "uniform plans")
    if uniform:
        lo = min(p.bits_per_weight for p in uniform)
        hi = max(p.bits_per_weight for p in uniform)
        budgets = sorted(set(np.round(np.linspace(lo, hi, n_points), 6).tolist())
                         | {p.bits_per_weight for p in uniform})
        for k, b in enumerate(budgets):
            yield Progress(5 + 85 * k / len(budgets), 100, f"allocating for {b:.2f} bits/weight")
            try:
                a, _ = yield from allocate_job(model, table, None, float(b) + 1e-9, pins)
            except WorkbenchError:
                continue
            a.update({n: v for n, v in pins.items() if n not in a})
            p = _point(model, table, "allocated", f"{b:.2f} bpw", a, float(b))
            if p is not None:
                points.append(p)
    try:
        from workbench.api.choices import frontier as F
        recipes = F.recipe_points(model, ["Q4_K_M", "Q5_K_M"])
    except (ImportError, AttributeError, WorkbenchError, TypeError):
        recipes = []
    for r in recipes:
        a = getattr(r, "assignment", None)
        if a is None and getattr(r, "plan", None) is not None:
            a = r.plan.resolve(model)
        if not a:
            continue
        a = {n: s for n, s in a.items() if n in model.tensors}
        p = _point(model, table, "recipe", getattr(r, "label", None) or getattr(r, "name", "recipe"),
                   a)
        if p is not None:
            points.append(p)
    yield Progress(100, 100, "frontier ready")
    return points

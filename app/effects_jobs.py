"""The jobs behind :mod:`app.effects`, Qt-free generators run on the compute thread: the
sensitivity table (SensTable, from workbench.planning.sensitivity), an allocation over it
(workbench.planning.allocate) and the size / predicted-error frontier (Point), with the
predicted error and the bytes of a plan."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.quant.plan import KEEP
from workbench.core.progress import Progress, subjob

FRONTIER_POINTS = 12


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

    def __post_init__(self):
        if not self.candidates:
            self.candidates = list(self.schemes)

    def merged(self, other: "SensTable") -> "SensTable":
        extra = [s for s in other.schemes if s not in self.schemes]
        return SensTable(self.measure, self.names, self.schemes + extra,
                         {**other.err, **self.err}, {**other.nbytes, **self.nbytes}, self.params,
                         list(self.candidates))

    def row(self, name: str) -> np.ndarray:
        return np.array([self.err.get((name, s), np.nan) for s in self.schemes], np.float64)

    def matrix(self) -> np.ndarray:
        return np.array([self.row(n) for n in self.names], np.float64).reshape(
            len(self.names), len(self.schemes))

    def value(self, name: str, scheme: str) -> float | None:
        v = self.err.get((name, scheme))
        return None if v is None or not np.isfinite(v) else float(v)


def table_job(model, schemes, measure: str, calib=None, samples=None, cancelled=None,
              runner=None):
    """Job: a SensTable from workbench.planning.sensitivity.sensitivity_table_job (its progress reaches
    the status bar; a cancel stops it between steps, and the cluster's tasks with it). Sizes
    are the bytes `evaluate` counts. `runner`: its cluster setting (app.cluster_setting) says
    where the per-tensor work runs."""
    from workbench.planning import sensitivity as S
    from workbench.quant.evaluate import evaluate_tensor

    from .cluster_setting import executor_of
    names = allocatable(model)
    schemes = list(schemes)
    params = sum(i.numel for i in model.tensors.values())
    t = SensTable(measure, names, schemes, params=params)
    executor = executor_of(runner) if runner is not None else None
    res = yield from subjob(S.sensitivity_table_job(model, schemes, measure,
                                                    calib if measure != "weight" else None,
                                                    None, samples, executor=executor),
                            0, 60, 100)
    t.err = {k: float(v) for k, v in res.values.items()}
    yield Progress(60, 100, "sensitivity table")
    for i, n in enumerate(names):
        if i % 8 == 0:
            yield Progress(60 + 40 * i / max(len(names), 1), 100, f"sizes: {n}")
        for s in schemes:
            t.nbytes[(n, s)] = int(evaluate_tensor(model, n, s).bytes)
    yield Progress(100, 100, "sensitivity table ready")
    return t


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


def plan_bytes(model, assignment: dict) -> int:
    """Total bytes of an assignment as evaluate counts them (cached per tensor)."""
    from workbench.quant.evaluate import evaluate_tensor
    return int(sum(evaluate_tensor(model, n, assignment.get(n, KEEP)).bytes
                   for n in model.tensors))


def allocate_job(model, table: SensTable, budget_bytes=None, budget_bpw=None, pins=None):
    """Job: (assignment, budget_bytes) from workbench.planning.allocate.allocate over the cached table."""
    from workbench.planning.allocate import allocate
    plan, budget = yield from allocate(model, table.candidates, budget_bytes, budget_bpw,
                                       pins or {}, table.err)
    assign = {r.match: r.scheme for r in plan.rules if not r.is_regex}
    return assign, budget


def _point(model, table, kind, label, assignment, budget_bpw=None) -> Point | None:
    pred = predicted_error(table, assignment)
    if pred is None:
        return None
    nb = plan_bytes(model, assignment)
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
        from workbench.planning import frontier as F
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

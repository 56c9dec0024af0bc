"""Budget allocation: one scheme per tensor minimizing total sensitivity within a byte budget.

A multiple-choice knapsack: each tensor's options (bytes, error) are reduced to their lower
convex hull, a Lagrange multiplier is bisected so that per-tensor argmin(error + lam*bytes) fits
the budget, then the slack is repaired greedily (best error decrease per byte among the hull
upgrades that still fit). The result never exceeds the budget.
"""

from __future__ import annotations

import numpy as np

from .errors import WorkbenchError
from .progress import Progress


def lower_hull(costs, errors) -> list[int]:
    """Indices of the options on the lower-left convex hull, by increasing cost."""
    order = sorted(range(len(costs)), key=lambda k: (costs[k], errors[k]))
    pts: list[int] = []
    for k in order:
        if pts and costs[k] == costs[pts[-1]]:
            continue  # same cost, higher error
        if pts and errors[k] >= errors[pts[-1]]:
            continue  # dominated
        while len(pts) >= 2:
            a, b = pts[-2], pts[-1]
            # b is above the segment a -> k: remove
            cross = (costs[b] - costs[a]) * (errors[k] - errors[a]) - \
                    (errors[b] - errors[a]) * (costs[k] - costs[a])
            if cross <= 0:
                pts.pop()
            else:
                break
        pts.append(k)
    return pts


def solve(costs: list[list[int]], errors: list[list[float]], budget: int) -> list[int]:
    """Choice index per item with sum(cost) <= budget, minimizing sum(error) (hull + Lagrange
    + greedy repair). Raises WorkbenchError if even the cheapest choices exceed the budget."""
    n = len(costs)
    hulls = [lower_hull(c, e) for c, e in zip(costs, errors)]
    hc = [np.asarray([costs[i][k] for k in h], dtype=np.float64) for i, h in enumerate(hulls)]
    he = [np.asarray([errors[i][k] for k in h], dtype=np.float64) for i, h in enumerate(hulls)]
    cheapest = sum(int(c[0]) for c in hc)
    if cheapest > budget:
        raise WorkbenchError(f"budget {budget} bytes is below the smallest possible size "
                             f"{cheapest} bytes")

    def pick(lam):
        return [int(np.argmin(e + lam * c)) for c, e in zip(hc, he)]

    def total(sel):
        return sum(hc[i][s] for i, s in enumerate(sel))

    sel = pick(0.0)
    if total(sel) > budget:
        lo, hi = 0.0, 1.0
        while total(pick(hi)) > budget:
            hi *= 4.0
        for _ in range(100):
            mid = 0.5 * (lo + hi)
            if total(pick(mid)) > budget:
                lo = mid
            else:
                hi = mid
            if hi - lo <= 1e-12 * hi:
                break
        sel = pick(hi)
    # repair: spend the slack on the upgrades with the best error decrease per byte
    slack = budget - total(sel)
    while True:
        best, best_i, best_k = 0.0, -1, -1
        for i in range(n):
            s = sel[i]
            for k in range(s + 1, len(hc[i])):
                dc = hc[i][k] - hc[i][s]
                if dc > slack:
                    break
                gain = (he[i][s] - he[i][k]) / max(dc, 1e-300)
                if gain > best:
                    best, best_i, best_k = gain, i, k
        if best_i < 0:
            break
        slack -= hc[best_i][best_k] - hc[best_i][sel[best_i]]
        sel[best_i] = best_k
    return [hulls[i][s] for i, s in enumerate(sel)]


def allocate(model, schemes: list[str], budget_bytes: int | None = None,
             budget_bpw: float | None = None, pins: dict[str, str] | None = None,
             errors: dict[tuple[str, str], float] | None = None):
    """Job: a Plan (explicit assignments) for `model` within the budget. Sizes are the bytes
    `evaluate` counts (fallbacks included); `errors[(name, scheme)]` is the sensitivity (default:
    the weight squared error from evaluate). The budget is the plan's totals.bytes or
    totals.bits_per_weight exactly as evaluate computes them."""
    from .evaluate import evaluate_tensor
    from .plan import Plan
    pins = dict(pins or {})
    names = list(model.tensors)
    params = sum(model.info(n).numel for n in names)
    if budget_bytes is None:
        if budget_bpw is None:
            raise WorkbenchError("give --budget-bpw or --budget-bytes")
        budget_bytes = int(np.floor(budget_bpw * params / 8.0 + 1e-9))
    for p in pins:
        if p not in model.tensors:
            raise WorkbenchError(f"pinned tensor {p!r} is not in the model", path=model.path)
    costs, errs, opts, fixed = [], [], [], 0
    from .plan import KEEP
    for i, n in enumerate(names):
        yield Progress(i, len(names), f"measuring {n}")
        info = model.info(n)
        if n not in pins and (info.ndim < 2 or not info.is_float):
            fixed += int(evaluate_tensor(model, n, KEEP).bytes)
            continue
        cands = [pins[n]] if n in pins else schemes
        c, e, o = [], [], []
        for s in cands:
            r = evaluate_tensor(model, n, s)
            o.append(s)
            c.append(int(r.bytes))
            e.append(float(errors[(n, s)]) if errors and (n, s) in errors else float(r.error.sse))
        costs.append(c)
        errs.append(e)
        opts.append((n, o))
    sel = solve(costs, errs, budget_bytes - fixed)
    assignment = {}
    for (n, o), k in zip(opts, sel):
        assignment[n] = o[k]
    yield Progress(len(names), len(names), "solved")
    return Plan(default=schemes[0]).with_assignments(assignment), budget_bytes

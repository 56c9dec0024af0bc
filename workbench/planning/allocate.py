"""Budget allocation: one scheme per tensor minimizing total sensitivity within a byte budget.

A multiple-choice knapsack (integer bytes, float errors), solved in three stages:

1. **Lagrangian**: a multiplier ``lam`` is bisected so that each tensor's
   ``argmin(error + lam * bytes)`` (which always lies on the tensor's lower convex hull) fits the
   budget. This gives a feasible plan and the dual bound
   ``LB = sum_i min_k(e_ik + lam * c_ik) - lam * budget`` (no plan within the budget has a lower
   total error).
2. **Greedy repair**: the slack left under the budget is spent on the upgrades with the best error
   decrease per byte that still fit. Its total error is the incumbent ``UB``.
3. **Exact completion**: an option whose reduced cost ``e_ik + lam*c_ik - min_k(...)`` exceeds
   ``UB - LB`` cannot be in a better plan, and neither can one that does not fit beside the other
   tensors' cheapest options; tensors left with one option are fixed. The remaining core is solved
   exactly by merging Pareto sets of (bytes, error) partial plans tensor by tensor, pruned by the
   budget and the same Lagrangian bound. When that finishes within a fixed amount of work
   (``state_limit``, ``work_limit``: always on small cases) the result is the exact optimum
   (``Solution.exact``); otherwise the repaired Lagrangian plan is returned (within the budget,
   and ``Solution.bound`` says how far from optimal it can be at most).

The result never exceeds the budget (integer arithmetic on bytes).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.core.progress import Progress


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


@dataclass
class Solution:
    choice: list[int]       # option index per item
    cost: int               # total cost (bytes)
    error: float            # total error
    exact: bool             # proven optimal
    lam: float              # the Lagrange multiplier used
    bound: float            # Lagrangian lower bound on the optimum
    core: int               # items left undecided by the multiplier bounds
    states: int             # largest Pareto set in the exact stage


def _pareto(c: np.ndarray, e: np.ndarray, idx: np.ndarray):
    """Sort by cost and keep the options with strictly decreasing error."""
    o = np.lexsort((e, c))
    c, e, idx = c[o], e[o], idx[o]
    keep = np.ones(len(c), dtype=bool)
    best = np.inf
    for j in range(len(c)):
        if e[j] < best:
            best = e[j]
        else:
            keep[j] = False
    return c[keep], e[keep], idx[keep]


def _core_order(opts):
    """Merge order of the core: smallest cost range first (measured on synthetic 500 x 12
    tables: 2-7x less work than model order, most options first, or largest range first)."""
    return np.argsort([int(o[0].max() - o[0].min()) for o in opts], kind="stable")


def solve(costs: list[list[int]], errors: list[list[float]], budget: int) -> list[int]:
    """Choice index per item with sum(cost) <= budget, minimizing sum(error). Raises
    WorkbenchError if even the cheapest choices exceed the budget."""
    return solve_detailed(costs, errors, budget).choice


class BelowSmallest(WorkbenchError):
    """A budget below the cheapest choice of every item (`cheapest` bytes): callers that know
    the model say it in its terms (workbench.planning.sizes.below_smallest_message)."""

    def __init__(self, budget: int, cheapest: int):
        super().__init__(f"budget {budget:,d} bytes is below the smallest possible size "
                         f"{cheapest:,d} bytes")
        self.budget, self.cheapest = int(budget), int(cheapest)

    def __reduce__(self):
        return (BelowSmallest, (self.budget, self.cheapest))


def solve_detailed(costs, errors, budget: int, state_limit: int = 200_000,
                   work_limit: int = 40_000_000, time_limit: float | None = None) -> Solution:
    """`solve` with the figures: cost, error, exactness, multiplier, bound, core size. The
    exact merge stops at `state_limit` states or `work_limit` steps, counts that give the same
    answer on any machine; `time_limit` (seconds of wall time, off by default) made the plan
    depend on the machine's load: MiniLM's default allocation, whose merge takes 0.02 s, was
    cut at 0.3 s on a busy machine and its plan's held-out cosine fell from 0.9954 to 0.9765.
    The work limit was 5 M steps until 28 Nov 2026: with 46 candidates (the 2026 formats and
    the budget's cut) MiniLM's merge needs about 8 M, and the cut-off Lagrangian plan put its
    word embeddings at int2-g32 (predicted 1 - cosine 0.0211 against the optimum's 0.0121;
    held-out cosine 0.9755). 40 M steps take about half a second here."""
    n = len(costs)
    if n == 0:
        return Solution([], 0, 0.0, True, 0.0, 0.0, 0, 0)
    K = max(len(c) for c in costs)
    if min(len(c) for c in costs) == 0:
        raise WorkbenchError("an item has no options")
    C = np.zeros((n, K), dtype=np.int64)
    E = np.full((n, K), np.inf)
    valid = np.zeros((n, K), dtype=bool)
    for i, (c, e) in enumerate(zip(costs, errors)):
        C[i, :len(c)] = np.asarray(c, dtype=np.int64)
        E[i, :len(e)] = np.asarray(e, dtype=np.float64)
        valid[i, :len(c)] = True
    if not np.isfinite(E[valid]).all():
        raise WorkbenchError("sensitivities must be finite numbers")
    big = np.iinfo(np.int64).max // (4 * n + 4)
    Cm = np.where(valid, C, big)
    # options ordered by cost so that argmin's first-index tie break picks the cheapest
    order = np.argsort(Cm, axis=1, kind="stable")
    C, E, valid, Cm = (np.take_along_axis(a, order, 1) for a in (C, E, valid, Cm))
    Cf = C.astype(np.float64)
    rows = np.arange(n)
    min_c = Cm.min(1)
    cheapest = int(min_c.sum())
    if cheapest > budget:
        raise BelowSmallest(budget, cheapest)
    budget = int(budget)

    def pick(lam):
        return np.argmin(E + lam * Cf, axis=1)

    def total(sel):
        return int(C[rows, sel].sum())

    # 1. Lagrangian bisection
    lam = 0.0
    sel = pick(0.0)
    if total(sel) > budget:
        lo, hi = 0.0, 1e-30
        while total(pick(hi)) > budget:
            lo, hi = hi, hi * 16.0
            if hi > 1e300:
                break
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            if mid <= lo or mid >= hi:
                break
            if total(pick(mid)) > budget:
                lo = mid
            else:
                hi = mid
            if hi - lo <= 1e-13 * hi:
                break
        lam = hi
        sel = pick(hi)
        if total(sel) > budget:   # numerically degenerate multipliers: the cheapest plan fits
            sel = np.argmin(Cm, axis=1)
    # 2. greedy repair: spend the slack
    slack = budget - total(sel)
    for _ in range(n * K + 1):
        cur_c = C[rows, sel]
        cur_e = E[rows, sel]
        dC = C - cur_c[:, None]
        dE = cur_e[:, None] - E
        ok = valid & (dC <= slack) & (dE > 0)
        if not ok.any():
            break
        gain = np.where(ok, dE / np.maximum(dC, 1).astype(np.float64), -1.0)
        gain[ok & (dC <= 0)] = np.inf
        flat = int(np.argmax(gain))
        i, k = divmod(flat, K)
        slack -= int(dC[i, k])
        sel[i] = k
    ub = float(E[rows, sel].sum())
    best_sel = sel.copy()
    # 3. reduced-cost fixing + exact Pareto merge over the core
    red = E + lam * Cf
    rowmin = red.min(1)
    lb = float(rowmin.sum() - lam * budget)
    tol = 1e-9 * (abs(ub) + abs(lb)) + 1e-300
    alive = valid & (lb + (red - rowmin[:, None]) <= ub + tol)
    alive &= (Cm - min_c[:, None]) <= (budget - cheapest)
    alive[rows, best_sel] = True
    n_alive = alive.sum(1)
    core = np.flatnonzero(n_alive > 1)
    exact, max_states = True, 0
    if len(core):
        fixed = np.flatnonzero(n_alive == 1)
        fsel = np.argmax(alive[fixed], axis=1)
        f_cost = int(C[fixed, fsel].sum())
        f_err = float(E[fixed, fsel].sum())
        cap = budget - f_cost
        ub_core = ub - f_err
        opts = []
        for i in core:
            ks = np.flatnonzero(alive[i])
            opts.append(_pareto(C[i, ks], E[i, ks], ks))
        okey = _core_order(opts)
        core = core[okey]
        opts = [opts[j] for j in okey]
        m = np.array([float((o[1] + lam * o[0]).min()) for o in opts])
        mc = np.array([int(o[0].min()) for o in opts])
        suf_m = np.concatenate([np.cumsum(m[::-1])[::-1], [0.0]])
        suf_c = np.concatenate([np.cumsum(mc[::-1])[::-1], [0]])
        sc = np.zeros(1, dtype=np.int64)
        se = np.zeros(1)
        parents, choices = [], []
        work = 0
        t_end = time.perf_counter() + time_limit if time_limit else None
        for j, (oc, oe, ok_) in enumerate(opts):
            work += len(sc) * len(oc)
            if work > work_limit or (t_end is not None and time.perf_counter() > t_end):
                exact = False
                break
            # one cost-sorted run per option (sc is sorted), pruned before merging
            pc, pe, pp, pk = [], [], [], []
            idx = np.arange(len(sc))
            slack_b = cap - suf_c[j + 1]
            for c1, e1, k1 in zip(oc, oe, ok_):
                nc1 = sc + c1
                ne1 = se + e1
                keep = (nc1 <= slack_b) & \
                    (ne1 + suf_m[j + 1] - lam * (cap - nc1) <= ub_core + tol)
                if keep.any():
                    pc.append(nc1[keep])
                    pe.append(ne1[keep])
                    pp.append(idx[keep])
                    pk.append(np.full(int(keep.sum()), k1))
            if not pc:
                nc = np.zeros(0, dtype=np.int64)
            else:
                nc, ne = np.concatenate(pc), np.concatenate(pe)
                par, ch = np.concatenate(pp), np.concatenate(pk)
                o = np.argsort(nc, kind="stable")      # timsort: merges the sorted runs
                nc, ne, par, ch = nc[o], ne[o], par[o], ch[o]
                run_min = np.minimum.accumulate(ne)
                keep = np.empty(len(ne), dtype=bool)
                keep[0] = True
                keep[1:] = ne[1:] < run_min[:-1]
                nc, ne, par, ch = nc[keep], ne[keep], par[keep], ch[keep]
                # equal costs: only the last kept (lowest error) survives
                last = np.ones(len(nc), dtype=bool)
                last[:-1] = nc[:-1] != nc[1:]
                nc, ne, par, ch = nc[last], ne[last], par[last], ch[last]
            max_states = max(max_states, len(nc))
            if len(nc) > state_limit or len(nc) == 0:
                exact = len(nc) == 0   # empty: nothing beats the incumbent
                break
            sc, se = nc, ne
            parents.append(par)
            choices.append(ch)
        else:
            b = int(np.argmin(se))
            if se[b] < float(E[core, best_sel[core]].sum()):
                for j in range(len(core) - 1, -1, -1):
                    best_sel[core[j]] = choices[j][b]
                    b = parents[j][b]
    cost = total(best_sel)
    assert cost <= budget
    choice = [int(order[i, k]) for i, k in enumerate(best_sel)]
    return Solution(choice, cost, float(E[rows, best_sel].sum()), exact, float(lam), lb,
                    int(len(core)), int(max_states))


def allocate(model, schemes: list[str], budget_bytes: int | None = None,
             budget_bpw: float | None = None, pins: dict[str, str] | None = None,
             errors: dict[tuple[str, str], float] | None = None, runtime: str = "any",
             table=None):
    """Job: (Plan, budget_bytes) for `model` within the budget. Sizes are the bytes `evaluate`
    counts for `runtime` (fallbacks included); `errors[(name, scheme)]` is the sensitivity
    (default: the weight squared error from evaluate), or give a `table`
    (workbench.planning.sensitivity.SensitivityTable) computed beforehand. The budget is the plan's
    totals.bytes or totals.bits_per_weight exactly as evaluate computes them."""
    from workbench.planning.sensitivity import SensitivityTable, build_table
    pins = dict(pins or {})
    if table is None:
        table = yield from build_table(model, schemes, errors, runtime=runtime, pins=pins)
    elif not isinstance(table, SensitivityTable):
        raise WorkbenchError("table must be a SensitivityTable")
    budget_bytes = table.budget_bytes(budget_bytes, budget_bpw)
    yield Progress(0, 1, "solving")
    plan, _sol = table.solve(budget_bytes, pins)
    yield Progress(1, 1, "solved")
    return plan, budget_bytes

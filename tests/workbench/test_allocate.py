import itertools

import numpy as np
import pytest

from workbench.allocate import lower_hull, solve
from workbench.errors import WorkbenchError


def brute(costs, errors, budget):
    best = None
    for sel in itertools.product(*[range(len(c)) for c in costs]):
        c = sum(costs[i][k] for i, k in enumerate(sel))
        if c <= budget:
            e = sum(errors[i][k] for i, k in enumerate(sel))
            if best is None or e < best:
                best = e
    return best


def test_lower_hull_drops_dominated_and_non_convex():
    # (cost, error): (1,10) (2,9.9) is above the segment (1,10)-(3,1); (4,2) is dominated
    assert lower_hull([1, 2, 3, 4], [10.0, 9.9, 1.0, 2.0]) == [0, 2]


def test_solve_never_exceeds_budget_and_is_near_brute_force():
    rng = np.random.default_rng(0)
    exact = 0
    for trial in range(60):
        n, k = int(rng.integers(2, 5)), int(rng.integers(2, 4))
        costs = [sorted(rng.integers(1, 20, size=k).tolist()) for _ in range(n)]
        errors = [sorted(rng.uniform(0, 10, size=k).tolist(), reverse=True) for _ in range(n)]
        lo, hi = sum(c[0] for c in costs), sum(c[-1] for c in costs)
        budget = int(rng.integers(lo, hi + 1))
        sel = solve(costs, errors, budget)
        assert sum(costs[i][s] for i, s in enumerate(sel)) <= budget
        got = sum(errors[i][s] for i, s in enumerate(sel))
        best = brute(costs, errors, budget)
        assert got >= best - 1e-9
        exact += abs(got - best) < 1e-9
    assert exact >= 45  # the hull + Lagrange + repair heuristic is exact on most random cases


def test_solve_refuses_impossible_budget():
    with pytest.raises(WorkbenchError):
        solve([[5, 10]], [[1.0, 0.5]], 4)

import itertools

import numpy as np
import pytest

from workbench.planning.allocate import lower_hull, solve, solve_detailed
from workbench.core.errors import WorkbenchError


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


def _instance(rng, n, k, shared_costs=False, hull_free=False):
    base = sorted(rng.integers(1, 40, size=k).tolist())
    costs, errors = [], []
    for _ in range(n):
        c = list(base) if shared_costs else rng.integers(1, 40, size=k).tolist()
        e = rng.uniform(0, 10, size=k)
        if not hull_free:   # mostly monotone (more bytes, less error), as real schemes are
            e = np.sort(e)[::-1][np.argsort(np.argsort(c))]
        costs.append(c)
        errors.append(e.tolist())
    return costs, errors


@pytest.mark.parametrize("shared,hull_free", [(False, False), (True, False), (False, True)])
def test_solve_is_exactly_optimal_against_brute_force(shared, hull_free):
    rng = np.random.default_rng(7 + 3 * shared + hull_free)
    for trial in range(150):
        n, k = int(rng.integers(1, 7)), int(rng.integers(1, 5))
        costs, errors = _instance(rng, n, k, shared, hull_free)
        lo, hi = sum(min(c) for c in costs), sum(max(c) for c in costs)
        budget = int(rng.integers(lo, hi + 1))
        sol = solve_detailed(costs, errors, budget)
        cost = sum(costs[i][s] for i, s in enumerate(sol.choice))
        got = sum(errors[i][s] for i, s in enumerate(sol.choice))
        assert cost <= budget and cost == sol.cost
        assert sol.exact
        assert got == pytest.approx(brute(costs, errors, budget), rel=1e-9, abs=1e-12), \
            (costs, errors, budget)
        assert sol.bound <= got + 1e-9


def test_greedy_alone_would_be_suboptimal_here():
    # item 0: +10 bytes for -5 error (0.5/byte); item 1: +6 bytes for -4 error (0.67/byte),
    # item 2: +6 bytes for -4 error. Budget 12 beyond the cheapest: the best is items 1 and 2
    costs = [[0, 10], [0, 6], [0, 6]]
    errors = [[5.0, 0.0], [4.0, 0.0], [4.0, 0.0]]
    assert solve(costs, errors, 12) == [0, 1, 1]
    # budget 10: item 0 alone (error 8) beats one of the 6-byte upgrades (error 9)
    assert solve(costs, errors, 10) == [1, 0, 0]


def test_large_instance_stays_within_budget_and_near_bound():
    rng = np.random.default_rng(1)
    n, k = 500, 12
    bpw = np.array([2.6, 3.4, 4.5, 5.0, 5.5, 6.0, 6.6, 8.5, 16, 4.1, 4.6, 5.1])[:k]
    sizes = rng.choice([384 * 384, 384 * 1536, 4096 * 4096, 1024 * 4096], size=n)
    costs = [np.ceil(s * bpw / 8).astype(int).tolist() for s in sizes]
    errors = [(s * rng.uniform(0.5, 2.0) * 2.0 ** (-2 * bpw)).tolist() for s in sizes]
    budget = int(sum(s for s in sizes) * 4.8 / 8)
    sol = solve_detailed(costs, errors, budget)
    assert sol.cost <= budget
    assert sol.error >= sol.bound - 1e-9 * abs(sol.bound)
    assert sol.error <= sol.bound * (1 + 1e-3)


def test_solve_refuses_impossible_budget():
    with pytest.raises(WorkbenchError):
        solve([[5, 10]], [[1.0, 0.5]], 4)

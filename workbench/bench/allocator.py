"""The allocator's speed on synthetic tables (`quant-workbench bench-allocate`): instances like a
transformer's weight matrices, timed in workbench.planning.allocate.solve_detailed."""

from __future__ import annotations

from workbench.core.checks import check_int

#: the largest instance timed (the largest MoE checkpoints hold ~50,000 weight matrices) and
#: the most instances; each bound keeps a run within minutes
MAX_TENSORS, MAX_SCHEMES, MAX_REPEAT = 100_000, 64, 1_000


def synthetic(n: int, k: int, seed: int):
    """Sizes like a transformer's weight matrices, schemes from 2 to 16 bits per weight, errors
    ~ size * 2^(-2 bits) with per-tensor and per-scheme noise, integer byte costs."""
    import numpy as np
    rng = np.random.default_rng(seed)
    bpw = np.sort(rng.uniform(2.0, 16.0, size=k))
    shapes = [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336), (384, 384), (1536, 384)]
    sizes = [int(np.prod(shapes[i])) for i in rng.integers(0, len(shapes), size=n)]
    costs, errors = [], []
    for s in sizes:
        costs.append(np.ceil(s * bpw / 8 * rng.uniform(0.97, 1.03, size=k)).astype(int).tolist())
        errors.append((s * rng.uniform(0.3, 3.0) * rng.uniform(0.8, 1.25, size=k)
                       * 2.0 ** (-2 * bpw)).tolist())
    lo, hi = sum(min(c) for c in costs), sum(max(c) for c in costs)
    budget = int(lo + (hi - lo) * rng.uniform(0.05, 0.6))
    return costs, errors, budget


def time_allocator(tensors: int = 500, schemes: int = 12, repeat: int = 10) -> list[dict]:
    """One row per instance (seed 0 .. repeat - 1): seconds of the solve, whether it is proven
    optimal, its gap to the Lagrangian bound, the core size and states, the budget and bytes."""
    import time

    from workbench.planning.allocate import solve_detailed
    check_int("tensors", tensors, 1, MAX_TENSORS)
    check_int("schemes", schemes, 1, MAX_SCHEMES)
    check_int("repeat", repeat, 1, MAX_REPEAT)
    rows = []
    for seed in range(repeat):
        costs, errors, budget = synthetic(tensors, schemes, seed)
        t0 = time.perf_counter()
        sol = solve_detailed(costs, errors, budget)
        dt = time.perf_counter() - t0
        if sol.cost > budget:
            raise RuntimeError(f"the allocator broke the budget on seed {seed}")
        gap = (sol.error - sol.bound) / abs(sol.bound) if sol.bound else 0.0
        rows.append({"seed": seed, "seconds": dt, "exact": sol.exact, "core": sol.core,
                     "states": sol.states, "gap_to_bound": gap, "budget": budget,
                     "bytes": sol.cost})
    return rows

"""`quant-workbench bench-allocate [--tensors 500] [--schemes 12] [--repeat 5] [--json]`: times
the allocator (workbench.allocate.solve_detailed) on synthetic tables."""

from __future__ import annotations

from ..common import print_json


def register(sub) -> None:
    p = sub.add_parser("bench-allocate", help="time the budget allocator on synthetic data")
    p.add_argument("--tensors", type=int, default=500)
    p.add_argument("--schemes", type=int, default=12)
    p.add_argument("--repeat", type=int, default=10, help="instances (different seeds)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


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


def run(args) -> int:
    import time
    from ...allocate import solve_detailed
    rows = []
    for seed in range(args.repeat):
        costs, errors, budget = synthetic(args.tensors, args.schemes, seed)
        t0 = time.perf_counter()
        sol = solve_detailed(costs, errors, budget)
        dt = time.perf_counter() - t0
        assert sol.cost <= budget
        gap = (sol.error - sol.bound) / abs(sol.bound) if sol.bound else 0.0
        rows.append({"seed": seed, "seconds": dt, "exact": sol.exact, "core": sol.core,
                     "states": sol.states, "gap_to_bound": gap, "budget": budget,
                     "bytes": sol.cost})
    worst = max(r["seconds"] for r in rows)
    if args.json:
        print_json({"tensors": args.tensors, "schemes": args.schemes, "runs": rows,
                    "max_seconds": worst})
        return 0
    print(f"allocate: {args.tensors} tensors x {args.schemes} schemes, {args.repeat} instances")
    for r in rows:
        print(f"  seed {r['seed']}: {1000 * r['seconds']:7.1f} ms  "
              f"{'optimal' if r['exact'] else 'not proven optimal'}, "
              f"{100 * r['gap_to_bound']:.4f}% above the Lagrangian bound, "
              f"core {r['core']} tensors, {r['states']} states")
    print(f"  slowest {1000 * worst:.1f} ms; proven optimal {sum(r['exact'] for r in rows)}"
          f"/{len(rows)}")
    return 0

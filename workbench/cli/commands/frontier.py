"""`quant-workbench frontier [MODEL] [--from-bpw X] [--to-bpw Y] [--points N] [--schemes ..]
[--calib F | --imatrix F] [--measure ..] [--samples N] [--target RT] [--recipes Q4_K_M,Q5_K_M]
[--check K] [--check-samples N] [--held-out FILE] [--json]`."""

from __future__ import annotations

from ..common import add_model_arg, open_model_arg, print_json
from .sensitivity import AUTO, add_table_args, parse_schemes, table_from_args


def register(sub) -> None:
    p = sub.add_parser("frontier", help="optimal plans over a range of budgets, beside the "
                                        "uniform plans and llama.cpp's recipes")
    add_model_arg(p)
    p.add_argument("--from-bpw", type=float, default=None,
                   help="smallest budget, bits per weight (default: the cheapest uniform plan)")
    p.add_argument("--to-bpw", type=float, default=None,
                   help="largest budget (default: the largest uniform plan)")
    p.add_argument("--points", type=int, default=8, help="allocated points (evenly spaced)")
    add_table_args(p, AUTO)
    p.add_argument("--recipes", default="Q4_K_M,Q5_K_M",
                   help="llama.cpp ftype recipes to place on the axes ('' for none)")
    p.add_argument("--check", type=int, default=0, metavar="K",
                   help="measure K allocated points (evenly chosen) and every uniform / recipe "
                        "point end to end (`check`)")
    p.add_argument("--check-samples", type=int, default=None,
                   help="calibration samples for --check (default: --samples)")
    p.add_argument("--held-out", default=None, metavar="FILE",
                   help="--check measures on these inputs instead of the calibration inputs")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args) -> int:
    import time

    import numpy as np

    from ...errors import WorkbenchError
    from ...frontier import (check_points, frontier, recipe_points, recipe_types,
                             uniform_points)
    schemes = parse_schemes(args.schemes, args.target)
    recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    extra = recipe_types(recipes) if recipes else []
    model = open_model_arg(args)
    t0 = time.perf_counter()
    table = table_from_args(args, model, schemes, quiet=args.json, extra=extra)
    t1 = time.perf_counter()
    uni = uniform_points(model, table)
    rec = []
    if recipes:
        try:
            rec = recipe_points(model, recipes, table)
        except WorkbenchError as exc:
            if not args.json:
                print(f"(no recipe points: {exc})")
    lo = args.from_bpw if args.from_bpw is not None else min(p.bits_per_weight for p in uni)
    hi = args.to_bpw if args.to_bpw is not None else max(p.bits_per_weight for p in uni)
    if args.points < 1 or hi < lo:
        raise WorkbenchError("need --points >= 1 and --to-bpw >= --from-bpw")
    budgets = [float(b) for b in np.linspace(lo, hi, args.points)] if args.points > 1 else [lo]
    t2 = time.perf_counter()
    alloc = frontier(model, None, table, budgets)
    t3 = time.perf_counter()
    if args.check:
        k = min(args.check, len(alloc))
        idx = sorted({int(round(i)) for i in np.linspace(0, len(alloc) - 1, k)}) if k else []
        targets = [alloc[i] for i in idx] + uni + rec
        if args.held_out:
            check_points(model, targets, args.held_out, args.check_samples,
                         runtime=table.runtime)
        else:
            check_points(model, targets, args.calib, args.check_samples or args.samples,
                         runtime=table.runtime)
    t4 = time.perf_counter()
    points = sorted(alloc + uni + rec, key=lambda p: p.bits_per_weight)
    secs = {"sensitivity": t1 - t0, "allocate": t3 - t2, "check": t4 - t3}
    if args.json:
        print_json({"measure": table.measure,
                    "measure_reason": getattr(args, "measure_reason", "given"), "target": table.runtime, "params": table.params,
                    "schemes": schemes, "seconds": secs,
                    "points": [p.to_dict(with_assignment=True) for p in points]})
        return 0
    print(f"frontier: {table.measure} measure, target {table.runtime}, {len(table.names)} tensors; "
          f"sensitivity {secs['sensitivity']:.1f} s, {len(alloc)} allocations "
          f"{1000 * secs['allocate']:.0f} ms" + (f", checks {secs['check']:.1f} s"
                                                  if args.check else ""))
    cols = []
    for p in points:
        if p.checked:
            cols = [k for k in p.checked if k not in ("model_kind", "samples", "tokens")]
            break
    print(f"{'point':<22} {'budget':>7} {'bpw':>7} {'bytes':>12} {'predicted':>11}"
          + "".join(f" {c:>11}" for c in cols))
    for p in points:
        b = f"{p.budget_bpw:.3f}" if p.budget_bpw is not None else "-"
        pred = f"{p.predicted:.4g}" if p.predicted is not None else "-"
        vals = "".join(f" {p.checked[c]:11.6g}" if p.checked else f" {'':>11}" for c in cols)
        print(f"{p.label:<22} {b:>7} {p.bits_per_weight:7.3f} {p.bytes:12,d} {pred:>11}{vals}")
    return 0

"""`quant-workbench frontier [MODEL] [--from-bpw X] [--to-bpw Y] [--points N] [--schemes ..]
[--calib F | --imatrix F] [--measure ..] [--samples N] [--target RT] [--recipes Q4_K_M,Q5_K_M]
[--check K] [--check-samples N] [--held-out FILE] [--json]`."""

from __future__ import annotations

from workbench.cli.common import add_model_arg, open_model_arg, print_json
from workbench.cli.commands.sensitivity import AUTO, add_table_args, say


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
    from workbench import api
    from workbench.cli.common import drive, executor_of
    recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    model = open_model_arg(args)
    f = api.compute_frontier(model, from_bpw=args.from_bpw, to_bpw=args.to_bpw,
                             points=args.points, recipes=recipes, check=args.check,
                             check_samples=args.check_samples, held_out=args.held_out,
                             schemes=args.schemes, measure=args.measure, calib=args.calib,
                             imatrix=args.imatrix, samples=args.samples, target=args.target,
                             executor=executor_of(args), use_cache=not args.no_cache,
                             driver=lambda job: drive(job, quiet=args.json), say=say)
    table, alloc, secs = f.table, f.allocated, f.seconds
    if f.recipe_error is not None and not args.json:
        print(f"(no recipe points: {f.recipe_error})")
    points = f.points
    from workbench.planning.sensitivity import predicted_unit
    unit = predicted_unit(model, table.measure)
    if args.json:
        print_json({"measure": table.measure, "measure_reason": table.measure_reason,
                    "predicted_unit": unit,
                    "target": table.runtime, "params": table.params,
                    "schemes": f.schemes, "seconds": secs,
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
    if unit == "kl":
        print("predicted: the fisher / output estimate of the mean KL divergence per token "
              "(nats), the quantity check's kl_mean measures")
    head = {"kl": "pred. KL", "1-cosine": "pred. 1-cos"}.get(unit, "predicted")
    print(f"{'point':<22} {'budget':>7} {'bpw':>7} {'bytes':>12} {head:>11}"
          + "".join(f" {c:>11}" for c in cols))
    for p in points:
        b = f"{p.budget_bpw:.3f}" if p.budget_bpw is not None else "-"
        pred = f"{p.predicted:.4g}" if p.predicted is not None else "-"
        vals = "".join(f" {p.checked[c]:11.6g}" if p.checked else f" {'':>11}" for c in cols)
        print(f"{p.label:<22} {b:>7} {p.bits_per_weight:7.3f} {p.bytes:12,d} {pred:>11}{vals}")
    return 0

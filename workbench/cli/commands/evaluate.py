"""`quant-workbench evaluate [MODEL] (--scheme NAME | --plan PLAN.json) [--method M] [--calib F | --imatrix F] [--json]`."""

from __future__ import annotations

from workbench.cli.common import (add_method_args, add_model_arg, add_runtime_args, add_scheme_or_plan,
                      apply_convention, apply_methods, drive, fmt_bytes, open_model_arg,
                      plan_from_args, print_convention, print_json)


def register(sub) -> None:
    p = sub.add_parser("evaluate", help="reconstruction error and size of a scheme or plan")
    add_model_arg(p)
    add_scheme_or_plan(p)
    add_runtime_args(p)
    add_method_args(p)
    from workbench.jobs.cluster import add_cluster_arg
    add_cluster_arg(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args) -> int:
    from workbench.quant.evaluate import evaluate
    plan = plan_from_args(args)
    model = open_model_arg(args)
    plan, conv = apply_convention(args, model, plan, args.target, quiet=args.json)
    plan, model = apply_methods(args, model, plan, args.target, quiet=args.json)
    from workbench.cli.common import executor_of
    ev = drive(evaluate(model, plan, runtime=args.target, strict=args.strict,
                        executor=executor_of(args)), quiet=args.json)
    print_convention(conv, args.json)
    if args.json:
        out = ev.to_dict()
        out["model"] = model.path
        out["plan"] = plan.to_dict()
        if conv is not None:
            out["convention"] = conv.to_dict()
        print_json(out)
        return 0
    print(f"{'name':<52} {'scheme':<16} {'method':<7} {'bits/w':>7} {'bytes':>11} {'rel_rmse':>9} "
          f"{'sqnr_db':>8} {'max_err':>9} {'cosine':>8}")
    for r in ev.tensors.values():
        e = r.error
        sq = f"{e.sqnr_db:8.2f}" if e.sqnr_db != float("inf") else f"{'inf':>8}"
        print(f"{r.name[:52]:<52} {r.scheme:<16} {r.method:<7} {r.bits_per_weight:>7.3f} {r.bytes:>11,d} "
              f"{e.rel_rmse:>9.5f} {sq} {e.max_abs_err:>9.3g} {e.cosine:>8.5f}"
              + (f"  ({r.note})" if r.note else ""))
    t = ev.totals
    print(f"\nfallbacks: {ev.summary.line()}")
    print(f"total: {fmt_bytes(t.bytes_before)} -> {fmt_bytes(t.bytes_after)} "
          f"({t.compression:.2f}x), {t.bits_per_weight:.3f} bits/weight, "
          f"model SQNR {t.sqnr_db:.2f} dB")
    return 0

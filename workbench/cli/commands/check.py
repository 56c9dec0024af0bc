"""`quant-workbench check [MODEL] (--scheme S | --plan P) [--method M] [--calib FILE | --imatrix F]
[--held-out FILE] [--samples N] [--json]`."""

from __future__ import annotations

from ..common import (add_method_args, add_model_arg, add_scheme_or_plan, apply_methods, drive,
                      open_model_arg, plan_from_args, print_json)


def register(sub) -> None:
    p = sub.add_parser("check", help="end-to-end: outputs of the quantized vs the original model")
    add_model_arg(p)
    add_scheme_or_plan(p)
    p.add_argument("--calib", help="calibration text / JSONL / token ids: the inputs measured, "
                                   "and the method's calibration (default: "
                                   "resources/calibration.txt)")
    p.add_argument("--held-out", default=None, metavar="FILE",
                   help="measure on these inputs instead of --calib (the method still "
                        "calibrates on --calib)")
    add_method_args(p, calib=False)
    p.add_argument("--samples", type=int, default=None, help="use the first N samples")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args) -> int:
    from ...runner import check
    plan = plan_from_args(args)
    model = open_model_arg(args)
    plan, mm = apply_methods(args, model, plan, "any", quiet=args.json)
    weights = None
    if mm is not model or args.method:   # (an explicit --method rtn: the same fallbacks)
        from ...methods.apply import runner_weights
        weights = runner_weights(mm, plan, "any")
    res = drive(check(model, plan, args.held_out or args.calib, args.samples, weights=weights),
                quiet=args.json)
    if args.json:
        print_json(res)
        return 0
    print(f"{res['model_kind']}: {res['samples']} samples, {res['tokens']} tokens")
    for k, v in res.items():
        if k not in ("model_kind", "samples", "tokens"):
            print(f"  {k:<11} {v:.6g}")
    return 0

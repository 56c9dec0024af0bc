"""`quant-workbench check [MODEL] (--scheme S | --plan P) [--calib FILE] [--samples N] [--json]`."""

from __future__ import annotations

from ..common import add_model_arg, add_scheme_or_plan, drive, open_model_arg, plan_from_args, print_json


def register(sub) -> None:
    p = sub.add_parser("check", help="end-to-end: outputs of the quantized vs the original model")
    add_model_arg(p)
    add_scheme_or_plan(p)
    p.add_argument("--calib", help="calibration text / JSONL / token ids "
                                   "(default: resources/calibration.txt)")
    p.add_argument("--samples", type=int, default=None, help="use the first N samples")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args) -> int:
    from ...runner import check
    plan = plan_from_args(args)
    model = open_model_arg(args)
    res = drive(check(model, plan, args.calib, args.samples), quiet=args.json)
    if args.json:
        print_json(res)
        return 0
    print(f"{res['model_kind']}: {res['samples']} samples, {res['tokens']} tokens")
    for k, v in res.items():
        if k not in ("model_kind", "samples", "tokens"):
            print(f"  {k:<11} {v:.6g}")
    return 0

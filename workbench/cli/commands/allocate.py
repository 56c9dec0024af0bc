"""`quant-workbench allocate [MODEL] (--budget-bpw X | --budget-bytes N) [--schemes ..]
[--measure weight] [--pin NAME=SCHEME ..] -o PLAN.json [--json]`."""

from __future__ import annotations

from ..common import add_model_arg, drive, open_model_arg, print_json

DEFAULT_SCHEMES = "q4_0,q4_1,q5_0,q5_1,q8_0"


def register(sub) -> None:
    p = sub.add_parser("allocate", help="best plan (least total sensitivity) within a size budget")
    add_model_arg(p)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--budget-bpw", type=float, help="bits per weight as evaluate counts them")
    g.add_argument("--budget-bytes", type=int, help="total bytes as evaluate counts them")
    p.add_argument("--schemes", default=DEFAULT_SCHEMES, help="candidate schemes, comma-separated")
    p.add_argument("--calib", help="calibration inputs (activation measure)")
    p.add_argument("--imatrix", help="imatrix file (activation measure)")
    p.add_argument("--measure", default="weight", choices=["weight", "activation", "output"])
    p.add_argument("--pin", action="append", default=[], metavar="NAME=SCHEME")
    p.add_argument("-o", "--output", required=True, help="plan JSON to write")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args) -> int:
    import os
    from ...allocate import allocate
    from ...errors import WorkbenchError
    from ...evaluate import evaluate
    from ...schemes import get_scheme
    if args.measure == "output":
        raise WorkbenchError("--measure output is not built yet (weight, activation)")
    schemes = [get_scheme(s.strip()).name for s in args.schemes.split(",") if s.strip()]
    pins = {}
    for item in args.pin:
        if "=" not in item:
            raise WorkbenchError(f"--pin {item!r}: expected NAME=SCHEME")
        n, s = item.split("=", 1)
        pins[n] = get_scheme(s).name
    model = open_model_arg(args)
    if os.path.exists(args.output) and os.path.abspath(args.output) == os.path.abspath(model.path):
        raise WorkbenchError("refusing to write over the model", path=args.output)
    errors = None
    if args.measure == "activation":
        from ...sensitivity import activation_errors, second_moments
        mom = drive(second_moments(model, args.calib, args.imatrix), quiet=args.json)
        errors = drive(activation_errors(model, schemes, mom), quiet=args.json)
    plan, budget = drive(allocate(model, schemes, args.budget_bytes, args.budget_bpw, pins,
                                  errors),
                         quiet=args.json)
    plan.save(args.output)
    ev = drive(evaluate(model, plan), quiet=True)
    t = ev.totals
    out = {"output": args.output, "budget_bytes": budget, "bytes": t.bytes_after,
           "bits_per_weight": t.bits_per_weight, "sqnr_db": t.sqnr_db,
           "schemes": {s: sum(1 for r in ev.tensors.values() if r.scheme == s) for s in schemes}}
    if args.json:
        print_json(out)
    else:
        print(f"wrote {args.output}: {t.bytes_after:,d} bytes (budget {budget:,d}), "
              f"{t.bits_per_weight:.3f} bits/weight, model SQNR {t.sqnr_db:.2f} dB")
        print("  " + ", ".join(f"{s}: {c}" for s, c in out["schemes"].items()))
    return 0

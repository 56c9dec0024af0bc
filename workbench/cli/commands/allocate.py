"""`quant-workbench allocate [MODEL] (--budget-bpw X [--bpw-over all|linear] | --budget-bytes N
| --budget-file-bytes N | --budget-of FILE) [--schemes ..]
[--calib F | --imatrix F] [--measure weight|activation|fisher|output] [--samples N] [--target RT]
[--pin NAME=SCHEME ..] [--methods auto|M,..] -o PLAN.json [--json]`."""

from __future__ import annotations

from ..common import add_model_arg, open_model_arg, print_json
from .sensitivity import AUTO, add_table_args, parse_schemes, table_from_args


def register(sub) -> None:
    p = sub.add_parser("allocate", help="best plan (least total sensitivity) within a size budget")
    add_model_arg(p)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--budget-bpw", type=float,
                   help="bits per weight over every tensor as evaluate counts them (embeddings, "
                        "norms, an unused pooler included), or over the Linear weights with "
                        "--bpw-over linear")
    g.add_argument("--budget-bytes", type=int,
                   help="bytes of every tensor as evaluate counts them (no file header)")
    g.add_argument("--budget-file-bytes", type=int, metavar="N",
                   help="bytes of the whole file the export writes (GGUF for llama.cpp: header, "
                        "tokenizer, plan and padding included; solves for --target llama.cpp)")
    g.add_argument("--budget-of", metavar="FILE",
                   help="no bigger than an existing file: a .gguf file's size (as "
                        "--budget-file-bytes) or a .safetensors file's tensor bytes (as "
                        "--budget-bytes)")
    p.add_argument("--bpw-over", choices=["all", "linear"], default=None,
                   help="what --budget-bpw counts: every tensor (all, the default) or the "
                        "Linear weights only (attention / MLP projections, experts, LM head; "
                        "the other tensors are kept unless pinned)")
    add_table_args(p, AUTO)
    p.add_argument("--pin", action="append", default=[], metavar="NAME=SCHEME",
                   help="keep a tensor at a scheme (repeatable); NAME may be a moe: selector "
                        "(moe:experts.down@5, moe:router; docs/moe.md) for every tensor it "
                        "addresses")
    p.add_argument("--methods", default="auto", metavar="M[,M..]",
                   help="quantization methods weighed per tensor with each scheme (rtn, "
                        "imatrix, gptq; docs/methods.md), each fitted on half the calibration "
                        "samples and judged on the other half: auto (the default) weighs all "
                        "three when the measure is fisher/activation/output and the model runs "
                        "on the calibration text (gptq only on the schemes next to the first "
                        "allocation's), else rtn; 'rtn' gives the scheme-only plan")
    p.add_argument("-o", "--output", required=True, help="plan JSON to write")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def expand_pins(model, pins: dict) -> dict:
    """Pins whose name is a moe: selector become one pin per tensor it addresses."""
    from ...errors import WorkbenchError
    from ...moe import is_selector, parse_selector
    out = {}
    for n, s in pins.items():
        if not is_selector(n):
            out[n] = s
            continue
        sel = parse_selector(n)
        hit = [t for t in model.tensors if sel.matches(t)]
        if not hit:
            raise WorkbenchError(f"--pin {n}: no tensor of the model matches", path=model.path)
        for t in hit:
            out.setdefault(t, s)
    return out


def run(args) -> int:
    import os
    import time
    from ...errors import WorkbenchError
    from ...evaluate import evaluate
    from ...progress import run as run_job
    from ...schemes import get_scheme
    from ... import budget as budgets
    budget = budgets.from_args(args)   # bad numbers and unreadable files before anything else
    args.target = budgets.file_target(budget, args.target)
    schemes = parse_schemes(args.schemes, args.target)
    from ...allocate_methods import parse_methods
    parse_methods(args.methods)          # a bad --methods is refused before anything is measured
    pins = {}
    for item in args.pin:
        if "=" not in item:
            raise WorkbenchError(f"--pin {item!r}: expected NAME=SCHEME")
        n, s = item.split("=", 1)
        pins[n] = get_scheme(s).name
    model = open_model_arg(args)
    from ...config_check import check_model_config
    check_model_config(model)   # a config.json its weights contradict: refused, not worked around
    if os.path.exists(args.output) and os.path.abspath(args.output) == os.path.abspath(model.path):
        raise WorkbenchError("refusing to write over the model", path=args.output)
    pins = expand_pins(model, pins)
    for p in pins:
        if p not in model.tensors:
            raise WorkbenchError(f"pinned tensor {p!r} is not in the model", path=model.path)
    # an impossible budget is refused from the shapes alone, before anything is measured
    from ...sensitivity import below_smallest_message, size_floor
    cheapest, params = size_floor(model, schemes, args.target, pins)
    want = int(budget.value) if budget.kind == "bytes" else int(budget.value * params / 8.0 + 1e-9)
    if (budget.kind == "bytes" or (budget.kind == "bpw" and budget.over == "all")) \
            and cheapest > want:
        raise WorkbenchError(below_smallest_message(model, want, cheapest, params, schemes,
                                                    args.target), path=model.path)
    t0 = time.perf_counter()
    table = table_from_args(args, model, schemes, pins, quiet=args.json)
    from ...allocate_methods import method_counts, plan_with_methods, weigh_methods
    t1 = time.perf_counter()
    mstat = weigh_methods(args, model, table, quiet=args.json,
                          solve=lambda t: t.assignment_of(
                              budgets.solve(model, t, budget, pins)[0], model))
    t1m = time.perf_counter()     # the solve is timed from here
    plan, sol, cap = budgets.solve(model, table, budget, pins,
                                   finish=lambda p: plan_with_methods(p, table, model))
    t2 = time.perf_counter()
    plan.save(args.output)
    ev = run_job(evaluate(model, plan, runtime=args.target))
    t = ev.totals
    acc = budgets.accounting(model, ev, args.target, plan)
    out = {"output": args.output, "budget_bytes": cap,
           "budget": {**budget.to_dict(), "bytes": cap}, "accounting": acc,
           "bits_per_weight_linear": acc["bits_per_weight_linear"],
           "bytes": t.bytes_after,
           "bits_per_weight": t.bits_per_weight, "sqnr_db": t.sqnr_db,
           "measure": args.measure, "measure_reason": getattr(args, "measure_reason", "given"),
           "candidates": schemes, "predicted": sol.error, "exact": sol.exact,
           "bound": sol.bound, "target": args.target,
           "seconds": {"sensitivity": t1 - t0, "solve": t2 - t1m},
           "schemes": {s: sum(1 for r in ev.tensors.values() if r.scheme == s) for s in schemes},
           "methods": method_counts(plan, table, model), "methods_weighed": mstat["methods"]}
    out["seconds"]["methods"] = mstat.get("seconds", 0.0)
    if args.json:
        print_json(out)
    else:
        print(f"wrote {args.output}: budget {budget.describe()} = {cap:,d} bytes")
        fb = acc.get("file_bytes")
        lb = acc["bits_per_weight_linear"]
        print(f"  {t.bytes_after:,d} bytes of tensors, {t.bits_per_weight:.3f} bits/weight over "
              f"every tensor, " + (f"{lb:.3f} over the Linear weights" if lb is not None
                                   else "no Linear weights")
              + (f", {fb['format']} file {fb['bytes']:,d} bytes" if fb else "")
              + f"; model SQNR {t.sqnr_db:.2f} dB")
        print(f"  {args.measure} sensitivity ({out['measure_reason']}) total {sol.error:.6g} "
              f"({'optimal' if sol.exact else f'lower bound {sol.bound:.6g}'}); "
              f"solved in {1000 * (t2 - t1m):.1f} ms")
        print("  " + ", ".join(f"{s}: {c}" for s, c in out["schemes"].items() if c))
        print("  methods: " + ", ".join(f"{m}: {c}" for m, c in out["methods"].items())
              + f" (weighed {', '.join(mstat['methods'])}"
              + (f"; {mstat['pairs']} pairs in {mstat['seconds']:.1f} s)" if mstat.get("pairs")
                 else ")"))
    return 0

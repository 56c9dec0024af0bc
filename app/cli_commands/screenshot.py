"""`quant-workbench screenshot [MODEL] [--plan PLAN.json] [--layer NAME] [--size WxH] [--tab T]
[--methods imatrix,gptq,awq [--scope pareto|current|all]] [--busy] [--dialog export] -o out.png`.

Renders the real desktop window offscreen with that state and saves a PNG (needs PySide6;
the app is imported lazily so the rest of the CLI works without Qt).
"""

from __future__ import annotations

from workbench.cli.common import add_model_arg, model_path


def register(sub) -> None:
    p = sub.add_parser("screenshot", help="render the desktop window offscreen to a PNG")
    add_model_arg(p)
    p.add_argument("--plan", help="plan JSON to apply")
    p.add_argument("--layer", help="tensor to select (default: the first weight matrix), or a "
                                   "mixture-of-experts group such as 'layer 1 experts down' "
                                   "(shows the spread across its experts)")
    p.add_argument("--size", default="1600x1000", help="window size WIDTHxHEIGHT (default 1600x1000)")
    p.add_argument("--tab", choices=("table", "tiers", "comparison", "budget", "map"),
                   default="table", help="which bottom tab to show (default: table; budget: "
                   "Sensitivity & Budget, with the frontier; map: the model map)")
    p.add_argument("--methods", default="",
                   help="comparison tab: methods to compare beside rtn, comma-separated "
                        "(imatrix,gptq,awq; needs a runnable model and calibration)")
    p.add_argument("--scope", choices=("pareto", "current", "all"), default="pareto",
                   help="with --methods: which schemes get a row per method (default: the RTN "
                        "Pareto schemes and the current one)")
    p.add_argument("--busy", action="store_true",
                   help="take the picture while the window's jobs still run (the work queue "
                        "and the panels' waiting states; with --tab budget, once the "
                        "sensitivity table reports progress), not once it is idle")
    p.add_argument("--dialog", choices=("export",),
                   help="export: the Export dialog over the window, once its check is done")
    p.add_argument("-o", "--output", required=True, help="PNG file to write")
    p.set_defaults(func=run)


def run(args) -> int:
    from workbench.core.errors import WorkbenchError
    try:
        from app.screenshot import parse_size, render
    except ImportError as exc:
        raise WorkbenchError(f"the desktop app is not available ({exc})") from None
    size = parse_size(args.size)
    methods = [m.strip().lower() for m in (args.methods or "").split(",") if m.strip()]
    bad = [m for m in methods if m not in ("imatrix", "gptq", "awq")]
    if bad:
        raise WorkbenchError(f"--methods: unknown method '{bad[0]}' (choose from imatrix, gptq, "
                             "awq; rtn is always shown)")
    if methods and args.tab != "comparison":
        raise WorkbenchError("--methods needs --tab comparison")
    render(model_path(args), args.output, plan_path=args.plan, layer=args.layer, size=size,
           tab=args.tab, methods=methods, scope=args.scope, busy=args.busy,
           dialog=args.dialog)
    print(f"wrote {args.output} ({size[0]}x{size[1]})")
    return 0

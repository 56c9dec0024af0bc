"""`quant-workbench screenshot [MODEL] [--plan PLAN.json] [--layer NAME] [--size WxH] -o out.png`.

Renders the real desktop window offscreen with that state and saves a PNG (needs PySide6;
the app is imported lazily so the rest of the CLI works without Qt).
"""

from __future__ import annotations

from ..common import add_model_arg, model_path


def register(sub) -> None:
    p = sub.add_parser("screenshot", help="render the desktop window offscreen to a PNG")
    add_model_arg(p)
    p.add_argument("--plan", help="plan JSON to apply")
    p.add_argument("--layer", help="tensor to select (default: the first weight matrix)")
    p.add_argument("--size", default="1600x1000", help="window size WIDTHxHEIGHT (default 1600x1000)")
    p.add_argument("--tab", choices=("table", "tiers", "comparison", "budget"),
                   default="table", help="which bottom tab to show (default: table; budget: "
                   "Sensitivity & Budget, with the frontier)")
    p.add_argument("-o", "--output", required=True, help="PNG file to write")
    p.set_defaults(func=run)


def run(args) -> int:
    from ...errors import WorkbenchError
    try:
        from app.screenshot import parse_size, render
    except ImportError as exc:
        raise WorkbenchError(f"the desktop app is not available ({exc})") from None
    size = parse_size(args.size)
    render(model_path(args), args.output, plan_path=args.plan, layer=args.layer, size=size,
           tab=args.tab)
    print(f"wrote {args.output} ({size[0]}x{size[1]})")
    return 0

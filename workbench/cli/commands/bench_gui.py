"""`quant-workbench bench-gui [--big] [--json]`: the GUI benchmark (app/bench_gui.py)."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("bench-gui", help="GUI benchmark: start-up, selection-to-plots and "
                                         "edit-to-totals times (offscreen)")
    p.add_argument("--big", action="store_true",
                   help="also a generated model with a 30000x4096 embedding")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    from app.bench_gui import main
    return main((["--big"] if args.big else []) + (["--json"] if args.json else []))

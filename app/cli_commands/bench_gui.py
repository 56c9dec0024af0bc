"""`quant-workbench bench-gui [--big] [--paths both|fast|old] [--repeats N] [--tensors N] [--json]`: the GUI
benchmark (app/bench_gui.py); by default the fast and the old drawing paths back to back."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("bench-gui", help="GUI benchmark: start-up, selection-to-plots and "
                                         "edit-to-totals times (offscreen), fast vs old paths")
    p.add_argument("--big", action="store_true",
                   help="also a generated model with a 30000x4096 embedding")
    p.add_argument("--paths", choices=("both", "fast", "old"), default="both",
                   help="the fast paths (app.perf.FAST), the old ones, or both in this run")
    p.add_argument("--repeats", type=int, default=7, help="selections / edits per figure")
    p.add_argument("--tensors", type=int, default=None, metavar="N",
                   help="issue 23's figures on a generated catalog of N tensors (e.g. 100000): "
                        "open, filter, select, edit, tier board and model map drawn")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    from app.bench_gui import main
    return main((["--big"] if args.big else []) + (["--json"] if args.json else [])
                + ["--paths", args.paths, "--repeats", str(args.repeats)]
                + (["--tensors", str(args.tensors)] if args.tensors is not None else []))

"""`quant-workbench map [MODEL] [--plan P | --scheme S] [--overlay O] [--json]`: the model map's
numbers without the window (workbench.planning.model_map): blocks, sections, per-block totals and each
tensor's overlay value."""

from __future__ import annotations

import math

from workbench.cli.common import add_model_arg, drive, fmt_bytes, open_model_arg, print_json

CLI_OVERLAYS = ("bits", "sqnr", "kurtosis", "outliers")


def register(sub) -> None:
    p = sub.add_parser("map", help="the model map: blocks, per-block totals and an overlay's "
                                   "value per tensor (the window's Model map tab)")
    add_model_arg(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--plan", help="plan JSON (default: the window's default plan, int8-channel)")
    g.add_argument("--scheme", help="one scheme for every weight matrix")
    p.add_argument("--overlay", choices=CLI_OVERLAYS, default="bits",
                   help="value per tensor: bits per weight (default), SQNR dB (evaluates the "
                        "plan), excess kurtosis or outlier fraction (reads every tensor); "
                        "sensitivity and output change: `quant-workbench sensitivity`")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args) -> int:
    from workbench.api import make_plan, map_model
    model = open_model_arg(args)
    plan = make_plan(path=args.plan) if args.plan else args.scheme
    res = map_model(model, plan, overlay=args.overlay,
                    driver=lambda job: drive(job, quiet=args.json))
    vals = res["values"]
    if args.json:
        print_json(res)
        return 0
    t = res["totals"]
    print(f"{res['model']}: {len(res['blocks'])} blocks, {t['tensors']} tensors, "
          f"{fmt_bytes(t['bytes'])}, {t['bits_per_weight']:.3f} bits/weight")
    for b in res["blocks"]:
        bt = b["totals"]
        print(f"\n{b['title']}: {bt['tensors']} tensors, {fmt_bytes(bt['bytes'])}, "
              f"{bt['bits_per_weight']:.3f} bits/weight")
        for s in b["sections"]:
            cells = []
            for n in s["tensors"]:
                v = vals.get(n)
                txt = "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4g}"
                short = n[:-len(".weight")] if n.endswith(".weight") else n
                short = ".".join(short.split(".")[-2 if n.endswith(".bias") else -1:])
                cells.append(f"{short}={txt}[{res['schemes'][n]}]")
            print(f"  {s['title']:<16} " + "  ".join(cells))
    return 0

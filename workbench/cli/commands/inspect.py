"""`quant-workbench inspect [MODEL] [--json]`: the tensor catalog with statistics."""

from __future__ import annotations

from ..common import add_model_arg, drive, fmt_bytes, open_model_arg, print_json


def register(sub) -> None:
    p = sub.add_parser("inspect", help="list tensors with their statistics")
    add_model_arg(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--arrays", action="store_true",
                   help="with --json: include histograms and per-channel ranges")
    p.add_argument("--no-stats", action="store_true", help="catalog only (headers, no data read)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ...stats import empty_stats, empty_stats_dict, model_stats
    model = open_model_arg(args)
    # empty tensors have nothing to read: their statistics are one shared value (a header of
    # 300,000 empty tensors inspects in about the time its JSON takes to parse)
    full = [n for n, i in model.tensors.items() if i.numel]
    stats = {} if args.no_stats else drive(model_stats(model, full), quiet=args.json)
    empty = None if args.no_stats or args.arrays else empty_stats_dict()
    if empty is not None and args.json:
        from ..common import json_safe
        empty = json_safe(empty)   # NaN -> null once, so the fast encoder takes the document
    rows = []
    for info in model.tensors.values():
        d = info.to_dict()
        if info.name in stats:
            d["stats"] = stats[info.name].to_dict(arrays=args.arrays)
        elif not args.no_stats:
            d["stats"] = dict(empty) if empty is not None else \
                empty_stats(info.name, info.rows).to_dict(arrays=True)
        rows.append(d)
    if args.json:
        print_json({"model": model.path, "format": model.format, "tensors": rows,
                    "totals": {"tensors": len(rows), "params": model.total_params,
                               "bytes": model.total_bytes}})
        return 0
    print(f"{model.path}  ({model.format}, {len(rows)} tensors, {model.total_params:,} params, "
          f"{fmt_bytes(model.total_bytes)})")
    print(f"{'name':<52} {'shape':<14} {'dtype':<12} {'role':<9} {'absmax':>9} {'std':>9} "
          f"{'kurt':>7} {'outl%':>6} {'nan/inf':>7}")
    import sys
    lines = []
    for d in rows:
        s = d.get("stats")
        shape = "x".join(map(str, d["shape"])) or "scalar"
        line = f"{d['name'][:52]:<52} {shape:<14} {d['dtype']:<12} {d['role']:<9}"
        if s:
            line += (f" {s['absmax']:>9.4g} {s['std']:>9.4g} {s['kurtosis']:>7.2f} "
                     f"{100 * s['outlier_frac']:>6.3f} {s['nan'] + s['inf']:>7d}")
        lines.append(line)
        if len(lines) >= 4096:   # written in blocks: one write per line costs more than all else
            sys.stdout.write("\n".join(lines) + "\n")
            lines = []
    if lines:
        sys.stdout.write("\n".join(lines) + "\n")
    return 0

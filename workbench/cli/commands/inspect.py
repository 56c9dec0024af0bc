"""`quant-workbench inspect [MODEL] [--json] [--experts]`: the tensor catalog with statistics;
`--experts`: the spread across each mixture-of-experts group (docs/moe.md)."""

from __future__ import annotations

from workbench.cli.common import add_model_arg, drive, executor_of, fmt_bytes, open_model_arg, print_json


def register(sub) -> None:
    p = sub.add_parser("inspect", help="list tensors with their statistics")
    add_model_arg(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--arrays", action="store_true",
                   help="with --json: include histograms and per-channel ranges")
    p.add_argument("--no-stats", action="store_true", help="catalog only (headers, no data read)")
    p.add_argument("--experts", action="store_true",
                   help="per mixture-of-experts group ('layer N experts PROJ'): each expert's "
                        "|max|, std and kurtosis (the GUI's spread plot)")
    from workbench.jobs.cluster import add_cluster_arg
    add_cluster_arg(p)
    p.set_defaults(func=run)


def run_experts(args, model) -> int:
    from workbench.core.errors import WorkbenchError
    from workbench.running.moe import expert_groups, expert_spread
    from workbench.core.progress import subjob
    groups = expert_groups(model)
    if not groups:
        raise WorkbenchError("no mixture-of-experts tensors in this model", path=model.path)

    def job():
        out = []
        for i, (g, names) in enumerate(groups.items()):
            out.append((yield from subjob(expert_spread(model, g, names), i, 1, len(groups))))
        return out
    spreads = drive(job(), quiet=args.json)
    if args.json:
        print_json({"model": model.path, "groups": [s.to_dict() for s in spreads]})
        return 0
    for s in spreads:
        print(f"{s.group} ({len(s.experts)} experts)")
        print(f"  {'expert':>6} {'absmax':>10} {'std':>10} {'kurt':>7}")
        for i, e in enumerate(s.experts):
            print(f"  {e:>6} {s.absmax[i]:>10.4g} {s.std[i]:>10.4g} {s.kurtosis[i]:>7.2f}")
    return 0


def run(args) -> int:
    from workbench.api import statistics
    from workbench.quant.stats import empty_stats, empty_stats_dict
    model = open_model_arg(args)
    if args.experts:
        return run_experts(args, model)
    # empty tensors have nothing to read: their statistics are one shared value (a header of
    # 300,000 empty tensors inspects in about the time its JSON takes to parse)
    full = [n for n, i in model.tensors.items() if i.numel]
    stats = {} if args.no_stats else statistics(
        model, full, executor=executor_of(args), driver=lambda job: drive(job, quiet=args.json))
    if not args.json:
        return _print_table(model, stats, args.no_stats)
    empty = None if args.no_stats or args.arrays else empty_stats_dict()
    if empty is not None:
        from workbench.cli.common import json_safe
        empty = json_safe(empty)   # NaN -> null once, so the fast encoder takes the document
    rows = []
    for info in model.tensors.values():
        d = info.to_dict()
        if info.name in stats:
            d["stats"] = stats[info.name].to_dict(arrays=args.arrays)
        elif not args.no_stats:
            d["stats"] = empty if empty is not None else \
                empty_stats(info.name, info.rows).to_dict(arrays=True)
        rows.append(d)
    print_json({"model": model.path, "format": model.format, "tensors": rows,
                "totals": {"tensors": len(rows), "params": model.total_params,
                           "bytes": model.total_bytes}})
    return 0


def _stats_text(s: dict) -> str:
    return (f" {s['absmax']:>9.4g} {s['std']:>9.4g} {s['kurtosis']:>7.2f} "
            f"{100 * s['outlier_frac']:>6.3f} {s['nan'] + s['inf']:>7d}")


def _print_table(model, stats: dict, no_stats: bool) -> int:
    """The catalog as text, one line per tensor: built straight from the infos (a header of
    300,000 tensors prints in a fraction of a second; every empty tensor shares one
    statistics text)."""
    import sys
    from workbench.quant.stats import empty_stats_dict
    print(f"{model.path}  ({model.format}, {len(model.tensors)} tensors, "
          f"{model.total_params:,} params, {fmt_bytes(model.total_bytes)})")
    head = f"{'name':<52} {'shape':<14} {'dtype':<12} {'role'}"
    if not no_stats:     # --no-stats: no statistics columns at all (not empty ones)
        head = (f"{head:<94} {'absmax':>9} {'std':>9} {'kurt':>7} {'outl%':>6} {'nan/inf':>7}")
    print(head)
    empty = "" if no_stats else _stats_text(empty_stats_dict())
    from workbench.formats.catalog import infer_roles
    infos = model.tensors.values()
    roles = infer_roles((info.name, len(info.shape)) for info in infos)
    tails: dict = {}   # (shape, dtype, role) -> the line's text after the name
    lines = []
    for info, role in zip(infos, roles):
        key = (info.shape, info.quant or info.dtype, role)
        tail = tails.get(key)
        if tail is None:
            shape = "x".join(map(str, info.shape)) or "scalar"
            tail = f" {shape:<14} {key[1]:<12} {key[2]:<13}"
            if no_stats:
                tail = tail.rstrip()
            if len(tails) < 65536:
                tails[key] = tail
        s = stats.get(info.name)
        lines.append(f"{info.name[:52]:<52}{tail}"
                     f"{empty if s is None else _stats_text(s.to_dict())}")
        if len(lines) >= 4096:   # written in blocks: one write per line costs more than all else
            sys.stdout.write("\n".join(lines) + "\n")
            lines = []
    if lines:
        sys.stdout.write("\n".join(lines) + "\n")
    return 0

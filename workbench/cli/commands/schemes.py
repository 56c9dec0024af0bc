"""`quant-workbench schemes [--json] [--variants]`: the scheme registry.

`quant-workbench schemes --tensor NAME [MODEL] [--json]`: every scheme that can take one tensor,
grouped by family, with its bits per weight and error on that tensor, Pareto points marked
(workbench.planning.scheme_choice; the GUI's scheme picker and comparison tab show these numbers)."""

from __future__ import annotations

from workbench.cli.common import print_json


def register(sub) -> None:
    p = sub.add_parser("schemes", help="list the quantization schemes")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--variants", action="store_true",
                   help="also list the @p99.9 / @mse / @pot variants of integer schemes")
    p.add_argument("--tensor", metavar="NAME",
                   help="evaluate every eligible scheme on this tensor of MODEL")
    p.add_argument("model", nargs="?", default=None,
                   help="with --tensor: checkpoint file or folder (default: the demo model)")
    p.set_defaults(func=run)


def describe(name: str) -> dict:
    from workbench.schemes import get_scheme
    s = get_scheme(name)
    return {"name": s.name, "nominal_bits": s.nominal_bits,
            "bits_per_weight": s.bits_per_weight((4096, 4096)),
            "block_size": s.block_size, "family": type(s).__name__}


def run_tensor(args) -> int:
    from workbench.core.errors import WorkbenchError
    from workbench.planning.scheme_choice import FAMILIES, tensor_points
    from workbench.cli.common import open_model_arg
    model = open_model_arg(args)
    if args.tensor not in model.tensors:
        raise WorkbenchError("no such tensor", path=model.path, tensor=args.tensor)
    pts = tensor_points(model, args.tensor)
    if args.json:
        print_json({"tensor": args.tensor, "shape": list(model.info(args.tensor).shape),
                    "schemes": [p.to_dict() for p in pts]})
        return 0
    print(f"{args.tensor} {tuple(model.info(args.tensor).shape)}")
    for fam in list(FAMILIES) + ["Other"]:
        rows = [p for p in pts if p.family == fam]
        if not rows:
            continue
        print(f"{fam}:")
        for p in rows:
            print(f"  {p.scheme:<22} {p.bits_per_weight:7.3f} bits/w  SQNR {p.sqnr_db:7.2f} dB"
                  f"{'  pareto' if p.pareto else ''}")
    return 0


def run(args) -> int:
    from workbench.schemes import list_schemes
    if args.tensor:
        return run_tensor(args)
    rows = [describe(n) for n in list_schemes(variants=args.variants)]
    if args.json:
        print_json({"schemes": rows})
        return 0
    print(f"{'scheme':<28} {'bits/weight*':>12} {'block':>6}  family")
    for r in rows:
        block = r["block_size"] or "-"
        print(f"{r['name']:<28} {r['bits_per_weight']:>12.4f} {block!s:>6}  {r['family']}")
    print("* exact bits per weight including scales, for a 4096x4096 matrix")
    return 0

"""`quant-workbench schemes [--json] [--variants]`: the scheme registry."""

from __future__ import annotations

from ..common import print_json


def register(sub) -> None:
    p = sub.add_parser("schemes", help="list the quantization schemes")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--variants", action="store_true",
                   help="also list the @p99.9 / @mse / @pot variants of integer schemes")
    p.set_defaults(func=run)


def describe(name: str) -> dict:
    from ...schemes import get_scheme
    s = get_scheme(name)
    return {"name": s.name, "nominal_bits": s.nominal_bits,
            "bits_per_weight": s.bits_per_weight((4096, 4096)),
            "block_size": s.block_size, "family": type(s).__name__}


def run(args) -> int:
    from ...schemes import list_schemes
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

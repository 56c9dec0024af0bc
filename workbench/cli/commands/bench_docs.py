"""`quant-workbench bench-docs [--quick] [--only NAME,..] [-o FILE]`: regenerate
docs/benchmarks.md from the bench commands (workbench/bench/docs.py; the same as
`python -m workbench.bench.docs`). `bench-docs --readme [-o FILE]`: run README.md's tour and
rewrite its outputs (workbench/bench/tour.py)."""

from __future__ import annotations


def register(sub) -> None:
    from workbench.bench.docs import add_args
    p = sub.add_parser("bench-docs", help="regenerate docs/benchmarks.md by running every bench "
                                          "command (each figure with its command and date); "
                                          "--readme: README.md's tour")
    add_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    if args.readme:
        from workbench.bench.tour import regenerate
        return regenerate(args.output)
    from workbench.bench.docs import DEFAULT_OUT, run as run_docs
    return run_docs(args.quick, args.only, args.timeout, args.output or DEFAULT_OUT)

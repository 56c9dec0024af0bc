"""`quant-workbench bench-allocate [--tensors 500] [--schemes 12] [--repeat 5] [--json]`: times
the allocator (workbench.planning.allocate.solve_detailed) on synthetic tables.

`quant-workbench bench-allocate --vs-llama MODEL [--calib F] --held-out F [--types Q4_K_M,..]
[--ctx 512] [--chunks N] [--threads N] [--timeout S] [--workbench-args "..."] [-o DIR] [--json]`:
the default `allocate` + `export` against llama.cpp's imatrix + quantize on the same float model
and calibration text, every file judged by llama-perplexity's KL divergence on held-out text
(workbench.bench.vs_llama)."""

from __future__ import annotations

from workbench.cli.common import print_json


def register(sub) -> None:
    p = sub.add_parser("bench-allocate", help="time the budget allocator on synthetic data, or "
                       "(--vs-llama MODEL) allocate + export against llama.cpp's imatrix "
                       "pipeline, judged by llama-perplexity's KL divergence")
    p.add_argument("--tensors", type=int, default=500, help="tensors an instance holds "
                   "(default 500; at most 100,000)")
    p.add_argument("--schemes", type=int, default=12, help="candidate schemes a tensor has "
                   "(default 12; at most 64)")
    p.add_argument("--repeat", type=int, default=10, help="instances (different seeds; "
                   "default 10, at most 1,000)")
    p.add_argument("--json", action="store_true")
    g = p.add_argument_group("--vs-llama (docs/vs-llama.md)")
    g.add_argument("--vs-llama", metavar="MODEL", default=None,
                   help="a float Hugging Face folder: time the default allocate + export against "
                        "llama-imatrix + llama-quantize and judge every file with "
                        "llama-perplexity --kl-divergence")
    race_inputs(g, "llama-imatrix and allocate", "the text KLD is measured on; required, "
                "and not the calibration text")
    g.add_argument("--types", default="Q4_K_M,Q3_K_M,IQ4_NL",
                   help="llama-quantize types made with the imatrix; the workbench allocates at "
                        "each one's file size (default Q4_K_M,Q3_K_M,IQ4_NL)")
    g.add_argument("--ctx", type=int, default=512, help="llama-imatrix / llama-perplexity "
                   "context (default 512)")
    g.add_argument("--threads", type=int, default=None,
                   help="threads of the llama.cpp tools (default: $OMP_NUM_THREADS when set, "
                        "else 2)")
    race_options(g, 3600.0, "; a workbench step stopped is reported in its row",
                 "more allocate options, one quoted string (e.g. \"--methods rtn\")",
                 "every file and log", "./vs-llama-NAME-TIME")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.vs_llama:
        return run_vs_llama(args)
    from workbench.bench.allocator import time_allocator
    rows = time_allocator(args.tensors, args.schemes, args.repeat)
    worst = max(r["seconds"] for r in rows)
    if args.json:
        print_json({"tensors": args.tensors, "schemes": args.schemes, "runs": rows,
                    "max_seconds": worst})
        return 0
    print(f"allocate: {args.tensors} tensors x {args.schemes} schemes, {args.repeat} instances")
    for r in rows:
        print(f"  seed {r['seed']}: {1000 * r['seconds']:7.1f} ms  "
              f"{'optimal' if r['exact'] else 'not proven optimal'}, "
              f"{100 * r['gap_to_bound']:.4f}% above the Lagrangian bound, "
              f"core {r['core']} tensors, {r['states']} states")
    print(f"  slowest {1000 * worst:.1f} ms; proven optimal {sum(r['exact'] for r in rows)}"
          f"/{len(rows)}")
    return 0


def run_vs_llama(args) -> int:
    from workbench.bench.vs_llama import parse_types, table, vs_llama
    from workbench.core.errors import WorkbenchError
    if not args.held_out:
        raise WorkbenchError("--vs-llama needs --held-out FILE: a text the calibration never "
                             "saw, a few thousand tokens long")
    types = parse_types(args.types)
    calib, out, extra = race_paths(args, "vs-llama", args.vs_llama)
    job = vs_llama(args.vs_llama, calib, args.held_out, out, types, ctx=args.ctx,
                   chunks=args.chunks, threads=args.threads, workbench_args=extra,
                   timeout=args.timeout)
    res = drive_lines(job)
    if args.json:
        print_json(res)
    else:
        print(table(res))
    return 0


def race_inputs(g, calib_for: str, held_out_help: str) -> None:
    """--calib and --held-out, as the races (--vs-llama, bench-mlx) take them."""
    g.add_argument("--calib", default=None, metavar="FILE",
                   help=f"calibration text for {calib_for} (default: resources/calibration.txt)")
    g.add_argument("--held-out", default=None, metavar="FILE", help=held_out_help)


def race_options(g, timeout: float, timeout_note: str, args_help: str, keeps: str,
                 default_out: str) -> None:
    """--chunks, --timeout, --workbench-args and -o, as the races take them."""
    g.add_argument("--chunks", type=int, default=None,
                   help="score at most N chunks of the held-out text (default: all)")
    g.add_argument("--timeout", type=float, default=timeout, metavar="S",
                   help=f"stop any one step after S seconds (default {timeout:g}){timeout_note}")
    g.add_argument("--workbench-args", default="", metavar="\"ARGS\"", help=args_help)
    g.add_argument("-o", "--output", default=None, metavar="DIR",
                   help=f"a new (or empty) folder keeping {keeps} (default: {default_out})")


def race_paths(args, prefix: str, model) -> tuple[str, str, list[str]]:
    """A race's calibration text (default resources/calibration.txt), output folder (default
    ./PREFIX-NAME-TIME) and allocate's extra arguments."""
    import time
    from pathlib import Path

    from workbench.bench.race import split_args
    calib = args.calib or str(Path(__file__).resolve().parents[3] / "resources" /
                              "calibration.txt")
    out = args.output or f"{prefix}-{Path(model).resolve().name}-" \
                         f"{time.strftime('%Y%m%d-%H%M%S')}"
    return calib, out, split_args(args.workbench_args)


def drive_lines(job, every: float = 10.0, stream=None):
    """Run a job printing its progress as lines on stderr: each new stage ('[i/N] ...') at
    once, otherwise the latest message every `every` seconds. Ctrl-C closes the job (its child
    processes are killed) before the interrupt goes on."""
    import sys
    import time

    from workbench.core.progress import run
    stream = stream or sys.stderr
    state = {"stage": None, "last": 0.0}
    t0 = time.monotonic()

    def show(ev):
        now = time.monotonic()
        stage = ev.message.split("]", 1)[0] if ev.message.startswith("[") else \
            ev.message.split(",", 1)[0]
        if stage != state["stage"] or now - state["last"] >= every:
            state["stage"], state["last"] = stage, now
            stream.write(f"{now - t0:7.0f} s  {ev.message}\n")
            stream.flush()
    try:
        return run(job, show)
    except BaseException:
        job.close()
        raise

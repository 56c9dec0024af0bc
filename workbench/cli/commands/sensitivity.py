"""`quant-workbench sensitivity [MODEL] [--schemes A,B,..] [--calib F | --imatrix F]
[--measure weight|activation|fisher|output] [--samples N] [--target RT] [--correlate] [--json]`."""

from __future__ import annotations

from workbench.cli.common import add_model_arg, drive, open_model_arg, print_json
from workbench.planning.measures import get_measure, list_measures, measure_names

from workbench.api import AUTO, AUTO_FISHER_SAMPLES, AUTO_FISHER_SAMPLES_LM, DEFAULT_SCHEMES


def add_table_args(p, schemes: str = DEFAULT_SCHEMES) -> None:
    """The flags every command that builds a SensitivityTable shares. `schemes` "auto": every
    scheme the --target runtime can run and export (allocate, frontier); the measure "auto"
    (their default): the best one the inputs allow."""
    from workbench.quant.runtimes import RUNTIMES
    if schemes == AUTO:
        shelp = ("candidate schemes, comma-separated (default: every scheme the --target runtime "
                 "can run and export: llama.cpp's GGML types, vLLM's int4/int8 channel/group and "
                 "fp8-e4m3; for 'any' the union of both; `schemes` lists them)")
    else:
        shelp = f"candidate schemes, comma-separated (default: {schemes})"
    p.add_argument("--schemes", default=schemes, help=shelp)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--calib", help="calibration inputs (text / JSONL / token ids; default: "
                                   "resources/calibration.txt)")
    g.add_argument("--imatrix", help="an imatrix file (llama.cpp GGUF or .dat) for the "
                                     "activation measure")
    auto = schemes == AUTO
    p.add_argument("--measure", default=AUTO if auto else "weight",
                   choices=([AUTO] if auto else []) + list(measure_names()),
                   help=("auto (the default): fisher when the model is runnable (config.json, "
                         f"tokenizer and the [model] extra; on {AUTO_FISHER_SAMPLES} samples, "
                         f"{AUTO_FISHER_SAMPLES_LM} for a causal LM, "
                         "unless --samples), activation with --imatrix, weight otherwise; "
                         if auto else "default weight; ")
                   + "; ".join(f"{m.name}: {m.summary or m.description}"
                               for m in list_measures()))
    p.add_argument("--samples", type=int, default=None, help="use the first N calibration samples")
    p.add_argument("--no-cache", action="store_true",
                   help="--measure output: neither read nor write the cached measured values "
                        "(~/.cache/quant-workbench/output-sensitivity)")
    p.add_argument("--target", default="any", choices=list(RUNTIMES),
                   help="the runtime whose fallbacks and re-typed tensors apply, and whose "
                        "schemes are the default candidates (default: any)")
    from workbench.cli.common import add_device_arg
    add_device_arg(p)
    from workbench.jobs.cluster import add_cluster_arg
    add_cluster_arg(p)


def say(line: str) -> None:
    """A note on stderr (stdout stays clean for --json)."""
    import sys
    print(line, file=sys.stderr)


def table_from_args(args, model, schemes, pins=None, quiet=False, extra=()):
    """The SensitivityTable the table flags ask for (workbench.api.measure_sensitivity); the
    measure an "auto" resolved to, its samples and reason are put back on `args`."""
    from workbench.api import measure_sensitivity
    from workbench.cli.common import executor_of
    table = measure_sensitivity(model, schemes, measure=args.measure, calib=args.calib,
                                imatrix=args.imatrix, samples=args.samples, target=args.target,
                                pins=pins, extra=extra, executor=executor_of(args),
                                driver=lambda job: drive(job, quiet=quiet), say=say,
                                use_cache=not args.no_cache)
    if args.measure == AUTO:
        args.measure, args.samples = table.measure, table.samples
        args.measure_reason = table.measure_reason
    return table


def register(sub) -> None:
    p = sub.add_parser("sensitivity", help="per tensor and scheme: how much quantizing it hurts")
    add_model_arg(p)
    add_table_args(p)
    p.add_argument("--correlate", action="store_true",
                   help="compute every measure and report the Spearman rank correlation "
                        "over tensors of the weight, activation and fisher measures against "
                        "the measured output change, per scheme")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run_correlate(args, model, schemes) -> int:
    import time
    from workbench.planning.output_measure import rank_agreement
    tables, secs = {}, {}
    preds = tuple(m.name for m in list_measures() if not m.measured)
    reference = next(m.name for m in list_measures() if m.measured)
    if args.imatrix:
        from workbench.core.errors import WorkbenchError
        raise WorkbenchError("--correlate runs the calibration inputs: give --calib, "
                             "not --imatrix")
    for m in preds + (reference,):
        args.measure = m
        t0 = time.perf_counter()
        tables[m] = table_from_args(args, model, schemes, quiet=args.json)
        secs[m] = time.perf_counter() - t0
    schemes = tables[reference].schemes
    rho = {s: {m: rank_agreement(tables[m], tables[reference], s) for m in preds}
           for s in schemes}
    n = {}
    for s in schemes:
        v = [abs(tables[reference].values[(x, s)]) for x in tables[reference].names]
        n[s] = sum(1 for x in v if x > 1e-9 * max(v + [0.0]))
    if args.json:
        print_json({"spearman_vs_output": rho, "tensors": n, "seconds": secs,
                    "target": tables[reference].runtime})
        return 0
    print(f"Spearman rank correlation against the measured output change, over tensors "
          f"(target {tables[reference].runtime}; seconds: " +
          ", ".join(f"{m} {v:.1f}" for m, v in secs.items()) + ")")
    w = max([len(s) for s in schemes] + [6])
    print(f"{'scheme':<{w}} {'tensors':>7} " + " ".join(f"{m:>10}" for m in preds))
    for s in schemes:
        print(f"{s:<{w}} {n[s]:7d} " + " ".join(f"{rho[s][m]:10.3f}" for m in preds))
    return 0


def run(args) -> int:
    import time
    model = open_model_arg(args)
    if args.correlate:
        return run_correlate(args, model, args.schemes)
    t0 = time.perf_counter()
    table = table_from_args(args, model, args.schemes, quiet=args.json)
    secs = time.perf_counter() - t0
    schemes = table.schemes
    if args.json:
        d = table.to_dict()
        d["seconds"] = secs
        print_json(d)
        return 0
    unit = get_measure(args.measure).units(_is_causal(model))
    print(f"{args.measure} sensitivity ({unit}), {len(table.names)} tensors, target "
          f"{table.runtime}, {secs:.1f} s; most sensitive first (by the mean over schemes)")
    w = max([len(n) for n in table.names] + [6])
    print(f"{'tensor':<{w}}  " + "  ".join(f"{s:>10}" for s in schemes))
    for n in table.rows():
        print(f"{n:<{w}}  " + "  ".join(f"{table.values[(n, s)]:10.4g}" for s in schemes))
    return 0


def _is_causal(model) -> bool:
    try:
        from workbench.running.runner_config import model_kind, read_config
        return model_kind(read_config(model)) == "causal-lm"
    except Exception:   # noqa: BLE001 - only a label
        return False

"""`quant-workbench export [MODEL] (--scheme NAME | --plan PLAN.json) --format F -o OUT`.

`--check`: write nothing; say whether the format can write the plan and why not
(workbench.export.preflight, what the GUI's Export dialog shows per format)."""

from __future__ import annotations

from workbench.cli.common import (add_method_args, add_model_arg, add_runtime_args, add_scheme_or_plan,
                      apply_convention, drive, executor_of, open_model_arg, plan_from_args,
                      print_convention, print_json)


def register(sub) -> None:
    from workbench.export import list_exporters
    formats = [e.name for e in list_exporters()]
    help_lines = "; ".join(f"{e.name}: {e.description}" for e in list_exporters())
    p = sub.add_parser("export", help="write the plan or the quantized weights",
                       description=f"Formats — {help_lines}")
    add_model_arg(p)
    add_scheme_or_plan(p)
    p.add_argument("--format", required=True, choices=formats)
    p.add_argument("-o", "--output", help="output file (required unless --check)")
    p.add_argument("--overwrite", action="store_true",
                   help="allow replacing an existing non-empty output folder (compressed-tensors;"
                        " never one holding an input): refused without it")
    p.add_argument("--check", action="store_true",
                   help="write nothing: say whether --format can write the plan, and why not")
    from workbench.quant.runtimes import RUNTIMES
    p.add_argument("--target", default=None, choices=list(RUNTIMES),
                   help="the runtime whose rules apply (default: the format's: gguf llama.cpp, "
                        "compressed-tensors vllm, onnx onnxruntime, else any)")
    add_runtime_args(p, default=None)
    add_method_args(p)
    p.add_argument("--activations", default=None,
                   choices=["int8", "minmax", "percentile", "mse", "kl"],
                   help="calibrate a static range for every quantized Linear's input (stored in "
                        "the plan; compressed-tensors writes input_activations + input_scale, "
                        "onnx QuantizeLinear/DequantizeLinear): a calibration method, or int8 "
                        "(8-bit integer with --act-method)")
    p.add_argument("--act-method", default="minmax", choices=["minmax", "percentile", "mse", "kl"],
                   help="activation range calibration for --activations int8 (default minmax)")
    p.add_argument("--accuracy-level", type=int, default=None, choices=[0, 1, 2, 3, 4],
                   help="onnx: MatMulNBits accuracy_level (0 unset/fp32, 4 int8 compute: the "
                        "default)")
    p.add_argument("--act-bits", type=int, default=8, help="activation bits (default 8)")
    p.add_argument("--act-type", default="int", choices=["int", "float"],
                   help="activation type: int, or float (fp8 e4m3)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="quantize on N threads (default: all cores)")
    from workbench.jobs.cluster import add_cluster_arg
    add_cluster_arg(p)
    p.add_argument("--no-cache", action="store_true",
                   help="fit GPTQ again: neither read nor write the fit cache (docs/methods.md)")
    p.add_argument("--json", action="store_true", help="print what was written as JSON")
    p.add_argument("--verbose", action="store_true",
                   help="list every tensor's note (default: one line per kind of note, counted)")
    p.set_defaults(func=run, flags={"fmt": "--format"})


def run(args) -> int:
    from workbench.api import export_plan, format_runtime
    if args.threads is not None:
        from workbench.core.errors import WorkbenchError
        if args.threads < 1:
            raise WorkbenchError(f"--threads must be at least 1, got {args.threads}")
        import numba
        numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    plan = plan_from_args(args)
    model = open_model_arg(args)
    if args.check:
        plan, conv = apply_convention(args, model, plan, format_runtime(args.format, args.target),
                                      quiet=args.json)
        rc = run_check(args, model, plan)
        print_convention(conv, args.json)
        return rc
    if not args.output:
        from workbench.core.errors import WorkbenchError
        raise WorkbenchError("-o/--output is required (or --check to write nothing)")
    import sys
    info = export_plan(model, plan, args.format, args.output, target=args.target,
                       strict=args.strict, quantize_all=args.quantize_all,
                       convention=args.scheme if args.scheme and not args.plan else None,
                       method=args.method, calib=args.calib, imatrix=args.imatrix,
                       activations=args.activations, act_method=args.act_method,
                       act_bits=args.act_bits, act_type=args.act_type,
                       accuracy_level=args.accuracy_level, overwrite=args.overwrite,
                       executor=executor_of(args) if args.cluster else None,
                       driver=lambda job: drive(job, quiet=args.json),
                       say=lambda line: print(line, file=sys.stderr),
                       use_cache=not args.no_cache)
    conv = info.get("convention")
    if conv is not None and conv["rules"] and not args.json:
        print(f"convention: {conv['line']}", file=sys.stderr)
    if args.json:
        print_json(info)
        return 0
    print_notes(info.get("notes") or {}, args.verbose)
    if info.get("not_runnable"):
        print(f"note: {info['not_runnable']}", file=sys.stderr)
    print(f"wrote {args.output} ({args.format})")
    if info.get("fallbacks"):
        print(f"fallbacks: {info['fallbacks']['line']}")
    return 0


def print_notes(notes: dict, verbose: bool = False) -> None:
    """Per-tensor notes on stderr: one line per kind of note with its count (--verbose: every
    tensor's note)."""
    import sys

    from workbench.quant.runtimes import note_kinds
    if verbose:
        for name, note in notes.items():
            print(f"note: {name}: {note}", file=sys.stderr)
        return
    for key, names in note_kinds(notes):
        if len(names) == 1:
            print(f"note: {names[0]}: {notes[names[0]]}", file=sys.stderr)
        else:
            print(f"note: {len(names)} tensors (e.g. {names[0]}): {key.replace('<tensor>', 'it')}"
                  , file=sys.stderr)
    if len(notes) > 1 and any(len(n) > 1 for _, n in note_kinds(notes)):
        print("note: --verbose lists every tensor's note", file=sys.stderr)


def run_check(args, model, plan) -> int:
    """Exit 0 when the format can write the plan, 1 when it cannot (the reason printed)."""
    from workbench.export.preflight import check
    p = check(model, plan, args.format)
    if args.json:
        print_json(p.to_dict())
    else:
        print(f"{args.format}: {p.text()}")
    return 0 if p.ok else 1

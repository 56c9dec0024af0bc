"""`quant-workbench bench-onnx [MODEL] (--scheme S | --plan P) [--activations int8] [--batch N]
[--seq N] [--repeats N] [--threads N] [--accuracy-level L] [--keep DIR] [--json]`:
float against quantized ONNX Runtime latency on this CPU in one run, and the file sizes
(workbench.bench.onnx)."""

from __future__ import annotations

from workbench.cli.common import (add_method_args, add_model_arg, add_scheme_or_plan, apply_convention,
                      apply_methods, drive,
                      fmt_bytes, open_model_arg, plan_from_args, print_json)


def register(sub) -> None:
    p = sub.add_parser("bench-onnx", help="float vs quantized ONNX Runtime latency and file size")
    add_model_arg(p)
    add_scheme_or_plan(p)
    add_method_args(p)
    p.add_argument("--activations", default=None, choices=["int8"],
                   help="W8A8: calibrate int8 input ranges (--act-method) for the quantized "
                        "Linears, as export --activations int8")
    p.add_argument("--act-method", default="minmax", choices=["minmax", "percentile", "mse", "kl"])
    p.add_argument("--batch", type=int, default=1, help="sequences per run (default 1)")
    p.add_argument("--seq", type=int, default=128, help="tokens per sequence (default 128)")
    p.add_argument("--repeats", type=int, default=20, help="timed runs of each model (median)")
    p.add_argument("--threads", type=int, default=None,
                   help="onnxruntime intra-op threads (default: onnxruntime's, all cores)")
    p.add_argument("--accuracy-level", type=int, default=None, choices=[0, 1, 2, 3, 4],
                   help="MatMulNBits accuracy_level (default 4)")
    p.add_argument("--keep", default=None, metavar="DIR",
                   help="keep float.onnx and quantized.onnx in DIR")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args) -> int:
    from workbench.bench.onnx import bench_onnx
    from workbench.core.errors import WorkbenchError
    for flag in ("batch", "seq", "repeats"):
        if getattr(args, flag) < 1:
            raise WorkbenchError(f"--{flag} must be at least 1")
    if args.threads is not None and args.threads < 1:
        raise WorkbenchError("--threads must be at least 1")
    plan = plan_from_args(args)
    model = open_model_arg(args)
    plan, _ = apply_convention(args, model, plan, "onnxruntime", quiet=args.json)
    if args.activations:
        from workbench.running.methods_apply import activation_ranges
        from workbench.quant.runtimes import plan_decisions
        quantized = {n for n, d in plan_decisions(model, plan, "onnxruntime").items()
                     if d.applied != "keep"}
        acts = drive(activation_ranges(model, quantized, args.calib, args.act_method, 8, "int"),
                     quiet=args.json)
        plan = plan.with_activations(acts)
    plan, mm = apply_methods(args, model, plan, "onnxruntime", quiet=args.json)
    res = drive(bench_onnx(mm, plan, args.batch, args.seq, args.repeats, args.threads,
                           args.accuracy_level, args.keep), quiet=args.json)
    if args.json:
        print_json(res)
        return 0
    print(f"onnxruntime {res['onnxruntime']} {res['provider']}, {res['threads']} threads, "
          f"batch {res['batch']} x {res['seq']} tokens, median of {res['repeats']}, "
          f"accuracy_level {res['accuracy_level']}")
    for k in ("float", "quantized"):
        r = res[k]
        print(f"  {k:<10} {r['ms_median']:9.2f} ms  (min {r['ms_min']:.2f})  "
              f"{fmt_bytes(r['bytes']):>12}")
    print(f"  speedup {res['speedup']:.2f}x, size {100 * res['size_ratio']:.1f}% of float")
    return 0

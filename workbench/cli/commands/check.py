"""`quant-workbench check [MODEL] (--scheme S | --plan P) [--method M] [--calib FILE | --imatrix F]
[--held-out FILE] [--samples N] [--target RT] [--runtime torch|onnxruntime] [--json]`.

``--runtime onnxruntime`` exports the plan to ONNX (workbench.export.onnx_format) and runs the
file in ONNX Runtime (CPU execution provider) instead of swapping dequantized weights into the
transformers model (workbench.onnx_check); the figures are the same, against the float model."""

from __future__ import annotations

from ..common import (add_method_args, add_model_arg, add_scheme_or_plan, apply_convention,
                      apply_methods, drive, print_convention,
                      open_model_arg, plan_from_args, print_json)


def register(sub) -> None:
    p = sub.add_parser("check", help="end-to-end: outputs of the quantized vs the original model")
    add_model_arg(p)
    add_scheme_or_plan(p)
    p.add_argument("--calib", help="calibration text / JSONL / token ids: the inputs measured, "
                                   "and the method's calibration (default: "
                                   "resources/calibration.txt)")
    p.add_argument("--held-out", default=None, metavar="FILE",
                   help="measure on these inputs instead of --calib (the method still "
                        "calibrates on --calib)")
    add_method_args(p, calib=False)
    p.add_argument("--samples", type=int, default=None, help="use the first N samples")
    from ...runtimes import RUNTIMES
    p.add_argument("--target", default=None, choices=list(RUNTIMES),
                   help="the runtime whose rules decide each tensor's scheme (fallbacks, tensors "
                        "kept); default any (onnxruntime with --runtime onnxruntime)")
    p.add_argument("--runtime", default="torch", choices=["torch", "onnxruntime"],
                   help="what runs the quantized model: torch (the transformers model with "
                        "dequantized weights; default) or onnxruntime (the exported ONNX file, "
                        "CPU execution provider)")
    p.add_argument("--accuracy-level", type=int, default=None, choices=[0, 1, 2, 3, 4],
                   help="--runtime onnxruntime: MatMulNBits accuracy_level (default 4)")
    p.add_argument("--activations", default=None, choices=["int8"],
                   help="--runtime onnxruntime: W8A8, int8 input ranges calibrated on --calib "
                        "(--act-method) for the quantized Linears, as export --activations int8")
    p.add_argument("--act-method", default="minmax", choices=["minmax", "percentile", "mse", "kl"],
                   help="activation range calibration for --activations (default minmax)")
    p.add_argument("--save-onnx", default=None, metavar="FILE",
                   help="--runtime onnxruntime: also keep the exported ONNX file here")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args) -> int:
    from ...errors import WorkbenchError
    from ...runner import check
    plan = plan_from_args(args)
    model = open_model_arg(args)
    onnx = args.runtime == "onnxruntime"
    if onnx and args.target not in (None, "onnxruntime"):
        raise WorkbenchError(f"--runtime onnxruntime runs the rules of --target onnxruntime, "
                             f"not {args.target}")
    if not onnx and (args.accuracy_level is not None or args.save_onnx or args.activations):
        raise WorkbenchError("--accuracy-level, --activations and --save-onnx need --runtime "
                             "onnxruntime")
    target = args.target or ("onnxruntime" if onnx else "any")
    plan, conv = apply_convention(args, model, plan, target, quiet=args.json)
    if args.activations:
        from ...methods.apply import activation_ranges
        from ...runtimes import plan_decisions
        quantized = {n for n, d in plan_decisions(model, plan, target).items()
                     if d.applied != "keep"}
        plan = plan.with_activations(drive(activation_ranges(
            model, quantized, args.calib, args.act_method, 8, "int"), quiet=args.json))
    plan, mm = apply_methods(args, model, plan, target, quiet=args.json)
    if onnx:
        from ...atomic import refuse_overwriting_inputs
        from ...onnx_check import check_onnx
        if args.save_onnx:
            refuse_overwriting_inputs(model, args.save_onnx)
        res = drive(check_onnx(mm, plan, args.held_out or args.calib, args.samples,
                               accuracy_level=args.accuracy_level, keep_path=args.save_onnx),
                    quiet=args.json)
        return _print(args, res, conv)
    weights = None
    if mm is not model or args.method or target != "any":   # (--method rtn: same fallbacks)
        from ...methods.apply import runner_weights
        weights = runner_weights(mm, plan, target)
    res = drive(check(model, plan, args.held_out or args.calib, args.samples, weights=weights),
                quiet=args.json)
    return _print(args, res, conv)


def _print(args, res, conv=None) -> int:
    print_convention(conv, args.json)
    if conv is not None and args.json:
        res = {**res, "convention": conv.to_dict()}
    if args.json:
        print_json(res)
        return 0
    print(f"{res['model_kind']}: {res['samples']} samples, {res['tokens']} tokens")
    for k, v in res.items():
        if k in ("model_kind", "samples", "tokens"):
            continue
        if isinstance(v, float):
            print(f"  {k:<14} {v:.6g}")
        elif isinstance(v, dict):
            print(f"  {k:<14} " + ", ".join(f"{a} {b}" for a, b in v.items()))
        else:
            print(f"  {k:<14} {v}")
    return 0

"""`quant-workbench check [MODEL] (--scheme S | --plan P) [--method M] [--calib FILE | --imatrix F]
[--held-out FILE] [--samples N] [--target RT] [--runtime torch|onnxruntime|llama.cpp|mlx]
[--scoring chunks|lines] [--ctx N] [--chunks N] [--kld-exact] [--no-cache] [--save-gguf F]
[--json]`.

A causal LM is scored as ``llama-perplexity --kl-divergence`` scores it (workbench.running.kld): the
text as one token stream in chunks of --ctx tokens, each scored on its second half, against
the float model's next-token distributions cached on disk; ``--scoring lines`` keeps the
older per-line figures (what --runtime onnxruntime measures).

``--runtime onnxruntime`` exports the plan to ONNX (workbench.export.onnx_format) and runs the
file in ONNX Runtime (CPU execution provider) instead of swapping dequantized weights into the
transformers model (workbench.export.onnx_check); the figures are the same, against the float model.
``--runtime llama.cpp`` exports the plan and an F16 GGUF of the float model and judges the
plan's file with ``llama-perplexity --kl-divergence`` on the text (workbench.export.llama_kld): the
"kld" figures (ppl_ratio, mean, median, p99, p999, same_top1, ...) as llama.cpp prints them.
``--runtime mlx`` judges an mlx-lm folder (``--mlx-folder DIR``, or the plan exported with
``export --format mlx``): its dequantized tensors in torch on the whole text, and mlx-lm's own
forward on the first --mlx-chunks chunks, with the agreement of mlx-lm and transformers
(workbench.export.mlx_check)."""

from __future__ import annotations

import sys

from workbench.cli.common import (add_method_args, add_model_arg, add_scheme_or_plan, drive, open_model_arg,
                      plan_from_args, print_json)


def register(sub) -> None:
    p = sub.add_parser("check", help="end-to-end: outputs of the quantized vs the original model")
    add_model_arg(p)
    g = add_scheme_or_plan(p)
    g.add_argument("--mlx-folder", default=None, metavar="DIR",
                   help="--runtime mlx: judge this mlx-lm folder (a quantization of MODEL, "
                        "e.g. one mlx_lm.convert wrote) instead of a plan")
    p.add_argument("--calib", help="calibration text / JSONL / token ids: the inputs measured, "
                                   "and the method's calibration (default: "
                                   "resources/calibration.txt)")
    p.add_argument("--held-out", default=None, metavar="FILE",
                   help="measure on these inputs instead of --calib (the method still "
                        "calibrates on --calib)")
    add_method_args(p, calib=False)
    p.add_argument("--samples", type=int, default=None, help="use the first N samples")
    from workbench.quant.runtimes import RUNTIMES
    p.add_argument("--target", default=None, choices=list(RUNTIMES),
                   help="the runtime whose rules decide each tensor's scheme (fallbacks, tensors "
                        "kept); default any (onnxruntime with --runtime onnxruntime)")
    p.add_argument("--runtime", default="torch",
                   choices=["torch", "onnxruntime", "llama.cpp", "mlx"],
                   help="what runs the quantized model: torch (the transformers model with "
                        "dequantized weights; default), onnxruntime (the exported ONNX file, "
                        "CPU execution provider) or llama.cpp (the exported GGUF in "
                        "llama-perplexity --kl-divergence against an F16 GGUF; causal LMs) or "
                        "mlx (an mlx-lm folder: its dequantized tensors in torch on the text, "
                        "and mlx-lm's own forward on --mlx-chunks chunks; causal LMs, MODEL a "
                        "Hugging Face folder)")
    p.add_argument("--mlx-chunks", type=int, default=1, metavar="N",
                   help="--runtime mlx: chunks run in mlx-lm itself (default 1: its Linux CPU "
                        "backend takes about a minute a 512-token chunk of a 135M model in "
                        "bfloat16, over ten minutes 4-bit)")
    p.add_argument("--mlx-ctx", type=int, default=None, metavar="N",
                   help="--runtime mlx: tokens of each chunk mlx-lm runs (default --ctx)")
    p.add_argument("--save-gguf", default=None, metavar="FILE",
                   help="--runtime llama.cpp: also keep the plan's GGUF here")
    p.add_argument("--accuracy-level", type=int, default=None, choices=[0, 1, 2, 3, 4],
                   help="--runtime onnxruntime: MatMulNBits accuracy_level (default 4)")
    p.add_argument("--activations", default=None, choices=["int8"],
                   help="--runtime onnxruntime: W8A8, int8 input ranges calibrated on --calib "
                        "(--act-method) for the quantized Linears, as export --activations int8")
    p.add_argument("--act-method", default="minmax", choices=["minmax", "percentile", "mse", "kl"],
                   help="activation range calibration for --activations (default minmax)")
    p.add_argument("--save-onnx", default=None, metavar="FILE",
                   help="--runtime onnxruntime: also keep the exported ONNX file here")
    p.add_argument("--scoring", default="chunks", choices=["chunks", "lines"],
                   help="causal LMs: chunks (default: the whole text as one token stream in "
                        "chunks of --ctx tokens, each scored on its second half, as "
                        "llama-perplexity --kl-divergence does) or lines (each line on its own, "
                        "as --runtime onnxruntime scores)")
    p.add_argument("--ctx", type=int, default=None, metavar="N",
                   help="--scoring chunks and --runtime llama.cpp: tokens a chunk (default "
                        "512, as llama-perplexity -c 512; --scoring chunks: the model's "
                        "maximum positions when fewer)")
    p.add_argument("--chunks", type=int, default=None, metavar="N",
                   help="--scoring chunks and --runtime llama.cpp: score the first N chunks "
                        "only (default all; --samples N means the same there)")
    p.add_argument("--kld-exact", action="store_true",
                   help="--scoring chunks: also the KLD against the float model's full "
                        "next-token distributions (kld_full), beside the one from the sparse "
                        "cache (top-64 + 64 drawn ids); the cache is not read")
    p.add_argument("--no-cache", action="store_true",
                   help="neither read nor write the cached float model: its next-token "
                        "distributions (--scoring chunks, ~/.cache/quant-workbench/kld/"
                        "*.safetensors) or llama-perplexity's base logits (--runtime llama.cpp, "
                        "~/.cache/quant-workbench/kld/*.kld), nor the fitted GPTQ weights "
                        "(~/.cache/quant-workbench/method-fits)")
    p.add_argument("--emulate", choices=["auto", "llama.cpp", "none"], default="auto",
                   help="--scoring chunks: round the quantized model's Linear inputs as "
                        "llama.cpp's CPU dot products do (8-bit Q8_K / Q8_0 rows); auto "
                        "(default): with --target llama.cpp")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args) -> int:
    from workbench.api import check_plan
    plan = None if args.mlx_folder else plan_from_args(args)
    model = open_model_arg(args)
    res = check_plan(model, plan, calib=args.calib, held_out=args.held_out,
                     samples=args.samples, target=args.target, runtime=args.runtime,
                     scoring=args.scoring, ctx=args.ctx, chunks=args.chunks,
                     quantize_all=args.quantize_all,
                     convention=args.scheme if args.scheme and not args.plan else None,
                     method=args.method, imatrix=args.imatrix, activations=args.activations,
                     act_method=args.act_method, accuracy_level=args.accuracy_level,
                     save_onnx=args.save_onnx, save_gguf=args.save_gguf,
                     kld_exact=args.kld_exact, use_cache=not args.no_cache,
                     emulate=None if args.emulate == "none" else args.emulate,
                     mlx_folder=args.mlx_folder, mlx_chunks=args.mlx_chunks,
                     mlx_ctx=args.mlx_ctx,
                     driver=lambda job: drive(job, quiet=args.json),
                     say=lambda line: print(line, file=sys.stderr))
    conv = res.pop("convention", None)
    if args.json:
        print_json({**res, "convention": conv} if conv is not None else res)
        return 0
    print_convention(conv)
    if args.runtime == "llama.cpp":
        return _print_llama(res)
    if args.runtime == "mlx":
        _print_kld(res)
        return _print_mlx(res)
    if "kld" in res:
        return _print_kld(res)
    return _print(res)


def print_convention(conv) -> None:
    """The convention's one line on stderr (its --json dict), where it changed a tensor."""
    if conv is not None and conv["rules"]:
        print(f"convention: {conv['line']}", file=sys.stderr)


def _print_kld(res) -> int:
    k = res["kld"]
    src = {"hit": "from the cache", "written": "computed, cached",
           "miss": "computed", "off": "computed, not cached"}.get(k["cache"], k["cache"])
    print(f"causal-lm: {k['chunks']} chunks of {k['ctx']} tokens, {k['tokens']} tokens scored "
          f"(second half of each chunk); float distributions {src} (top-{k['top_k']}, "
          f"{k['tail_samples']} drawn from the rest)")
    if k.get("note"):
        print(f"  note: {k['note']}")
    if k.get("emulate"):
        print(f"  activations rounded as {k['emulate']}'s CPU dot products round them "
              "(--emulate; docs/vs-llama.md)")
    rows = [("Mean PPL(Q)", f"{k['ppl_quant']:.6f}"), ("Mean PPL(base)", f"{k['ppl_base']:.6f}"),
            ("Mean PPL(Q)/PPL(base)", f"{k['ppl_ratio']:.6f}"),
            ("Mean    KLD", f"{k['mean']:.6f}"), ("Maximum KLD", f"{k['max']:.6f}"),
            ("99.9%   KLD", f"{k['p999']:.6f}"), ("99.0%   KLD", f"{k['p99']:.6f}"),
            ("Median  KLD", f"{k['median']:.6f}"), ("Same top p", f"{k['same_top1']:.3f} %")]
    full = res.get("kld_full")
    if full:
        rows += [("Mean KLD (full distribution)", f"{full['mean']:.6f}"),
                 ("99.9% KLD (full distribution)", f"{full['p999']:.6f}"),
                 ("sparse KLD error (mean)", f"{-full['sparse_error_mean']:.3g} "
                                             f"({-100 * full['sparse_error_rel']:.3g} %)")]
    for a, b in rows:
        print(f"  {a:<30} {b}")
    return 0


def _print_mlx(res) -> int:
    m = res["mlx"]
    where = res["folder"] or "the plan exported with export --format mlx"
    print(f"mlx-lm folder: {where}, {res['bytes']:,} bytes of safetensors (the figures above: "
          "its tensors dequantized as mx.dequantize does, run in torch)")
    print(f"in mlx-lm itself: {m['chunks']} chunk(s) of {m['ctx']} tokens, {m['tokens']} "
          f"tokens scored; float distributions {m['float_cache']}")
    rows = [("mlx-lm (folder vs float, f32)", m["kld"]), ("torch, same tokens", m["torch_kld"])]
    print(f"  {'':<30} {'mean KLD':>10} {'99.9% KLD':>10} {'same top-1':>11} {'PPL ratio':>10}")
    for label, k in rows:
        print(f"  {label:<30} {k['mean']:>10.6f} {k['p999']:>10.6f} {k['same_top1']:>10.3f}% "
              f"{k['ppl_ratio']:>10.6f}")
    for label, a in (("float", m["agreement"]["float"]),
                     ("quantized", m["agreement"]["quantized"])):
        print(f"  mlx-lm vs transformers, {label:<9}: mean KL {a['mean']:.3g}, 99.9% "
              f"{a['p999']:.3g}, max {a['max']:.3g}, same top-1 {a['same_top1']:.2f} %")
    print("  seconds           " + ", ".join(f"{a} {b}" for a, b in res["seconds"].items()))
    return 0


def _print_llama(res) -> int:
    k = res["kld"]
    print(f"causal-lm in llama.cpp: {res['tokens']} tokens scored in {res['chunks']} chunks of "
          f"{res['ctx']} ({res['text']}), plan file {res['bytes']:,} bytes")
    names = [("ppl_ratio", "PPL(Q)/PPL(base)"), ("mean", "KLD mean"), ("median", "KLD median"),
             ("p99", "KLD 99.0%"), ("p999", "KLD 99.9%"), ("max", "KLD max"),
             ("same_top1", "same top-1"), ("ppl_base", "PPL(base)"), ("ppl_quant", "PPL(Q)")]
    for key, label in names:
        v = k.get(key)
        if v is None:
            continue
        print(f"  {label:<17} {v:.3f} %" if key == "same_top1" else f"  {label:<17} {v:.6g}")
    if not k.get("complete", True):
        print("  (llama-perplexity's final statistics were missing: figures from its last chunk "
              "row)")
    print("  seconds           " + ", ".join(
        f"{a} {b:.1f}" if isinstance(b, float) else f"{a} {b}" for a, b in res["seconds"].items()))
    return 0


def _print(res) -> int:
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

"""`quant-workbench bench-mlx (MODEL | --real smollm2|gemma3) --held-out F [--calib F] [--recipes q4-g64,mixed_3_6,mixed_4_6]
[--dynamic BPW] [--ctx 512] [--chunks N] [--mlx-chunks 1] [--mlx-ctx N] [--timeout S] [--workbench-args "..."]
[-o DIR] [--json]`: mlx-lm's own recipes (mlx_lm convert, timed) against the default
`allocate --target mlx --budget-of A` + `export --format mlx` at each one's bytes, every folder
judged by `check --runtime mlx` on held-out text (workbench.bench.mlx)."""

from __future__ import annotations

from workbench.cli.common import print_json


def register(sub) -> None:
    from workbench.bench.mlx import DEFAULT_RECIPES, DEFAULT_TIMEOUT
    from workbench.cli.commands.bench_allocate import race_inputs, race_options
    p = sub.add_parser("bench-mlx", help="mlx-lm's own quantization recipes against allocate "
                       "--target mlx + export --format mlx at the same bytes, judged on "
                       "held-out text (in torch and in mlx-lm)")
    p.add_argument("model", nargs="?", default=None,
                   help="a float Hugging Face folder mlx-lm loads, or a GGUF (converted with "
                        "convert --to hf --off-grid 0 first, into the output folder)")
    p.add_argument("--real", default=None, choices=["smollm2", "gemma3"],
                   help="instead of MODEL: the installed SmolLM2-135M or Gemma 3 270M GGUF "
                        "(workbench/bench/real_lms.py)")
    race_inputs(p, "allocate (and --dynamic)", "the text the folders are judged on; "
                "required, and not the calibration text")
    p.add_argument("--recipes", default=",".join(DEFAULT_RECIPES),
                   help="mlx-lm's folders to race (default "
                        f"{','.join(DEFAULT_RECIPES)}: uniform 4-bit group 64 and its "
                        "--quant-predicate recipes)")
    p.add_argument("--dynamic", type=float, default=None, metavar="BPW",
                   help="also mlx_lm dynamic_quant --target-bpw BPW (slow: its gradient pass "
                        "took over 70 minutes for SmolLM2 on 2 CPU cores); its calibration "
                        "file ~/.cache/mlx-lm/calibration_v5.txt becomes --calib")
    p.add_argument("--ctx", type=int, default=512, help="tokens a chunk (default 512)")
    p.add_argument("--mlx-chunks", type=int, default=1,
                   help="chunks each folder runs in mlx-lm itself (default 1)")
    p.add_argument("--mlx-ctx", type=int, default=None, metavar="N",
                   help="tokens of each chunk mlx-lm runs (default --ctx; mlx's CPU quantized "
                        "matmuls take minutes a 512-token chunk of a 135M model)")
    race_options(p, DEFAULT_TIMEOUT, "", "more allocate options, one quoted string",
                 "every folder, plan and log", "./bench-mlx-NAME-TIME")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    from workbench.bench.mlx import bench_mlx, parse_recipes, table
    from workbench.cli.commands.bench_allocate import drive_lines, race_paths
    from workbench.core.errors import WorkbenchError
    if (args.model is None) == (args.real is None):
        raise WorkbenchError("bench-mlx needs MODEL or --real smollm2|gemma3 (one of them)")
    if args.real:
        from workbench.bench import real_lms
        model = (real_lms.smollm2_gguf if args.real == "smollm2" else real_lms.gemma3_gguf)(
            required=True)
    else:
        model = args.model
    if not args.held_out:
        raise WorkbenchError("bench-mlx needs --held-out FILE: a text the calibration never "
                             "saw")
    recipes = parse_recipes(args.recipes)
    calib, out, extra = race_paths(args, "bench-mlx", model)
    res = drive_lines(bench_mlx(model, calib, args.held_out, out, recipes, ctx=args.ctx,
                                chunks=args.chunks, mlx_chunks=args.mlx_chunks,
                                mlx_ctx=args.mlx_ctx,
                                dynamic=args.dynamic, workbench_args=extra,
                                timeout=args.timeout))
    if args.json:
        print_json(res)
    else:
        print(table(res))
    return 0

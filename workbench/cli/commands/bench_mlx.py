"""`quant-workbench bench-mlx (MODEL | --real smollm2|gemma3) --held-out F [--calib F] [--recipes q4-g64,mixed_3_6,mixed_4_6]
[--dynamic BPW] [--ctx 512] [--chunks N] [--mlx-chunks 1] [--mlx-ctx N] [--timeout S] [--workbench-args "..."]
[-o DIR] [--json]`: mlx-lm's own recipes (mlx_lm convert, timed) against the default
`allocate --target mlx --budget-of A` + `export --format mlx` at each one's bytes, every folder
judged by `check --runtime mlx` on held-out text (workbench.bench.mlx)."""

from __future__ import annotations

from workbench.cli.common import print_json


def register(sub) -> None:
    from workbench.bench.mlx import DEFAULT_RECIPES, DEFAULT_TIMEOUT
    p = sub.add_parser("bench-mlx", help="mlx-lm's own quantization recipes against allocate "
                       "--target mlx + export --format mlx at the same bytes, judged on "
                       "held-out text (in torch and in mlx-lm)")
    p.add_argument("model", nargs="?", default=None,
                   help="a float Hugging Face folder mlx-lm loads, or a GGUF (converted with "
                        "convert --to hf --off-grid 0 first, into the output folder)")
    p.add_argument("--real", default=None, choices=["smollm2", "gemma3"],
                   help="instead of MODEL: the installed SmolLM2-135M or Gemma 3 270M GGUF "
                        "(workbench/bench/real_lms.py)")
    p.add_argument("--held-out", required=True, metavar="FILE",
                   help="the text the folders are judged on; not the calibration text")
    p.add_argument("--calib", default=None, metavar="FILE",
                   help="calibration text for allocate (and --dynamic; default: "
                        "resources/calibration.txt)")
    p.add_argument("--recipes", default=",".join(DEFAULT_RECIPES),
                   help="mlx-lm's folders to race (default "
                        f"{','.join(DEFAULT_RECIPES)}: uniform 4-bit group 64 and its "
                        "--quant-predicate recipes)")
    p.add_argument("--dynamic", type=float, default=None, metavar="BPW",
                   help="also mlx_lm dynamic_quant --target-bpw BPW (slow: its gradient pass "
                        "took over 70 minutes for SmolLM2 on 2 CPU cores); its calibration "
                        "file ~/.cache/mlx-lm/calibration_v5.txt becomes --calib")
    p.add_argument("--ctx", type=int, default=512, help="tokens a chunk (default 512)")
    p.add_argument("--chunks", type=int, default=None,
                   help="score at most N chunks of the held-out text (default: all)")
    p.add_argument("--mlx-chunks", type=int, default=1,
                   help="chunks each folder runs in mlx-lm itself (default 1)")
    p.add_argument("--mlx-ctx", type=int, default=None, metavar="N",
                   help="tokens of each chunk mlx-lm runs (default --ctx; mlx's CPU quantized "
                        "matmuls take minutes a 512-token chunk of a 135M model)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                   help=f"stop any one step after S seconds (default {DEFAULT_TIMEOUT:g})")
    p.add_argument("--workbench-args", default="", metavar="\"ARGS\"",
                   help="more allocate options, one quoted string")
    p.add_argument("-o", "--output", default=None, metavar="DIR",
                   help="a new (or empty) folder keeping every folder, plan and log "
                        "(default: ./bench-mlx-NAME-TIME)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    import time
    from pathlib import Path

    from workbench.bench.mlx import bench_mlx, parse_recipes, table
    from workbench.bench.vs_llama import split_args
    from workbench.cli.commands.bench_allocate import drive_lines
    from workbench.core.errors import WorkbenchError
    if (args.model is None) == (args.real is None):
        raise WorkbenchError("bench-mlx needs MODEL or --real smollm2|gemma3 (one of them)")
    if args.real:
        from workbench.bench import real_lms
        model = (real_lms.smollm2_gguf if args.real == "smollm2" else real_lms.gemma3_gguf)(
            required=True)
    else:
        model = args.model
    recipes = parse_recipes(args.recipes)
    extra = split_args(args.workbench_args)
    calib = args.calib or str(Path(__file__).resolve().parents[3] / "resources" /
                              "calibration.txt")
    out = args.output or f"bench-mlx-{Path(model).resolve().name}-" \
                         f"{time.strftime('%Y%m%d-%H%M%S')}"
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

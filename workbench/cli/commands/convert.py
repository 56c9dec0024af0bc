"""`quant-workbench convert SRC.gguf --to hf DIR | --to gguf OUT.gguf [--dtype bf16|f16|f32]
[--off-grid [SEED]] [--json]`: a (quantized) GGUF as a float model (docs/real-models.md);
`convert MLX_DIR --to hf DIR`: an mlx-lm folder as a float Hugging Face folder."""

from __future__ import annotations

from workbench.cli.common import drive, fmt_bytes, print_json


def register(sub) -> None:
    from workbench.export.convert import DEFAULT_DTYPE, DTYPES, TARGETS
    p = sub.add_parser("convert", help="a GGUF as a float Hugging Face folder or F16/BF16 GGUF; "
                                       "an mlx-lm folder as a float Hugging Face folder")
    p.add_argument("source", help="the GGUF file to convert (any GGML type the workbench "
                                  "reads), or an mlx-lm folder (any mode, mixed; --to hf)")
    p.add_argument("--to", required=True, choices=TARGETS,
                   help="hf: a Hugging Face folder (config.json, tokenizer, model.safetensors) "
                        "that transformers and every model-level command run; gguf: a float "
                        "GGUF with the source's metadata and tokenizer, for llama.cpp")
    p.add_argument("output", help="the folder (--to hf: new or empty) or file (--to gguf: new) "
                                  "to write")
    p.add_argument("--dtype", default=None, choices=DTYPES,
                   help=f"storage type of the weights (default {DEFAULT_DTYPE} for a GGUF: the "
                        "type both real LMs were released in; norms of a GGUF stay f32; an "
                        "mlx-lm folder: its own float dtype, in which mlx dequantizes)")
    p.add_argument("--off-grid", nargs="?", type=int, const=0, default=None, metavar="SEED",
                   help="take the weights off the grid they were quantized to with an exact "
                        "reparametrisation (norm gains folded into the layers they feed, v/o "
                        "and up/down scaled by reciprocal random factors of SEED, default 0): "
                        "the outputs stay the same")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args) -> int:
    from workbench.api import convert_gguf
    info = convert_gguf(args.source, args.to, args.output, dtype=args.dtype,
                        off_grid=args.off_grid, driver=lambda job: drive(job, quiet=args.json))
    if args.json:
        print_json(info)
        return 0
    what = "Hugging Face folder" if args.to == "hf" else "GGUF"
    print(f"wrote {info['output']}: {what}, {info['tensors']} tensors in {info['dtype']}, "
          f"{fmt_bytes(info['bytes'])}, {info['seconds']:.1f} s")
    og = info["off_grid"]
    if og is not None:
        norms = (f"{len(og['folded_norms'])} norms folded into the layers they feed"
                 if og["folded_norms"] or not og["factored_norms"] else
                 f"{len(og['factored_norms'])} norms passed a random factor per channel to the "
                 "layers they feed")
        print(f"off-grid (seed {og['seed']}): {len(og['changed'])} tensors changed, {norms}, "
              f"{len(og['scaled_pairs'])} pairs scaled by reciprocal factors")
        if og["not_folded"]:
            print(f"  not folded (not exact): {len(og['not_folded'])} norms, e.g. "
                  f"{next(iter(og['not_folded']))}")
    grid = info["on_source_grid"]
    if grid:
        shown = ", ".join(f"{n} ({t})" for n, t in list(grid.items())[:6])
        more = f" and {len(grid) - 6} more" if len(grid) > 6 else ""
        print(f"still on the source's quantization grid: {shown}{more}"
              + (" (leave them out of comparisons)" if og is not None else ""))
    return 0

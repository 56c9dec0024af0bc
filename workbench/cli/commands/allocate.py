"""`quant-workbench allocate [MODEL] (--budget-bpw X [--bpw-over all|linear] | --budget-bytes N
| --budget-file-bytes N | --budget-of FILE) [--schemes ..]
[--calib F | --imatrix F] [--measure weight|activation|fisher|output] [--samples N] [--target RT]
[--pin NAME=SCHEME ..] [--methods auto|M,..] -o PLAN.json [--json]`."""

from __future__ import annotations

from workbench.cli.common import add_model_arg, drive, executor_of, open_model_arg, print_json
from workbench.cli.commands.sensitivity import AUTO, add_table_args, say


def register(sub) -> None:
    p = sub.add_parser("allocate", help="best plan (least total sensitivity) within a size budget")
    add_model_arg(p)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--budget-bpw", type=float,
                   help="bits per weight over every tensor as evaluate counts them (embeddings, "
                        "norms, an unused pooler included), or over the Linear weights with "
                        "--bpw-over linear")
    g.add_argument("--budget-bytes", type=int,
                   help="bytes of every tensor as evaluate counts them (no file header)")
    g.add_argument("--budget-file-bytes", type=int, metavar="N",
                   help="bytes of the whole file the export writes (GGUF for llama.cpp: header, "
                        "tokenizer, plan and padding included; solves for --target llama.cpp)")
    g.add_argument("--budget-of", metavar="FILE",
                   help="no bigger than an existing file: a .gguf file's size (as "
                        "--budget-file-bytes), a .safetensors file's tensor bytes (as "
                        "--budget-bytes) or an mlx-lm folder's safetensors bytes (the sum of "
                        "its .safetensors files' sizes; --target mlx)")
    p.add_argument("--bpw-over", choices=["all", "linear"], default=None,
                   help="what --budget-bpw counts: every tensor (all, the default) or the "
                        "Linear weights only (attention / MLP projections, experts, LM head; "
                        "the other tensors are kept unless pinned)")
    add_table_args(p, AUTO)
    p.add_argument("--pin", action="append", default=[], metavar="NAME=SCHEME",
                   help="keep a tensor at a scheme (repeatable); NAME may be a moe: selector "
                        "(moe:experts.down@5, moe:router; docs/moe.md) for every tensor it "
                        "addresses")
    p.add_argument("--methods", default="auto", metavar="M[,M..]",
                   help="quantization methods weighed per tensor with each scheme (rtn, "
                        "imatrix, gptq; docs/methods.md), each fitted on half the calibration "
                        "samples and judged on the other half: auto (the default) weighs all "
                        "three when the measure is fisher/activation/output and the model runs "
                        "on the calibration text (gptq only on the schemes next to the first "
                        "allocation's), else rtn; 'rtn' gives the scheme-only plan")
    p.add_argument("-o", "--output", required=True, help="plan JSON to write")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run, flags={"pins": "--pin"})


def run(args) -> int:
    from workbench import api
    from workbench.planning.budget import from_flags
    from workbench.core.errors import WorkbenchError
    budget = from_flags(args.budget_bpw, args.budget_bytes, args.budget_file_bytes,
                        args.budget_of, args.bpw_over)   # bad numbers and unreadable files first
    pins = {}
    for item in args.pin:
        if "=" not in item:
            raise WorkbenchError(f"--pin {item!r}: expected NAME=SCHEME")
        n, s = item.split("=", 1)
        pins[n] = s
    model = open_model_arg(args)
    a = api.allocate_plan(model, budget, schemes=args.schemes, measure=args.measure,
                          calib=args.calib, imatrix=args.imatrix, samples=args.samples,
                          target=args.target, pins=pins, methods=args.methods,
                          output=args.output, executor=executor_of(args),
                          use_cache=not args.no_cache,
                          driver=lambda job: drive(job, quiet=args.json), say=say,
                          notes=not args.json, estimate=True)
    out = a.to_dict(args.output)
    if args.json:
        print_json(out)
        return 0
    t, acc, sol, mstat = a.evaluation.totals, a.accounting, a.solution, a.methods_weighed
    print(f"wrote {args.output}: budget {budget.describe()} = {a.budget_bytes:,d} bytes")
    fb = acc.get("file_bytes")
    lb = acc["bits_per_weight_linear"]
    print(f"  {t.bytes_after:,d} bytes of tensors, {t.bits_per_weight:.3f} bits/weight over "
          f"every tensor, " + (f"{lb:.3f} over the Linear weights" if lb is not None
                               else "no Linear weights")
          + (f", {fb['format']} file {fb['bytes']:,d} bytes" if fb else "")
          + f"; model SQNR {t.sqnr_db:.2f} dB")
    what = {"kl": "predicted KL divergence", "1-cosine": "predicted 1 - cosine"}.get(
        out["predicted_unit"], "total")
    unit = " nats/token" if out["predicted_unit"] == "kl" else ""
    print(f"  {a.measure} sensitivity ({out['measure_reason']}) {what} {sol.error:.6g}{unit} "
          f"({'optimal' if sol.exact else f'lower bound {sol.bound:.6g}'}); "
          f"solved in {1000 * a.seconds['solve']:.1f} ms")
    if out["predicted_unit"] == "kl" and a.target == "llama.cpp":
        print("  (predicted with float activations: llama.cpp's CPU backend also rounds them to "
              "8 bits, +5 % mean KLD on SmolLM2 at q4_k; `check` emulates it, docs/vs-llama.md)")
    print("  " + ", ".join(f"{s}: {c}" for s, c in out["schemes"].items() if c))
    print("  methods: " + ", ".join(f"{m}: {c}" for m, c in out["methods"].items())
          + f" (weighed {', '.join(mstat['methods'])}"
          + (f"; {mstat['pairs']} pairs in {mstat['seconds']:.1f} s)" if mstat.get("pairs")
             else ")"))
    return 0

"""`quant-workbench bench-model [--params 8e9] [--dir DIR] [--keep] [--steps ...] [--json]`.

Generates a Llama-3-shaped bf16 checkpoint of about --params parameters (8e9: Llama-3-8B's
shape) and runs each step on it in its own process, reporting wall time and peak resident
memory: open, statistics, evaluate q4_k, weight sensitivity, GGUF export (the weight-level
steps), then calibrate, activation sensitivity, check, fisher sensitivity, GPTQ and the
layer-by-layer forward rate against a plain torch forward of one block (the model-level
steps). A checkpoint already generated in --dir with the same shape is reused.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from workbench.cli.common import close_lines, print_json, progress_lines
from workbench.core.progress import Progress


def register(sub) -> None:
    p = sub.add_parser("bench-model", help="memory and time of every step on a generated "
                                           "Llama-3-shaped bf16 checkpoint (8e9: Llama-3-8B)")
    p.add_argument("--params", type=float, default=8e9,
                   help="approximate parameter count (default 8e9: Llama-3-8B's shape)")
    p.add_argument("--dir", help="folder for the checkpoint and the step outputs (default: a "
                                 "temporary folder under $TMPDIR); an identical checkpoint "
                                 "already there is reused")
    p.add_argument("--keep", action="store_true",
                   help="keep the generated checkpoint (default: removed after)")
    p.add_argument("--steps", default=None,
                   help="weight, model, all, or a comma-separated list of steps "
                        "(default: all when the bf16 checkpoint is under half the RAM, "
                        "else weight)")
    p.add_argument("--samples", type=int, default=8,
                   help="calibration samples for the model-level steps (lines of "
                        "resources/calibration.txt; default 8)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds a step may run before it is stopped and reported failed")
    p.add_argument("--max-memory", type=float, default=None, metavar="GB",
                   help="cap each step's private memory at GB (heap and anonymous maps, not "
                        "the memory-mapped checkpoint): a step that needs more fails with out "
                        "of memory instead of starving the machine (default: 3/4 of the RAM; 0: no "
                        "cap, as on a GPU, whose driver maps large regions)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def _steps(arg: str | None, nbytes: int) -> list[str]:
    from workbench.bench.model import MODEL_STEPS, STEPS, WEIGHT_STEPS
    from workbench.core.errors import WorkbenchError
    if arg is None:
        import os
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        arg = "all" if nbytes < ram / 2 else "weight"
    if arg == "weight":
        return list(WEIGHT_STEPS)
    if arg == "model":
        return list(MODEL_STEPS)
    if arg == "all":
        return list(STEPS)
    steps = [s.strip() for s in arg.split(",") if s.strip()]
    bad = [s for s in steps if s not in STEPS]
    if bad or not steps:
        raise WorkbenchError(f"--steps: unknown step {bad[0] if bad else '(none)'!r}; "
                             f"choose weight, model, all or from {', '.join(STEPS)}")
    return steps


def _same_checkpoint(folder: Path, shape) -> bool:
    import json
    try:
        cfg = json.loads((folder / "config.json").read_text())
        index = json.loads((folder / "model.safetensors.index.json").read_text())
    except (OSError, ValueError):
        return False
    want = shape.config()
    same = all(cfg.get(k) == want[k] for k in ("hidden_size", "num_hidden_layers",
                                                 "intermediate_size", "vocab_size",
                                                 "num_attention_heads", "num_key_value_heads"))
    shards = set(index.get("weight_map", {}).values())
    return same and bool(shards) and all((folder / s).is_file() for s in shards)


def _remove_generated(folder: Path, created_folder: bool) -> None:
    """Remove only what bench-model wrote (a user's --dir may hold other files)."""
    import json
    import shutil
    try:
        shards = set(json.loads((folder / "model.safetensors.index.json").read_text())
                     ["weight_map"].values())
    except (OSError, ValueError, KeyError):
        shards = set()
    for name in [*shards, "model.safetensors.index.json", "config.json", "tokenizer.json",
                 "tokenizer_config.json"]:
        (folder / name).unlink(missing_ok=True)
    for p in folder.glob("bench-*"):
        p.unlink(missing_ok=True)
    if created_folder:
        shutil.rmtree(folder, ignore_errors=True)


def run(args) -> int:
    from workbench.bench.model import generate, llama_shape, run_steps
    from workbench.core.errors import WorkbenchError
    shape = llama_shape(args.params)
    steps = _steps(args.steps, shape.params * 2)
    if args.samples < 1:
        raise WorkbenchError("--samples must be at least 1")
    from workbench.core.checks import check_float
    check_float("max_memory", args.max_memory, 0.0, 1e6, none=True, unit=" GB (0: no cap)")
    check_float("timeout", args.timeout, 0.0, 1e7, none=True, lo_open=True, unit=" seconds")
    from workbench.bench.model import check_disk
    created = args.dir is None or not Path(args.dir).exists()
    if args.dir is not None:
        check_disk(args.dir, shape, steps, not _same_checkpoint(Path(args.dir), shape))
    else:
        check_disk(tempfile.gettempdir(), shape, steps)
    folder = Path(args.dir or tempfile.mkdtemp(prefix="qwb-bench-model-"))
    say = (lambda *a: print(*a, file=sys.stderr, flush=True))
    res: dict = {"params": shape.params, "bytes": shape.params * 2, "shape": shape.__dict__.copy(),
                 "samples": args.samples, "folder": str(folder)}
    reused = _same_checkpoint(folder, shape)
    try:
        if reused:
            say(f"reusing the checkpoint in {folder}")
            res["generate_s"] = None
        else:
            say(f"generating {shape.params:,} parameters ({shape.params * 2 / 1e9:.1f} GB bf16) "
                f"in {folder} ...")
            t0 = time.perf_counter()
            lines = progress_lines()
            try:
                gen = generate(folder, args.params, seed=args.seed, progress=lambda i, n, name:
                               lines(Progress(i, n, f"generating tensor {i}/{n} {name}")))
            finally:
                close_lines(lines)
            res["generate_s"] = round(time.perf_counter() - t0, 1)
            res["shards"] = gen["shards"]

        # a step runs in a child process: the heartbeat's lines say which, at least every
        # progress_every() seconds, while the parent waits
        lines = progress_lines()
        reported = [0]

        def step_event(k, line=""):
            if k < len(steps):
                lines(Progress(k, len(steps), f"step {k + 1}/{len(steps)} {steps[k]}"
                               + (f": {line}" if line else "")))

        def watch(k, step, line):        # the child's own latest line: its stage, i/N, ETA
            step_event(k, line)

        def report(r):
            state = "ok" if r["ok"] else f"FAILED: {r.get('error')}"
            say(f"  {r['step']:<24} {r['wall_s']:>9.1f} s  {r['peak_rss_mb']:>8.0f} MB  {state}")
            reported[0] += 1
            step_event(reported[0])
        say(f"running {len(steps)} steps, each in its own process ...")
        step_event(0)
        import os
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        cap = 0.75 * ram if args.max_memory is None else args.max_memory * 1e9
        res["max_memory_gb"] = round(cap / 1e9, 1) if cap > 0 else None
        try:
            res["steps"] = run_steps(str(folder), folder, steps, args.samples, args.timeout,
                                     report, cap, watch)
        finally:
            close_lines(lines)
    finally:
        if not args.keep and not reused:
            _remove_generated(folder, created)
        elif args.keep is False and reused:
            for p in folder.glob("bench-*"):
                p.unlink(missing_ok=True)
    if args.json:
        print_json(res)
    else:
        _print(res)
    return 0 if all(s["ok"] for s in res["steps"]) else 1


def _print(res: dict) -> None:
    s = res["shape"]
    print(f"checkpoint  {res['params']:,} params, {res['bytes'] / 1e9:.2f} GB bf16: hidden "
          f"{s['hidden']}, {s['layers']} layers, MLP {s['intermediate']}, {s['heads']} heads / "
          f"{s['kv_heads']} KV, vocab {s['vocab']}"
          + (f"; generated in {res['generate_s']:.0f} s" if res.get("generate_s") else ""))
    print(f"{'step':<24} {'wall s':>9} {'peak RSS MB':>12}")
    for r in res["steps"]:
        extra = "" if r["ok"] else f"  FAILED: {r.get('error')}"
        print(f"{r['step']:<24} {r['wall_s']:>9.1f} {r['peak_rss_mb']:>12.0f}{extra}")
        if r["step"] == "forward" and r["ok"]:
            print(f"  layer-by-layer pass {r['layerwise_tokens_per_s']:.1f} tokens/s; plain torch "
                  f"forward of one block x {s['layers']} layers (baseline, same run): "
                  f"{r['baseline_tokens_per_s']:.1f} tokens/s")

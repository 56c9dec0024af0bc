"""Helpers shared by the CLI commands: model argument, JSON output, progress."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from workbench.core.progress import TextProgress, run


def default_model_path() -> Path:
    return Path(__file__).resolve().parents[2] / "resources" / "demo_model" / "model.safetensors"


def add_model_arg(p) -> None:
    p.add_argument("model", nargs="?", default=None,
                   help="checkpoint file or folder (default: the bundled demo model)")


def model_path(args) -> str:
    return str(args.model) if args.model else str(default_model_path())


# commands that read a GGUF as the float Hugging Face model `convert --to hf` would write
# (workbench.export.convert.live), converted on the fly, when it has no config.json beside it; the
# others (inspect, map, schemes, diff) read its own tensors, names and types
LIVE_GGUF_COMMANDS = frozenset({"check", "calibrate", "sensitivity", "allocate", "frontier",
                                "export", "evaluate", "bench-onnx"})
# of those, the ones that cannot work on a GGUF's weights alone: another architecture is refused
MUST_RUN_COMMANDS = frozenset({"check", "calibrate"})


def open_model_arg(args):
    from workbench.formats.loaders import open_model
    if getattr(args, "device", None):
        from workbench.running.runner_config import set_device
        set_device(args.device)
    path = model_path(args)
    command = getattr(args, "command", None)
    if command in LIVE_GGUF_COMMANDS:
        from workbench.export.convert import live
        if live.wants_live(path):
            if getattr(args, "cluster", None):
                from workbench.core.errors import WorkbenchError
                raise WorkbenchError("--cluster: workers cannot share a GGUF converted on the "
                                     "fly; write it once with `quant-workbench convert "
                                     "MODEL.gguf --to hf DIR` and give DIR", path=path)
            from workbench.running.inputs import validate_gguf_inputs     # before converting
            validate_gguf_inputs(path, getattr(args, "calib", None),
                                 getattr(args, "held_out", None), check=(
                                     args.runtime, args.scoring) if command == "check" else None)
            return drive(live.open_live(path))
        md = live.gguf_metadata(path) if command in MUST_RUN_COMMANDS else None
        if md is not None and not (Path(path).expanduser().parent / "config.json").exists():
            from workbench.core.errors import WorkbenchError
            raise WorkbenchError(live.unsupported_message(md), path=path)
    return open_model(path)


def add_device_arg(p) -> None:
    """--device for the commands that run the model (workbench.running.runner)."""
    if any("--device" in a.option_strings for a in p._actions):
        return
    p.add_argument("--device", default=None, choices=["cpu", "cuda"],
                   help="where model-level work runs, one block at a time (default: cuda when "
                        "torch sees a GPU, else cpu)")


# argument dests that name files (or folders) a command writes; every other string argument
# naming an existing path is an input of the command, except the ones below that are never paths
OUTPUT_DESTS = frozenset({"output", "make_llama_f16", "save_onnx", "save_gguf", "keep"})
# string options that are names, not paths (an argument with `choices` is never a path either):
# `--format gguf` or `--scheme q8_0` with a ./gguf or ./q8_0 folder present is not that folder
NON_PATH_DESTS = frozenset({
    "command", "format", "scheme", "schemes", "rule", "pin", "methods", "method", "types",
    "recipes", "layer", "size", "tab", "cluster", "workbench_args", "act_method", "act_type",
    "tensor", "backend", "scope", "device", "target", "runtime", "overlay", "bpw_over", "steps",
    "to", "dtype", "scoring", "paths", "measure"})


def check_file_args(args, parser=None) -> None:
    """Refuse (exit 2, before anything is written) an output argument that names an input of
    the same command: the same file by inode (symbolic and hard links included), a file the
    model is read with, or an existing folder holding an input (workbench.core.outputs). `parser`
    (the command line's): arguments with `choices` are names, never input paths."""
    from workbench.core.outputs import refuse_inputs_as_outputs
    d = {k: v for k, v in vars(args).items() if k not in ("func", "command")}
    outputs = {_label(k): v for k, v in d.items()
               if k in OUTPUT_DESTS and isinstance(v, str) and v}
    if not outputs:
        return
    skip = NON_PATH_DESTS | _choice_dests(parser, getattr(args, "command", None))
    inputs = {}
    for k, v in d.items():
        if k in OUTPUT_DESTS or k in skip or k.startswith("_"):
            continue
        vals = v if isinstance(v, (list, tuple)) else [v]
        for i, x in enumerate(vals):
            if isinstance(x, (str, Path)) and str(x):
                inputs[_label(k) + (f"[{i}]" if len(vals) > 1 else "")] = str(x)
    if "model" in d and not d["model"] and d.get("command") != "gui":
        inputs["MODEL"] = str(default_model_path())
    if "calib" in d and not d["calib"]:
        # workbench.running.calibration.DEFAULT_CALIB, without importing it
        inputs["--calib"] = str(Path(__file__).resolve().parents[2] / "resources"
                                / "calibration.txt")
    refuse_inputs_as_outputs(outputs, inputs)


def _choice_dests(parser, command) -> set:
    """The dests of `command`'s arguments that take one of fixed `choices` (never paths)."""
    import argparse
    if parser is None:
        return set()
    actions = list(parser._actions)   # noqa: SLF001 (argparse has no API for this)
    for a in parser._actions:          # noqa: SLF001
        if isinstance(a, argparse._SubParsersAction) and command in a.choices:   # noqa: SLF001
            actions += a.choices[command]._actions                               # noqa: SLF001
    return {a.dest for a in actions if a.choices is not None
            and not isinstance(a, argparse._SubParsersAction)}                 # noqa: SLF001


def _label(dest: str) -> str:
    return "MODEL" if dest == "model" else "--" + dest.replace("_", "-")


def json_safe(obj):
    """Replace non-finite floats by None so the output is strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if hasattr(obj, "item") and hasattr(obj, "dtype"):
        return json_safe(obj.item())
    return obj


LARGE_JSON_ITEMS = 20_000


def print_json(obj) -> None:
    """Strict JSON on stdout (non-finite floats as null), indented; a large document (more
    than LARGE_JSON_ITEMS rows in a list) is written compact by the C encoder, which is many
    times faster than the indenting one (300,000 tensors: seconds otherwise)."""
    large = _largest_list(obj) > LARGE_JSON_ITEMS
    if large:
        try:
            text = json.dumps(obj, allow_nan=False)   # C encoder; fails on NaN / numpy
        except (ValueError, TypeError):
            text = json.dumps(json_safe(obj), allow_nan=False)
    else:
        text = json.dumps(json_safe(obj), indent=2, allow_nan=False)
    sys.stdout.write(text)
    sys.stdout.write("\n")


def _largest_list(obj, depth: int = 0) -> int:
    """The length of the longest list in the top two levels of `obj`."""
    if isinstance(obj, (list, tuple)):
        return len(obj)
    if isinstance(obj, dict) and depth < 2:
        return max((_largest_list(v, depth + 1) for v in obj.values()), default=0)
    return 0


def executor_of(args):
    """The executor of the command's --cluster (workbench.jobs.cluster), opened once per command
    and closed by cli.main; None without --cluster (the in-process path)."""
    spec = getattr(args, "cluster", None)
    if not spec:
        return None
    if getattr(args, "_executor", None) is None:
        from workbench.jobs.cluster import open_executor
        args._executor = open_executor(spec)
        if getattr(args._executor, "note", None):     # local:N capped by the cores
            print(f"note: {args._executor.note}", file=sys.stderr)
    return args._executor


#: seconds between progress lines off a terminal (and before the first), unless
#: $QUANT_WORKBENCH_PROGRESS_EVERY says otherwise (tests lower it)
PROGRESS_EVERY = 10.0


def progress_every() -> float:
    """The progress-line interval: $QUANT_WORKBENCH_PROGRESS_EVERY seconds (a positive number),
    else PROGRESS_EVERY."""
    import os
    try:
        v = float(os.environ.get("QUANT_WORKBENCH_PROGRESS_EVERY", ""))
    except ValueError:
        return PROGRESS_EVERY
    return v if 0 < v < float("inf") else PROGRESS_EVERY


#: the running command (cli.main sets it): its name, the progress lines' label, and when it
#: started or last printed a progress line (time.monotonic), from which the next job's first
#: line is due: one command, one cadence, however many jobs it drives one after another
PROGRESS_STATE = {"label": "", "last": None}


def progress_lines(label: str | None = None):
    """The driver's LineProgress on stderr, labelled with the command's name: the first line
    progress_every() seconds after the command started or last printed one, then at least that
    often (a heartbeat repeats the latest event); close_lines() it when done."""
    import time

    from workbench.core.progress import LineProgress
    every = progress_every()
    last = PROGRESS_STATE["last"]
    first = every if last is None else min(every, max(0.0, every - (time.monotonic() - last)))
    return LineProgress(every=every, first_after=first, heartbeat=True,
                        label=PROGRESS_STATE["label"] if label is None else label)


def close_lines(lines) -> None:
    """Stop a progress_lines' heartbeat and remember when it printed last."""
    lines.close()
    if lines.last_line is not None and PROGRESS_STATE["last"] is not None:
        PROGRESS_STATE["last"] = max(PROGRESS_STATE["last"], lines.last_line)


def drive(job, quiet: bool = False, label: str | None = None):
    """Run a progress job, its progress on stderr. A text bar redrawn in place when stdout and
    stderr are both terminals and not `quiet` (the --json commands pass quiet); otherwise plain
    lines (percent, i/N, the stage, elapsed and ETA; workbench.core.progress.LineProgress) once the
    command has run progress_every() seconds (10 s), then at least that often, repeated by a
    heartbeat while one step runs long: a log or a pipe sees long work moving, and a quick
    command prints nothing more. stdout carries only the result."""
    if quiet or not (_isatty(sys.stderr) and _isatty(sys.stdout)):
        lines = progress_lines(label)
        try:
            return run(job, lines)
        finally:
            close_lines(lines)
    bar = TextProgress(enabled=True)
    try:
        return run(job, bar)
    finally:
        bar.close()


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def add_scheme_or_plan(p):
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--scheme", help="one scheme for every weight matrix (see `schemes`)")
    g.add_argument("--plan", help="a plan JSON file (see `export --format plan`)")
    add_rule_arg(p)
    p.add_argument("--quantize-all", action="store_true",
                   help="--scheme: quantize the embeddings and output head too, instead of "
                        "following the target runtime's convention for them (llama.cpp: "
                        "output / tied token embeddings at Q6_K or Q8_0; docs/command-line.md)")
    return g


def add_rule_arg(p) -> None:
    p.add_argument("--rule", action="append", default=[], metavar="MATCH=SCHEME",
                   help="a plan rule ahead of the plan's own (repeatable): an exact tensor "
                        "name, re:PATTERN or a moe: selector (moe:experts, "
                        "moe:experts.down@5, moe:router; docs/moe.md), '=' and a scheme")


def parse_rules(texts) -> list:
    """--rule MATCH=SCHEME values as plan Rules (the last '=' splits: patterns may hold '=')."""
    from workbench.core.errors import WorkbenchError
    from workbench.quant.plan import Rule
    out = []
    for t in texts or []:
        match, sep, scheme = t.rpartition("=")
        if not sep or not match.strip() or not scheme.strip():
            raise WorkbenchError(f"--rule {t!r}: expected MATCH=SCHEME (e.g. "
                                 "moe:experts.down@5=q6_k)")
        out.append(Rule(match.strip(), scheme.strip()))
    return out


def plan_from_args(args):
    """The plan of --scheme / --plan with the --rule rules ahead (workbench.api.make_plan)."""
    from workbench.api import make_plan
    plan_file = getattr(args, "plan", None)
    plan = make_plan(None if plan_file else args.scheme, path=plan_file or None)
    rules = parse_rules(getattr(args, "rule", None))   # (after the plan file's own errors)
    return make_plan(plan=plan, rules=rules) if rules else plan


def apply_convention(args, model, plan, runtime: str, quiet: bool = False):
    """(plan, Convention or None): a uniform --scheme plan follows the target runtime's own
    convention for the embeddings and the output head (workbench.planning.conventions) unless
    --quantize-all (print_convention says so once the command succeeds)."""
    if not getattr(args, "scheme", None) or getattr(args, "plan", None) \
            or getattr(args, "quantize_all", False):
        return plan, None
    from workbench.planning.conventions import apply
    return apply(plan, model, args.scheme, runtime)


def print_convention(conv, quiet: bool = False) -> None:
    """The convention's one line on stderr, once the command has succeeded (an error stays one
    line), where it changed a tensor (vLLM / ONNX Runtime: their rules keep them anyway)."""
    if conv is not None and conv.rules and not quiet:
        print(f"convention: {conv.line()}", file=sys.stderr)


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n}"


def add_runtime_args(p, default: str | None = "any") -> None:
    from workbench.quant.runtimes import RUNTIMES
    if default is not None:
        p.add_argument("--target", default=default, choices=list(RUNTIMES),
                       help="the runtime whose rules apply: which tensors it re-types and its "
                            f"fallbacks for shapes a scheme cannot take (default: {default})")
    p.add_argument("--strict", action="store_true",
                   help="make every fallback or skipped rule an error instead of a note")


def print_fallback_summary(summary, stream=None) -> None:
    """The one-line fallback summary, on stderr (stdout stays clean for --json)."""
    print(f"fallbacks: {summary.line()}", file=stream or sys.stderr)


def add_method_args(p, calib: bool = True) -> None:
    """--method / --calib / --imatrix (workbench.quant.methods)."""
    p.add_argument("--method", default=None, choices=["rtn", "imatrix", "gptq", "awq"],
                   help="quantization method for tensors whose plan rule names none "
                        "(default: the plan's, else rtn)")
    if calib:
        p.add_argument("--calib", default=None,
                       help="calibration inputs for the method (text / JSONL / token ids; default "
                            "when a method needs them: resources/calibration.txt, runnable models)")
    p.add_argument("--imatrix", default=None,
                   help="a llama.cpp imatrix file: E[x^2] per input channel (method imatrix)")
    add_device_arg(p)


def apply_methods(args, model, plan, runtime: str = "any", quiet: bool = False):
    """(plan with --method applied, the model to quantize: a MethodModel when any tensor uses a
    method other than rtn; workbench.api.with_methods). Notes go to stderr."""
    from workbench.api import with_methods
    return with_methods(model, plan, method=getattr(args, "method", None),
                        calib=getattr(args, "calib", None), imatrix=getattr(args, "imatrix", None),
                        target=runtime, driver=lambda job: drive(job, quiet=quiet),
                        say=lambda line: print(line, file=sys.stderr))

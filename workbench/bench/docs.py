"""Regenerate docs/benchmarks.md from the project's own bench commands:

    python -m workbench.bench.docs [--quick] [--only NAME,..] [-o docs/benchmarks.md]
    quant-workbench bench-docs [--quick] ...              (the same)
    quant-workbench bench-docs --readme                   (README.md's tour: bench/tour.py)

Each section runs one bench command in a fresh process (`python main.py ...`, so the page
shows exactly what a user's command prints) and records the command, the UTC date, the
machine (CPU, cores, GPU or not) and the load average before and after, beside the output.
Every figure on the page comes from that run; nothing is typed in by hand. `--quick` runs
smaller sizes and fewer repeats (said on the page); a section whose tools are missing (the
llama.cpp build, Qt) says why instead of a figure. The page is written atomically.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "docs" / "benchmarks.md"


@dataclass(frozen=True)
class Section:
    name: str
    title: str
    what: str                     # what it measures and its targets (no figures)
    args: tuple[str, ...]         # full run
    quick: tuple[str, ...]        # --quick run
    needs: str = ""               # "llama" | "qt" | "cluster" | ""


SECTIONS = (
    Section("kernels", "Kernels: dequantize and quantize throughput (`bench`)",
            "Per scheme on the CPU (and CUDA on a GPU): dequantize GB/s (float32 written) and "
            "quantize GB/s (float32 read), each beside baselines measured in the same run: "
            "`np.copyto` of the float32 matrix, the scheme's numpy reference, the `gguf` "
            "package's numpy code for GGML types; \"eval GB/s\" is the evaluation of a tensor "
            "(bytes and error sums) the app runs after an edit, and \"x 2-pass\" its ratio to "
            "quantize then measure. Targets (CPU): dequantize >= 0.7x the copy, GGML dequantize "
            ">= 10x gguf, Q4_0/Q8_0 quantize >= 10x gguf, integer/NF4/FP8 quantize >= 10x the "
            "numpy reference; rows below a target say so.",
            ("bench", "--scheme", "all"),
            ("bench", "--scheme", "int8-channel", "int4-g128", "nf4-g64", "fp8-e4m3", "q4_0",
             "q8_0", "q4_k", "q6_k", "--size", "1024x4096", "--repeats", "3")),
    Section("vs-ggml", "GGML quantizers against ggml's own C code (`bench --vs-ggml`)",
            "The workbench's GGML quantizers and ggml's C quantizers (from the llama.cpp build, "
            "called through ctypes) on the real MiniLM's tensors, one thread each: relative RMSE "
            "(the same or better is the target), quantize MB/s and dequantize GB/s, ratios from "
            "the same run.",
            ("bench", "--vs-ggml", "--threads", "1"),
            ("bench", "--vs-ggml", "--threads", "1", "--types", "q4_0,q8_0,q4_k,q6_k"),
            needs="llama"),
    Section("load", "Opening and statistics (`bench-load`)",
            "Generates a TinyLlama-shaped bf16 checkpoint in shards with an index, then in a "
            "fresh process: the time to open it, the time for every tensor's statistics, a plain "
            "numpy pass over the same memory-mapped tensors (baseline, same run) and the peak "
            "resident memory. Targets: open < 0.5 s, statistics >= 0.5x the numpy pass, peak "
            "memory < 1.5 GB.",
            ("bench-load", "--params", "1e9"),
            ("bench-load", "--params", "2e8", "--repeats", "1")),
    Section("allocate", "The budget allocator (`bench-allocate`)",
            "Synthetic sensitivity tables (tensors x schemes, several seeds): the solve time of "
            "`allocate`'s multiple-choice knapsack, how many solves are proven optimal and, for "
            "the others, the gap to the Lagrangian bound.",
            ("bench-allocate",),
            ("bench-allocate", "--repeat", "3")),
    Section("mlx", "mlx-lm's recipes against `allocate --target mlx` (`bench-mlx`)",
            "SmolLM2-135M (its GGUF through `convert --to hf --off-grid 0`): mlx-lm's own "
            "folders (`mlx_lm convert -q`: uniform 4-bit g64, `mixed_3_6`, `mixed_4_6`) and, at "
            "each one's bytes, the default `allocate --target mlx --budget-of A` + `export "
            "--format mlx`, every folder judged on held-out text the calibration never saw "
            "(GPL-3; chunks of 512, the second half of each scored): in torch on its tensors "
            "dequantized as mx.dequantize does, and in mlx-lm's own forward on the first chunk "
            "(of --mlx-ctx tokens: mlx's CPU quantized matmuls take minutes a chunk). "
            "Target: lower mean and 99.9% KLD than each mlx-lm folder at no more bytes.",
            ("bench-mlx", "--real", "smollm2", "--held-out", "/usr/share/common-licenses/GPL-3",
             "--chunks", "20", "--mlx-ctx", "128"),
            ("bench-mlx", "--real", "smollm2", "--held-out", "/usr/share/common-licenses/GPL-3",
             "--recipes", "q4-g64,mixed_3_6", "--chunks", "4", "--mlx-ctx", "64"), needs="mlx"),
    Section("cluster", "The sweep on a Dask cluster (`bench-cluster`)",
            "A generated bf16 checkpoint (llama-shaped blocks of 7 matrices), every matrix under 4 "
            "schemes: in process on one thread, then on a local Dask cluster of 1 and of 2 "
            "single-threaded workers (best of 3 passes each): tasks per second, the per-task "
            "overhead (empty tasks), the 2-worker scaling efficiency, and the DeepSeek-V3-shaped "
            "sweep projected from them (docs/cluster.md).",
            ("bench-cluster",),
            ("bench-cluster", "--layers", "4", "--repeats", "1"),
            needs="cluster"),
    Section("gui", "The window (`bench-gui`)",
            "Offscreen, software rendering: start-up, selection-to-plots and edit-to-totals times "
            "on the real MiniLM (and with `--big` a generated model with a 30000x4096 "
            "embedding), the current drawing paths against the previous ones in the same run.",
            ("bench-gui", "--big"),
            ("bench-gui", "--paths", "fast", "--repeats", "3"),
            needs="qt"),
)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        from numba import cuda
        gpu = "a CUDA GPU" if cuda.is_available() else "no GPU"
    except Exception:   # noqa: BLE001 - only a label
        gpu = "no GPU"
    return f"{cpu}, {os.cpu_count()} cores, {gpu}, Python {platform.python_version()}"


def load() -> str:
    try:
        return " / ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def missing(needs: str) -> str | None:
    """Why a section cannot run here (None: it can)."""
    if needs == "llama":
        r = subprocess.run(["bash", str(ROOT / ".ci" / "llama-cpp"), "--check"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            return "the llama.cpp tools are not built (`bash .ci/llama-cpp`)"
    if needs == "cluster":
        import importlib.util
        if importlib.util.find_spec("distributed") is None:
            return "distributed is not installed (the [cluster] extra)"
    if needs == "mlx":
        import importlib.util
        if importlib.util.find_spec("mlx_lm") is None:
            return "mlx-lm is not installed (the [mlx] extra)"
    if needs == "qt":
        import importlib.util
        if importlib.util.find_spec("PySide6") is None:
            return "PySide6 is not installed"
    return None


def run_section(s: Section, quick: bool, timeout: float) -> dict:
    args = s.quick if quick else s.args
    cmd = "quant-workbench " + " ".join(shlex.quote(a) for a in args)
    out = {"name": s.name, "title": s.title, "what": s.what, "command": cmd,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    why = missing(s.needs)
    if why:
        out["skipped"] = why
        return out
    env = dict(os.environ, QT_QPA_PLATFORM=os.environ.get("QT_QPA_PLATFORM", "offscreen"))
    before = load()
    t0 = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, str(ROOT / "main.py"), *args], capture_output=True,
                           text=True, cwd=str(ROOT), env=env, timeout=timeout)
        text, rc = r.stdout, r.returncode
        err = r.stderr.strip().splitlines()[-1:] if r.returncode else []
    except subprocess.TimeoutExpired:
        text, rc, err = "", None, [f"stopped after {timeout:.0f} s"]
    out.update(seconds=time.perf_counter() - t0, load=f"{before} before, {load()} after",
               output=text.rstrip(), rc=rc)
    if rc != 0:
        out["failed"] = err[0] if err else f"exit status {rc}"
    return out


def render(results: list[dict], quick: bool, regen: str) -> str:
    lines = ["# Benchmarks", "",
             "Every figure on this page was printed by the bench command shown above it, run by",
             f"`{regen}`, which rewrites the whole page. Each ratio is to a baseline measured in",
             "the same run; absolute figures depend on the machine and its load (given per",
             "section: the 1-, 5- and 15-minute load averages before and after the run).", "",
             f"Machine: {machine()}.", ""]
    if quick:
        lines += ["**Quick run** (`--quick`): smaller sizes and fewer repeats than each "
                  "command's defaults, to keep the regeneration short on a shared machine; the "
                  "commands shown are the ones that ran. A full run: the same command without "
                  "`--quick`.", ""]
    for r in results:
        lines += [f"## {r['title']}", "", r["what"], ""]
        if "skipped" in r:
            lines += [f"Not measured in this run ({r['date']}): {r['skipped']}. Command: "
                      f"`{r['command']}`.", ""]
            continue
        lines += [f"`{r['command']}` — {r['date']}, {r['seconds']:.0f} s, load {r['load']}.", ""]
        if "failed" in r:
            lines += [f"The command failed: {r['failed']}.", ""]
        if r.get("output"):
            lines += ["```", r["output"], "```", ""]
    return "\n".join(lines).rstrip() + "\n"


def add_args(p) -> None:
    p.add_argument("--quick", action="store_true",
                   help="smaller sizes and fewer repeats (said on the page)")
    p.add_argument("--only", default=None,
                   help="comma-separated sections to run (" + ", ".join(s.name for s in SECTIONS)
                        + "); the others are listed as not measured")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per section")
    p.add_argument("--readme", action="store_true",
                   help="instead: run README.md's tour, every command in an empty folder, and "
                        "rewrite its output blocks with what they printed (workbench/bench/tour.py)")
    p.add_argument("-o", "--output", default=None,
                   help="the page to write (default: docs/benchmarks.md; README.md with --readme)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbench.bench.docs",
                                description="Regenerate docs/benchmarks.md from the bench commands.")
    add_args(p)
    args = p.parse_args(argv)
    if args.readme:
        from workbench.bench.tour import regenerate
        return regenerate(args.output)
    return run(args.quick, args.only, args.timeout, args.output or DEFAULT_OUT)


def run(quick: bool = False, only_sections: str | None = None, timeout: float = 3600.0,
        output=DEFAULT_OUT) -> int:
    """Run the sections (`only_sections`: comma-separated names, default all; `quick`: the
    smaller sizes), each within `timeout` seconds, and write the page to `output`."""
    only = set(only_sections.split(",")) if only_sections else None
    if only is not None and not only <= {s.name for s in SECTIONS}:
        from workbench.core.errors import WorkbenchError
        raise WorkbenchError(f"unknown section in --only {only_sections!r} (choose from "
                             f"{', '.join(s.name for s in SECTIONS)})")
    results = []
    for s in SECTIONS:
        if only is not None and s.name not in only:
            results.append({"title": s.title, "what": s.what, "skipped": "not selected (--only)",
                            "command": "quant-workbench " + " ".join(s.quick if quick
                                                                      else s.args),
                            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())})
            continue
        print(f"bench-docs: {s.name}: running ...", file=sys.stderr, flush=True)
        r = run_section(s, quick, timeout)
        state = r.get("skipped") or r.get("failed") or f"{r['seconds']:.0f} s"
        print(f"bench-docs: {s.name}: {state}", file=sys.stderr, flush=True)
        results.append(r)
    regen = "python -m workbench.bench.docs" + (" --quick" if quick else "")
    from workbench.core.atomic import write_text_atomic
    write_text_atomic(output, render(results, quick, regen))
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

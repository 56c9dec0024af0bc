"""Compile every CPU kernel into numba's on-disk cache ahead of use: ``python -m workbench.bench.warm``.

numba compiles a kernel the first time it runs and keeps the machine code on disk beside the
source (``cache=True``); from then on a process loads it in milliseconds. The first compile of
the searched K-quant kernels takes a minute or more on a small machine, which a user would
otherwise meet as a long "pending" the first time they pick Q4_K, and the test suite as a
cold start. ``.ci/setup`` runs this once after installing, like a build step.

The schemes are split over ``--jobs`` processes (default: the CPU count), each running
``accel.warmup`` (quantize, dequantize, the fused error kernel and the one-pass
quantize-and-measure kernel per kernel family) on its share (every kernel takes its inputs
read-only, so one specialisation serves a file's maps and in-memory arrays alike), plus the importance-weighted GGML encoders, the one-pass
F16 → Q4_0/Q8_0 path and the statistics kernels.
numba writes each cache file atomically, so processes compiling shared helpers do not clash.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

#: CPU seconds of a whole warm-up on the project's 2-core machine (27 Nov 2026: 352 s; 777 s
#: while each kernel was compiled for writable and read-only weights): the header's estimate
WARM_CPU_S = 350
# compiled first in every process: a few seconds each, so the first "ready" line comes at once
QUICK = ("fp16", "bf16")
# compiled next and in different processes: each takes most of a minute on its own
HEAVY = ("q4_k", "q3_k", "iq4_nl", "q5_0", "q4_0", "int4-g128")


def _order(names: list[str]) -> list[str]:
    """The quick float casts, then the heavy kernels, then the rest, the lattice i-quants last
    (shares are taken every n-th name, so each process starts with a quick one and then a
    heavy one)."""
    from workbench.quant.runtimes import LOW_BIT_ONLY      # the lattice i-quants: last
    first = [n for n in QUICK + HEAVY if n in names]
    rest = [n for n in names if n not in first]
    return (first + [n for n in rest if n not in LOW_BIT_ONLY]
            + [n for n in rest if n in LOW_BIT_ONLY])


def warm_names(names: list[str]) -> list[str]:
    """Run every kernel `names` need once on tiny inputs (in this process); the names done."""
    import numpy as np
    from workbench.quant import accel
    from workbench.quant.methods.ggml_weighted import SUPPORTED, weighted_encode
    from workbench.schemes import get_scheme
    done = accel.warmup(names, backend="cpu")
    rng = np.random.default_rng(0)
    for n in names:
        s = get_scheme(n)
        if n in SUPPORTED:
            x = rng.standard_normal((2, s.block_size)).astype(np.float32)
            weighted_encode(s, x, np.abs(x) + np.float32(0.5))
        if n in ("q4_0", "q8_0"):
            raw = rng.standard_normal((2, 256)).astype(np.float16)
            accel.quantize_widening(s, raw, "F16")
            accel.quantize_widening(s, raw.view(np.uint16), "BF16")
    return done


def warm_convert() -> None:
    """The F16/BF16 → float32 widening kernels."""
    import numpy as np
    from kernels import convert
    raw = np.arange(512, dtype=np.uint16).view(np.float16).reshape(2, 256)
    convert.f16_to_f32(raw)
    convert.bf16_to_f32(raw.view(np.uint16))


def warm_methods() -> None:
    """The importance-weighted scale search of the integer schemes (imatrix on int4/int8:
    kernels/weighted_search.py), with and without the least-squares sums."""
    import numpy as np
    from kernels.weighted_search import candidate_errors
    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
    s = np.full((2, 3), 0.1, np.float32)
    for lsq in (False, True):
        candidate_errors(x, np.ones_like(x), s, np.zeros_like(s), -8, 7, lsq)


def warm_stats() -> None:
    """Compile the statistics kernels (histograms, per-channel ranges) on a tiny F32/F16
    safetensors file, read the way a model is opened (memory-mapped, read-only)."""
    import tempfile
    import numpy as np
    from workbench.export.st_writer import StreamingSafetensorsWriter
    from workbench.formats.loaders import open_model
    from workbench.core.progress import run
    from workbench.quant.stats import model_stats
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "warm.safetensors")
        w = StreamingSafetensorsWriter(path)
        w.add("a.weight", rng.standard_normal((8, 64)).astype(np.float32))
        w.add("b.weight", rng.standard_normal((8, 64)).astype(np.float16))
        w.finish()
        model = open_model(path)
        try:
            run(model_stats(model, cache=None))
        finally:
            close = getattr(model, "close", None)
            if close is not None:
                close()


def _say(line: str) -> None:
    print(line, flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbench.bench.warm", description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="processes compiling in parallel (default: the CPU count)")
    p.add_argument("--only", default=None, help=argparse.SUPPRESS)  # one worker's share
    p.add_argument("--stats", action="store_true", help=argparse.SUPPRESS)  # and the stats kernels
    p.add_argument("--tag", default=None, help=argparse.SUPPRESS)  # "process i/n" in progress lines
    args = p.parse_args(argv)
    from workbench.schemes import list_schemes
    if args.only is not None:
        share = [n for n in args.only.split(",") if n]
        t0 = time.perf_counter()
        for n in share:               # one line per scheme: a long set-up step shows progress
            warm_names([n])
            _say(f"  kernels: {n} ready ({args.tag or 'worker'}, {time.perf_counter() - t0:.0f} s)")
        if args.stats:
            warm_stats()
            warm_convert()
            warm_methods()
            _say(f"  kernels: statistics, F16/BF16 widening and the weighted scale search "
                 f"ready ({args.tag or 'worker'}, {time.perf_counter() - t0:.0f} s)")
        return 0
    t0 = time.perf_counter()
    names = _order(list(list_schemes()))
    jobs = max(1, min(args.jobs, len(names)))
    shares = [names[i::jobs] for i in range(jobs)]
    minutes = max(1, round(WARM_CPU_S / min(jobs, os.cpu_count() or 1) / 60))
    _say(f"compiling the numba kernels of {len(names)} schemes in {jobs} processes (once; "
         f"loaded from the on-disk cache afterwards): about {minutes} min on an idle machine "
         "of this size, longer on a busy one; one line per scheme:")
    procs = [subprocess.Popen([sys.executable, "-m", "workbench.bench.warm", "--only", ",".join(s),
                               "--tag", f"process {i + 1}/{jobs}"]
                              + (["--stats"] if i == len(shares) - 1 else []))
             for i, s in enumerate(shares) if s]
    rcs = [pr.wait() for pr in procs]
    took = time.perf_counter() - t0
    if any(rcs):
        print(f"kernel warm-up failed in {sum(1 for r in rcs if r)} of {len(rcs)} processes "
              f"({took:.0f} s)", file=sys.stderr)
        return 1
    print(f"kernels compiled or loaded for {len(names)} schemes in {took:.0f} s "
          f"({len(procs)} processes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

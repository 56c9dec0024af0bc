"""Compile every CPU kernel into numba's on-disk cache ahead of use: ``python -m workbench.bench.warm``.

numba compiles a kernel the first time it runs and keeps the machine code on disk beside the
source (``cache=True``); from then on a process loads it in milliseconds. The first compile of
the searched K-quant kernels takes a minute or more on a small machine, which a user would
otherwise meet as a long "pending" the first time they pick Q4_K, and the test suite as a
cold start. ``.ci/setup`` runs this once after installing, like a build step.

It runs in two stages: first the schemes the demo model and MiniLM use (``first_stage``: the
default plan's, the sensitivity table's and ``allocate``'s default candidates, with the
statistics kernels), then the rest; one line says when the first stage is ready. Each stage is
dealt over ``--jobs`` processes (default: the CPU count) by kernel family, the costliest first
to the least loaded process (``FAMILY_CPU_S``), each process starting with a quick float cast
so that a "ready" line comes within seconds. Each runs ``accel.warmup`` (quantize, dequantize,
the fused error kernel and the one-pass quantize-and-measure kernel per kernel family) on its
share (every kernel takes its inputs read-only, so one specialisation serves a file's maps and
in-memory arrays alike), plus the importance-weighted GGML encoders and the one-pass
F16 → Q4_0/Q8_0 path.
numba writes each cache file atomically, so processes compiling shared helpers do not clash.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
import time

#: CPU seconds of a whole warm-up on the project's 2-core machine (28 Nov 2026: 275 s; 299 s the
#: day before, 357 s
#: before the K-quant searches' helpers were compiled once instead of at every call site, 777 s
#: while each kernel was compiled for writable and read-only weights): the header's estimate
WARM_CPU_S = 275
#: CPU seconds of the first stage (first_stage()) on that machine, both processes together
#: (28 Nov 2026: 233 s; 27 Nov: 263 s): the header's estimate
FIRST_CPU_S = 235
STATS = "@stats"        # a share's token for the statistics / widening / weighted-search kernels
#: kernel families (schemes that share their kernels: a family's name is its first scheme) and
#: the CPU seconds each took in the two processes of a cold warm-up (2-core machine, idle,
#: 28 Nov 2026; docs/kernels.md): how the schemes are dealt to the processes. A family first in
#: its process also pays for the helpers the later ones share (Q3_K first: 56 s; after Q4_K in
#: one process: 27 s) and the GGML decoders (one kernel for every type, about 9 s) are paid by
#: the process that reaches a GGML dequantize first. Q2_K's encoder is a kernel of its own.
FAMILY_CPU_S = {"q3_k": 56.0, "q4_k": 46.0, "int8-channel": 30.0, "q2_k": 22.0,
                "iq2_xxs": 17.0, "q4_0": 12.0, "iq4_nl": 11.0, "iq1_s": 12.0, "iq3_xxs": 10.0,
                "iq4_xs": 8.0, "q4_1": 7.0, "mxfp4": 6.0, "fp16": 3.0, "fp32": 2.0,
                STATS: 13.0}
_FAMILY_OF = {"q5_k": "q4_k", "q6_k": "q3_k", "q8_0": "q4_0", "q5_0": "q4_1",
              "q5_1": "q4_1", "nvfp4": "mxfp4", "tq1_0": "mxfp4", "tq2_0": "mxfp4",
              "iq3_s": "iq3_xxs", "iq2_xs": "iq2_xxs", "iq2_s": "iq2_xxs", "iq1_m": "iq1_s",
              "bf16": "fp16"}


def _family(name: str) -> str:
    """The family whose kernels `name` uses (every scheme with a dash in its name is one of the
    packed-code family's: int, fp8, nf4, ternary, the fp4/fp8 block schemes)."""
    return "int8-channel" if "-" in name else _FAMILY_OF.get(name, name)


# compiled first in every process: a few seconds each, so the first "ready" line comes at once
QUICK = ("fp16", "bf16")
# compiled next and in different processes: each takes most of a minute on its own
HEAVY = ("q4_k", "q3_k", "iq4_nl", "q5_0", "q4_0", "int4-g128")


def _order(names: list[str]) -> list[str]:
    """The quick float casts, then the heavy kernels, then the rest, the lattice i-quants last
    (the order of one process's share)."""
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




def first_stage() -> list[str]:
    """The schemes the demo model and MiniLM use first, compiled before the rest: the default
    plan's scheme (``Plan().default``, int8-channel: what the app and ``evaluate`` apply to
    every weight matrix of both), the sensitivity table's and the app's effect schemes
    (``api.DEFAULT_SCHEMES``, the K-quants and Q4_0/Q5_0/Q8_0) and ``allocate``'s default
    candidates (``runtimes.candidate_schemes("any")``) less the lattice i-quants, which those
    candidates leave out at the README's budgets (4.5 and 5 bits/weight: runtimes.LOW_BIT_ONLY)."""
    from workbench.api import DEFAULT_SCHEMES
    from workbench.quant.plan import Plan
    from workbench.quant.runtimes import LOW_BIT_ONLY, candidate_schemes
    from workbench.schemes import get_scheme
    want = [Plan().default] + DEFAULT_SCHEMES.split(",") + [
        s for s in candidate_schemes("any") if s not in LOW_BIT_ONLY]
    return list(dict.fromkeys(get_scheme(s).name for s in want))


def _shares(stages: list[list[str]], jobs: int) -> list[list[list[str]]]:
    """Each stage's names dealt over `jobs` processes: a quick float cast first in each, then
    whole kernel families, the costliest first, each to the process with the least work so far
    (a family compiled in an earlier stage is in the cache by then: it costs nothing), each
    process's names put in _order's order. shares[i][k]: process i's names of stage k."""
    load = [0.0] * jobs
    out = [[[] for _ in stages] for _ in range(jobs)]
    seen: set = set()
    for k, names in enumerate(stages):
        quick = [n for n in QUICK if n in names]
        for j, n in enumerate(quick):
            out[j % jobs][k].append(n)
            load[j % jobs] += FAMILY_CPU_S["fp16"] if _family(n) not in seen else 0.0
        fams: dict = {}
        for n in names:
            if n not in quick:
                fams.setdefault(_family(n), []).append(n)
        for fam, members in sorted(fams.items(),
                                   key=lambda kv: -FAMILY_CPU_S.get(kv[0], 1.0)):
            i = min(range(jobs), key=lambda i: (load[i], i))
            out[i][k].extend(members)
            load[i] += 0.0 if fam in seen else FAMILY_CPU_S.get(fam, 1.0)
        seen.update(_family(n) for n in names)
        for i in range(jobs):
            stats = STATS in out[i][k]
            got = _order([n for n in out[i][k] if n != STATS])
            out[i][k] = got[:1] + [STATS] + got[1:] if stats else got
    return out


def _warm_share(share: list[str], tag: str) -> None:
    t0 = time.perf_counter()

    def took() -> str:
        return f"{tag}, {time.perf_counter() - t0:.0f} s, {time.process_time():.0f} CPU s"
    for n in share:               # one line per scheme: a long set-up step shows progress
        if n == STATS:
            warm_stats()
            warm_convert()
            warm_methods()
            _say(f"  kernels: statistics, F16/BF16 widening and the weighted scale search "
                 f"ready ({took()})")
            continue
        warm_names([n])
        _say(f"  kernels: {n} ready ({took()})")


def _relay(i: int, proc, ready: set, cpu: list, lock, on_line) -> None:
    """Print worker i's lines as they come; note the schemes it reports ready and the CPU
    seconds it has used."""
    for line in proc.stdout:
        line = line.rstrip("\n")
        m = _READY.match(line)
        with lock:
            if m:
                ready.add(STATS if m.group(1) == "statistics," else m.group(1))
                cpu[i] = float(m.group(2))
            _say(line)
            on_line()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbench.bench.warm", description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="processes compiling in parallel (default: the CPU count)")
    p.add_argument("--only", default=None, help=argparse.SUPPRESS)  # one worker's share
    p.add_argument("--tag", default=None, help=argparse.SUPPRESS)  # "process i/n" in progress lines
    args = p.parse_args(argv)
    from workbench.schemes import list_schemes
    if args.only is not None:
        _warm_share([n for n in args.only.split(",") if n], args.tag or "worker")
        return 0
    t0 = time.perf_counter()
    names = list(list_schemes())
    first = [n for n in first_stage() if n in names] + [STATS]
    rest = [n for n in names if n not in first]
    jobs = max(1, min(args.jobs, len(names)))
    shares = _shares([first, rest], jobs)
    cores = min(jobs, os.cpu_count() or 1)
    _say(f"compiling the numba kernels of {len(names)} schemes in {jobs} processes (once; "
         f"loaded from the on-disk cache afterwards), the {len(first) - 1} schemes the demo "
         f"model and MiniLM use first: about {max(1, round(FIRST_CPU_S / cores))} s for those "
         f"and {max(1, round(WARM_CPU_S / cores / 60))} min for all on an idle machine of this "
         "size, longer on a busy one; one line per scheme:")
    ready: set = set()
    cpu = [0.0] * jobs
    lock = threading.Lock()
    said = []

    def on_line():
        if not said and all(n in ready for n in first):
            said.append(time.perf_counter() - t0)
            _say(f"kernels: ready for the demo and MiniLM ({len(first) - 1} schemes) in "
                 f"{said[0]:.0f} s ({sum(cpu):.0f} CPU s in the workers); compiling the other "
                 f"{len(rest)}")
    procs = [subprocess.Popen([sys.executable, "-m", "workbench.bench.warm",
                               "--only", ",".join(s[0] + s[1]), "--tag", f"process {i + 1}/{jobs}"],
                              stdout=subprocess.PIPE, text=True, bufsize=1)
             for i, s in enumerate(shares) if s[0] or s[1]]
    threads = [threading.Thread(target=_relay, args=(i, pr, ready, cpu, lock, on_line),
                                daemon=True) for i, pr in enumerate(procs)]
    for t in threads:
        t.start()
    rcs = [pr.wait() for pr in procs]
    for t in threads:
        t.join()
    took = time.perf_counter() - t0
    if any(rcs):
        print(f"kernel warm-up failed in {sum(1 for r in rcs if r)} of {len(rcs)} processes "
              f"({took:.0f} s)", file=sys.stderr)
        return 1
    print(f"kernels compiled or loaded for {len(names)} schemes in {took:.0f} s "
          f"({len(procs)} processes)")
    return 0


_READY = re.compile(r"  kernels: (\S+) (?:ready|F16).*, (\d+) CPU s\)$")


if __name__ == "__main__":
    sys.exit(main())

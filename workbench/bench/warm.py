"""Compile every CPU kernel into numba's on-disk cache ahead of use: ``python -m workbench.bench.warm``.

numba compiles a kernel the first time it runs and keeps the machine code on disk beside the
source (``cache=True``); from then on a process loads it in milliseconds. The first compile of
the searched K-quant kernels takes most of a minute on a small machine, which a user would
otherwise meet as a long "pending" the first time they pick Q4_K, and the test suite as a
cold start. ``.ci/setup`` runs this once after installing, like a build step.

It runs in two stages: first the schemes the demo model and MiniLM use (``first_stage``: the
default plan's, the sensitivity table's and ``allocate``'s default candidates, with the
statistics kernels), then the rest; one line says when the first stage is ready. The work is
cut into tasks (``_tasks``) that each compile different kernels, handed one at a time to
``--jobs`` worker processes (default: the CPU count) as they come free (``_pick``), so that no
kernel is compiled twice; one line per scheme as its last task is done. Every other worker
compiles at LLVM -O2 (``NUMBA_OPT=2``) and takes only the GGML encoders of ``O2_FAMILIES``:
their compile costs a third less there and they run as fast (docs/kernels.md); the decoders and
the packed-code kernels, slower at -O2, compile at numba's default -O3. numba's cache is keyed
by the function and the CPU, not the level, so later processes load either alike. Every kernel
takes its inputs read-only, so one specialisation serves a file's maps and in-memory arrays.
numba writes each cache file atomically.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time

#: CPU seconds of a whole warm-up on the project's 2-core machine, idle (28 Nov 2026, with the
#: lattice i-quants' decoders a kernel apart: 132-143 s; with the packed-code kernels' two
#: entries merged: 152-155 s; with the tasks below before that: 158-191 s; with a process per
#: share of whole families: 192-196 s, 275 s the day before on another machine), plus 55 s for
#: the MLX weighted searches in the STATS task (2 Dec 2026, compiled alone; the whole warm-up
#: took 210 CPU s without them and 282 with them that afternoon, on a slower host): the
#: header's estimate
WARM_CPU_S = 200
#: CPU seconds of the first stage (first_stage()), both processes together (28 Nov 2026,
#: afternoon: 105-113 s, the decoders split or not; 109 s with cpu_sym_rows, 101-103 s without
#: in the same hour; 121-126 s in the morning, 132-137 s before the merge in the same hour;
#: 155-196 s before the tasks; + 55 s with the MLX weighted searches, 2 Dec): the header's
#: estimate
FIRST_CPU_S = 167
STATS = "@stats"        # a task's token for the statistics / widening / weighted-search kernels
#: CPU seconds of each task on the project's 2-core machine (idle, cold cache, 28 Nov 2026;
#: ``--task-times``; "int8-channel" 25 since the row-wise search of small blocks came in,
#: cpu_sym_rows; STATS 64 since it compiles the MLX weighted searches, 2 Dec 2026): a GGML
#: family's encoders (named by the family), "decode" / "decode-iq" the GGML decoders,
#: "int8-channel" the packed-code kernels, STATS. The workers take the costliest first.
TASK_CPU_S = {"q4_k": 22.0, "decode": 12.0, "decode-iq": 4.5, "q3_k": 20.0, "int8-channel": 25.0, "q2_k": 12.0,
              STATS: 64.0, "iq4_nl": 8.0, "q4_0": 8.0, "mxfp4": 5.0, "q4_1": 4.0,
              "iq4_xs": 4.0, "iq1_s": 12.0, "iq2_xxs": 12.0, "iq3_xxs": 6.0, "fp16": 3.0,
              "fp32": 2.0}
#: the families of the lattice i-quants, whose decoders are a kernel of their own
#: (cpu_ggml.iq_rows: the "decode-iq" task), so that the first stage's decoders compile
#: without them
LATTICE = frozenset({"iq1_s", "iq2_xxs", "iq3_xxs"})
#: the GGML encoder families compiled at -O2: Q4_K/Q5_K's and Q2_K's searches and IQ4_XS's, whose
#: compile costs a third less there and which run as fast or faster (28 Nov 2026, best of four
#: interleaved runs, 512x4096, one thread: Q4_K 58.7 -> 48.1 ms, Q2_K 47.6 -> 41.6, IQ4_XS
#: 67.5 -> 54.6). Not Q3_K/Q6_K's (10-30% slower at -O2), NVFP4's (20%), Q4_0/Q8_0's (no compile
#: saved) nor the lattice i-quants' (IQ2_XXS 0.6-0.7x as fast).
O2_FAMILIES = frozenset({"q4_k", "q2_k", "iq4_xs"})
def _family(name: str) -> str:
    """The family whose kernels `name` uses (every scheme with a dash in its name is one of the
    packed-code family's: int, fp8, nf4, ternary, the fp4/fp8 block schemes)."""
    from workbench.schemes.registry import kernel_family
    return "int8-channel" if "-" in name else kernel_family(name)


def _is_ggml(name: str) -> bool:
    """True for a GGML block type (its encoders and decoders are kernels apart)."""
    from workbench.quant.accel import spec_for
    from workbench.schemes import get_scheme
    spec = spec_for(get_scheme(name))
    return spec is not None and spec.family == "ggml"


# a task each, first in the processes: a few seconds, so that a "ready" line comes at once
QUICK = ("fp16", "bf16")


def encode_names(names: list[str]) -> None:
    """Run the encoders `names` need once on tiny inputs, and nothing that decodes: the plain
    and the importance-weighted GGML encoders and the one-pass F16 → Q4_0/Q8_0 path (a
    worker compiling them at -O2 must not compile the decoders too: ``_tasks``)."""
    import numpy as np
    from workbench.quant import accel
    from workbench.quant.methods.ggml_weighted import SUPPORTED, weighted_encode
    from workbench.schemes import get_scheme
    rng = np.random.default_rng(0)
    for n in names:
        s = get_scheme(n)
        w = rng.standard_normal((2, max(256, 2 * int(s.block_size or 1)))).astype(np.float32)
        accel.quantize(s, w, backend="cpu")
        if n in SUPPORTED:
            x = rng.standard_normal((2, s.block_size)).astype(np.float32)
            weighted_encode(s, x, np.abs(x) + np.float32(0.5))
        # the one-pass F16/BF16 path where the type has one (None, at once, where not)
        raw = rng.standard_normal((2, 256)).astype(np.float16)
        accel.quantize_widening(s, raw, "F16")
        accel.quantize_widening(s, raw.view(np.uint16), "BF16")


def warm_decoders(lattice: bool = False) -> None:
    """The GGML decoders: one kernel decodes (and measures) every common GGML type
    (kernels.cpu_ggml.ggml_rows), compiled here on a Q8_0 tensor made by the numpy reference,
    so that no encoder compiles with it; with `lattice`, the lattice i-quants' kernel
    (cpu_ggml.iq_rows) on an IQ2_XXS tensor."""
    import numpy as np
    from workbench.quant import accel
    from workbench.schemes import get_scheme
    w = np.random.default_rng(0).standard_normal((2, 256)).astype(np.float32)
    qt = accel.quantize(get_scheme("iq2_xxs" if lattice else "q8_0"), w, backend="numpy")
    accel.dequantize(qt, backend="cpu")
    accel.dequant_error(w, qt, backend="cpu")


def warm_names(names: list[str]) -> list[str]:
    """Run every kernel `names` need once on tiny inputs (in this process); the names done."""
    from workbench.quant import accel
    done = accel.warmup(names, backend="cpu")
    encode_names([n for n in names if _is_ggml(n)])
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
    kernels/weighted_search.py), with and without the least-squares sums, and the MLX
    schemes' (imatrix on mlx-*: kernels/mlx_weighted.py)."""
    import numpy as np
    from kernels.weighted_search import candidate_errors
    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
    s = np.full((2, 3), 0.1, np.float32)
    for lsq in (False, True):
        candidate_errors(x, np.ones_like(x), s, np.zeros_like(s), -8, 7, lsq)
    # the MLX importance-weighted searches (kernels/mlx_weighted.py: one specialisation each,
    # the bits, group, dtypes and early end are arguments): about 45 CPU s of compile
    from workbench.quant.methods.mlx_weighted import weighted_quantize
    from workbench.schemes import get_scheme
    w = np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64)
    for name in ("mlx-q4-g64", "mlx-mxfp4"):
        weighted_quantize(get_scheme(name), w, np.ones(64, np.float32), "imatrix")


def warm_stats() -> None:
    """Compile the statistics kernels (histograms, per-channel ranges) on a tiny safetensors
    file of every storage they read apart (F32; F16, whose 16-bit path BF16 shares; I8 and
    U8, which an integer checkpoint's tensors had compiled on first open), read the way a
    model is opened (memory-mapped, read-only)."""
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
        w.add("c.weight", rng.integers(-128, 128, (8, 64)).astype(np.int8))
        w.add("d.weight", rng.integers(0, 256, (8, 64)).astype(np.uint8))
        w.finish()
        model = open_model(path)
        try:
            run(model_stats(model, cache=None))
        finally:
            close = getattr(model, "close", None)
            if close is not None:
                close()
    # the fisher measure's weighted errors (planning.fisher: every default allocation)
    from kernels.stats_kernels import cast_sq_err, weighted_sq_err
    a, f = rng.standard_normal((2, 8, 64)).astype(np.float32)
    weighted_sq_err(f, a, a)
    cast_sq_err(f, a, "bf16")


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


def _tasks(stages: list[list[str]]) -> list[dict]:
    """Each stage's names as tasks, every kernel compiled by exactly one of them: a quick float
    cast each (one per process first: a "ready" line within seconds); the statistics kernels
    (STATS); the GGML decoders once (``decode``: one kernel for every common type;
    ``decode-iq``: one for the lattice i-quants, in the stage of the first); each GGML family's
    encoders (``encode``), then each GGML scheme's whole warm-up once its encoders and the
    decoders are in the cache (``finish``: loads them, compiles nothing); each other family's
    kernels (``names``). A task waits for the previous task of its family (a later stage's
    schemes reuse its kernels) and Q2_K's encoder for Q4_K's (they share the searches'
    helpers), so that no two processes compile the same kernel at once. A task is a dict:
    id, kind, names, cost (CPU s: TASK_CPU_S), o2 (may compile at -O2: O2_FAMILIES), deps
    (ids), stage."""
    tasks: list[dict] = []
    last: dict = {}                      # family -> its latest task

    def add(kind, names, cost, stage, o2=False, deps=()):
        tasks.append(dict(id=len(tasks), kind=kind, names=list(names), cost=float(cost),
                          o2=o2, deps={d for d in deps if d is not None}, stage=stage))
        return len(tasks) - 1
    decoders: dict = {}                  # "decode" / "decode-iq" -> its task
    for k, names in enumerate(stages):
        fams: dict = {}
        for n in names:
            if n in QUICK:
                last["fp16"] = add("quick", [n], TASK_CPU_S["fp16"], k, o2=True,
                                   deps=[last.get("fp16")])
            else:
                fams.setdefault(STATS if n == STATS else _family(n), []).append(n)
        for fam, members in fams.items():
            if fam == STATS:
                last[fam] = add("stats", [STATS], TASK_CPU_S[STATS], k, deps=[last.get(fam)])
            elif _is_ggml(members[0]):
                kind = "decode-iq" if fam in LATTICE else "decode"
                if kind not in decoders:
                    decoders[kind] = add(kind, [], TASK_CPU_S[kind], k)
                dec = decoders[kind]
                deps = [last.get(fam), last.get("q4_k") if fam == "q2_k" else None]
                e = last[fam] = add("encode", members, TASK_CPU_S.get(fam, 5.0), k,
                                    o2=fam in O2_FAMILIES, deps=deps)
                for n in members:
                    add("finish", [n], 0.2, k, deps=[e, dec])
            else:
                cost = TASK_CPU_S.get(fam, 1.0) if fam not in last else 1.0   # loads
                last[fam] = add("names", members, cost, k, deps=[last.get(fam)])
    return tasks


def _pick(tasks: list[dict], started: set, done: set, o2: bool):
    """The task an idle process takes: one whose dependencies are done and that may compile at
    its level (an -O2 process takes only O2_FAMILIES' encoders and the float casts); the earlier
    stage first, then a quick cast, a finish (cheap: it completes a scheme), the decoders
    (every GGML scheme waits for them), in an -O3 process what only it may take, then the
    costliest."""
    ready = [t for t in tasks if t["id"] not in started and t["deps"] <= done
             and (t["o2"] or not o2)]
    order = {"quick": 0, "finish": 1, "decode": 2, "decode-iq": 2}
    return min(ready, default=None, key=lambda t: (
        t["stage"], order.get(t["kind"], 3), (not o2) and t["o2"], -t["cost"], t["id"]))


def _run_task(kind: str, names: list[str]) -> None:
    if kind == "stats":
        warm_stats()
        warm_convert()
        warm_methods()
    elif kind in ("decode", "decode-iq"):
        warm_decoders(lattice=kind == "decode-iq")
    elif kind == "encode":
        encode_names(names)
    else:                                       # quick, finish, names
        warm_names(names)


def _serve() -> None:
    """A worker: run each task read from stdin (one JSON object a line) and answer
    "done <id> <the task's CPU seconds> <the process's CPU seconds>" on stdout."""
    for line in sys.stdin:
        task = json.loads(line)
        c0 = time.process_time()
        _run_task(task["kind"], task["names"])
        c1 = time.process_time()
        print(f"done {task['id']} {c1 - c0:.2f} {c1:.2f}", flush=True)


class _Worker:
    """A worker process (``--serve``) in slot i, at LLVM level -O2 (o2) or numba's default; its
    stdout lines go to `events` as (itself, line), then (itself, None) when it ends."""

    def __init__(self, i: int, o2: bool, events) -> None:
        env = dict(os.environ)
        if o2:
            env["NUMBA_OPT"] = "2"
        self.o2 = o2
        self.cpu = 0.0                      # its CPU seconds so far (its last "done" line)
        self.proc = subprocess.Popen([sys.executable, "-m", "workbench.bench.warm", "--serve"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     bufsize=1, env=env)
        out = self.proc.stdout

        def relay():
            for line in out:
                events.put((self, line.rstrip("\n")))
            events.put((self, None))
        threading.Thread(target=relay, daemon=True).start()

    def send(self, task: dict) -> None:
        self.proc.stdin.write(json.dumps({"id": task["id"], "kind": task["kind"],
                                          "names": task["names"]}) + "\n")
        self.proc.stdin.flush()

    def close(self) -> int:
        self.proc.stdin.close()
        return self.proc.wait()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _warm_share(share: list[str], tag: str) -> None:
    """``--only``: the names in this process, one line each."""
    t0 = time.perf_counter()
    for n in share:
        warm_names([n])
        _say(_ready_line(n, tag, time.perf_counter() - t0, time.process_time()))


def _ready_line(name: str, tag: str, wall: float, cpu: float) -> str:
    what = ("statistics, F16/BF16 widening and the weighted scale search" if name == STATS
            else name)
    return f"  kernels: {what} ready ({tag}, {wall:.0f} s, {cpu:.0f} CPU s)"


def _label(t: dict) -> str:
    return f"{t['kind']} {','.join(t['names'])}".strip()


def _schedule(tasks: list[dict], jobs: int, first: list[str], rest: list[str],
              start_worker, t0: float, task_times: bool) -> int:
    """Hand the tasks to `jobs` worker slots as they come free (_pick); a slot whose worker is
    at the other LLVM level than its next task's closes it and starts one at that level
    (start_worker(i, o2, events)). One line per scheme as its last task is done, one when the
    first stage is. Returns the exit status (1: a worker failed; 130: interrupted)."""
    events: queue.Queue = queue.Queue()
    workers: list = [None] * jobs
    spent = [0.0] * jobs                # CPU seconds of each slot's closed workers
    pending = {n: sum(n in t["names"] for t in tasks) for n in first + rest}
    started: set = set()
    done: set = set()
    busy: dict = {}                     # slot -> task
    took: dict = {}                     # task id -> its CPU seconds
    said = False
    # the slots' levels: the first at numba's default, the others alternating -O2 / default,
    # changed when a slot's next task needs it
    level = [jobs > 1 and i % 2 == 1 for i in range(jobs)]
    try:
        while True:
            for i in range(jobs):
                if i in busy:
                    continue
                t = _pick(tasks, started, done, level[i])
                if t is None and level[i]:               # only default-level work is left?
                    t = _pick(tasks, started, done, False)
                    level[i] = t is None
                if t is None:
                    continue
                w = workers[i]
                if w is not None and w.o2 != level[i]:
                    w.close()
                    spent[i] += w.cpu
                    w = None
                if w is None:
                    w = workers[i] = start_worker(i, level[i], events)
                started.add(t["id"])
                busy[i] = t
                w.send(t)
            if not busy:
                break
            w, line = events.get()
            if w not in workers:
                continue                             # a worker closed on a level change
            i = workers.index(w)
            if line is None:
                t = busy.get(i)
                for w in workers:
                    if w is not None:
                        w.kill()
                at = f"{_label(t)}; " if t else ""
                print(f"kernel warm-up failed in process {i + 1}/{jobs} ({at}"
                      f"{time.perf_counter() - t0:.0f} s)", file=sys.stderr)
                return 1
            if not line.startswith("done "):
                _say(line)
                continue
            _, tid, cost, used = line.split()
            t = busy.pop(i)
            done.add(t["id"])
            took[t["id"]] = float(cost)
            workers[i].cpu = float(used)
            tag = f"process {i + 1}/{jobs}" + (", -O2" if workers[i].o2 else "")
            for n in t["names"]:
                pending[n] -= 1
                if pending[n] == 0:
                    _say(_ready_line(n, tag, time.perf_counter() - t0,
                                     spent[i] + workers[i].cpu))
            if not said and all(pending[n] == 0 for n in first):
                said = True
                cpu = sum(spent) + sum(w.cpu for w in workers if w is not None)
                _say(f"kernels: ready for the demo and MiniLM ({len(first) - 1} schemes) in "
                     f"{time.perf_counter() - t0:.0f} s ({cpu:.0f} CPU s in the workers); "
                     f"compiling the other {len(rest)}")
    except KeyboardInterrupt:
        for w in workers:
            if w is not None:
                w.kill()
        print(f"kernel warm-up stopped ({len(done)} of {len(tasks)} tasks done; what is "
              "done stays in the cache)", file=sys.stderr)
        return 130
    for i, w in enumerate(workers):
        if w is not None:
            if w.close():
                print(f"kernel warm-up failed in process {i + 1}/{jobs}", file=sys.stderr)
                return 1
            spent[i] += w.cpu
    if task_times:
        for t in sorted(tasks, key=lambda t: -took.get(t["id"], 0.0)):
            _say(f"  {took.get(t['id'], 0.0):6.1f} CPU s  stage {t['stage'] + 1}  {_label(t)}")
    print(f"kernels compiled or loaded for {len(first) + len(rest) - 1} schemes in "
          f"{time.perf_counter() - t0:.0f} s ({jobs} processes, {sum(spent):.0f} CPU s)")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbench.bench.warm", description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="processes compiling in parallel (default: the CPU count)")
    p.add_argument("--task-times", action="store_true",
                   help="at the end, each task's CPU seconds (what TASK_CPU_S holds)")
    p.add_argument("--only", default=None, help=argparse.SUPPRESS)  # these names, in-process
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # a worker
    args = p.parse_args(argv)
    from workbench.schemes import list_schemes
    if args.serve:
        _serve()
        return 0
    if args.only is not None:
        _warm_share([n for n in args.only.split(",") if n], "worker")
        return 0
    t0 = time.perf_counter()
    names = list(list_schemes())
    first = [n for n in first_stage() if n in names] + [STATS]
    rest = [n for n in names if n not in first]
    tasks = _tasks([first, rest])
    jobs = max(1, min(args.jobs, len(tasks)))
    cores = min(jobs, os.cpu_count() or 1)
    _say(f"compiling the numba kernels of {len(names)} schemes in {jobs} processes (once; "
         f"loaded from the on-disk cache afterwards), the {len(first) - 1} schemes the demo "
         f"model and MiniLM use first: about {max(1, round(FIRST_CPU_S / cores))} s for those "
         f"and {max(1, round(WARM_CPU_S / cores / 60))} min for all on an idle machine of this "
         "size, longer on a busy one; one line per scheme:")
    return _schedule(tasks, jobs, first, rest, _Worker, t0, args.task_times)


if __name__ == "__main__":
    sys.exit(main())

"""Drive the fuzz workers: generate cases, run them under limits, count outcomes."""

from __future__ import annotations

import json
import os
import random
import select
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .cases import AREAS, GENERATORS

ROOT = Path(__file__).resolve().parents[2]
CASE_SECONDS = 10.0
# a case is blocked (e.g. on a FIFO) when its worker gets no CPU time for this long: a busy
# machine slows a case down but still gives it CPU, so the verdict does not depend on the load
STALL_SECONDS = 60.0
WALL_SECONDS = 1800.0    # and a last guard
START_SECONDS = 900.0    # a worker's imports (torch, transformers) on a loaded machine
MEMORY_LIMIT = 1 << 30
CASES_PER_WORKER = 1000


@dataclass
class Tally:
    tried: int = 0
    ok: int = 0
    errors: int = 0
    failures: list = field(default_factory=list)
    seconds: float = 0.0
    skipped: int = 0          # a generator's own mistake (not a case)

    def to_dict(self):
        kinds: dict[str, int] = {}
        for f in self.failures:
            k = f.get("kind", "?")
            k = ("hang" if k == "hang" else "signal/died" if k == "worker died"
                 else "memory" if k == "memory" else "exit 3 (traceback)"
                 if k.startswith("traceback") or k == "recursion" else k)
            kinds[k] = kinds.get(k, 0) + 1
        return {"tried": self.tried, "correct_loads": self.ok, "clean_errors": self.errors,
                "failures": len(self.failures), "failure_kinds": kinds, "skipped": self.skipped,
                "seconds": round(self.seconds, 1)}


class Worker:
    def __init__(self):
        # one thread each: the hang guard counts the worker's CPU time, which idle threads
        # spinning for work on a busy machine (or beside a pytest-xdist worker) would inflate
        env = dict(os.environ, PYTHONPATH=str(ROOT), QT_QPA_PLATFORM="offscreen",
                   OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.fuzz.worker", str(MEMORY_LIMIT)],
                                     cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env=env)
        self.cases = 0
        line = self._read(START_SECONDS)
        if not line or not json.loads(line).get("ready"):
            raise RuntimeError("fuzz worker did not start")

    def _read(self, timeout: float) -> str | None:
        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not r:
            return None
        return self.proc.stdout.readline()

    def run(self, area: str, path: str) -> dict:
        try:
            self.proc.stdin.write(f"{area}\t{path}\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return {"result": "fail", "kind": "worker died", "message": ""}
        t0 = time.monotonic()
        cpu0 = self._cpu()
        # a hang is 10 s of the worker's own CPU time (wall time on a shared machine says
        # little), or a minute without any CPU time (blocked, e.g. on a FIFO)
        line = None
        cpu_seen, moved = cpu0, t0
        while line is None:
            line = self._read(1.0)
            if line is not None:
                break
            now, cpu = time.monotonic(), self._cpu()
            if cpu > cpu_seen:
                cpu_seen, moved = cpu, now
            if (cpu - cpu0 > CASE_SECONDS or now - moved > STALL_SECONDS
                    or now - t0 > WALL_SECONDS):
                self.kill()
                return {"result": "fail", "kind": "hang",
                        "message": f"> {CASE_SECONDS} s of CPU, {STALL_SECONDS} s without "
                                   f"CPU time or {WALL_SECONDS} s in all"}
        if not line:
            code = self.proc.wait()
            return {"result": "fail", "kind": "worker died", "message": f"exit {code}"}
        out = json.loads(line)
        out["seconds"] = time.monotonic() - t0
        return out

    def _cpu(self) -> float:
        try:
            import psutil
            t = psutil.Process(self.proc.pid).cpu_times()
            return t.user + t.system
        except Exception:  # noqa: BLE001 - psutil missing or the worker gone
            return 0.0

    def kill(self):
        self.proc.kill()
        self.proc.wait()


def case_rng(seed: int, area: str, k: int) -> random.Random:
    """The generator of `area`'s k-th case: the same whatever ran before it, or how fast."""
    return random.Random(f"{seed}/{area}/{k}")


def fuzz(seconds: float | None, seed: int = 0, areas=AREAS, save_dir: Path | None = None,
         log=None, cases: dict[str, int] | None = None) -> dict[str, Tally]:
    """Cases from `areas`: for `seconds`, time-fairly, or (`cases`) exactly that many of each
    area, whatever the time they take (a test's verdict must not depend on the machine's load);
    returns the tally per area. An area's k-th case is the same in both."""
    tallies = {a: Tally() for a in areas}
    made = {a: 0 for a in areas}
    work = Path(tempfile.mkdtemp(prefix="qw-fuzz-"))
    worker = Worker()
    deadline = None if cases is not None else time.monotonic() + seconds
    i = 0

    def next_area():
        if cases is None:
            # time-fair: the area that has used the least time goes next, so slow kinds
            # (exports, scenarios) and fast ones (headers) share the budget evenly
            return (min(areas, key=lambda a: (tallies[a].seconds, tallies[a].tried))
                    if time.monotonic() < deadline else None)
        left = [a for a in areas if made[a] < cases.get(a, 0)]
        return min(left, key=lambda a: made[a] / cases[a]) if left else None
    try:
        while (area := next_area()) is not None:
            i += 1
            t_case = time.monotonic()
            rng, made[area] = case_rng(seed, area, made[area]), made[area] + 1
            try:
                name, data = GENERATORS[area](rng)
            except Exception:  # noqa: BLE001 - a generator's own mistake is not a finding
                tallies[area].seconds += 0.1
                tallies[area].skipped += 1
                continue
            d = work / f"{i}"
            d.mkdir()
            path = d / name
            path.write_bytes(data)
            out = worker.run(area, str(path))
            t = tallies[area]
            t.tried += 1
            if out["result"] == "ok":
                t.ok += 1
            elif out["result"] == "error":
                t.errors += 1
            else:
                t.failures.append({"area": area, "case": i, **out})
                if save_dir is not None:
                    save_dir.mkdir(parents=True, exist_ok=True)
                    (save_dir / f"{area}-{i}-{name}").write_bytes(data)
                if log:
                    log(f"FAIL {area} case {i}: {out.get('kind')}: "
                        f"{out.get('message', '')[-300:]}")
                if worker.proc.poll() is not None or out.get("kind") in ("hang", "worker died",
                                                                        "memory"):
                    if worker.proc.poll() is None:
                        worker.kill()
                    worker = Worker()
            worker.cases += 1
            if worker.cases >= CASES_PER_WORKER:
                # the worker's own growth over thousands of cases (allocator fragmentation,
                # the tiny architectures it keeps; ~0.3 MiB a case measured) is not a case's:
                # a fresh worker keeps every case's share of the limit
                worker.kill()
                worker = Worker()
            # the case's own time (a generator's one-time seed, e.g. the quantized kind's
            # export, is not charged to its kind)
            t.seconds += out.get("seconds", time.monotonic() - t_case)
            import shutil
            shutil.rmtree(d, ignore_errors=True)
    finally:
        worker.kill()
    return tallies

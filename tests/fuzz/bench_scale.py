"""Class 8 of issue 20, measured: `inspect` of a safetensors header with 300,000 empty tensors
and `evaluate` with a plan of 100,000 rules, each as the real command in a fresh process
(wall and CPU seconds), beside json.loads of the same header (a yardstick of the machine's
speed at the time: it reads the header into Python objects and nothing else).

    python -m tests.fuzz.bench_scale [--tensors 300000] [--rules 100000] [--checkout DIR]
                                     [--baseline DIR] [--repeat N]

--checkout runs another checkout's code instead of this one; --baseline runs that checkout's
code too (e.g. /work/main, before a change), each command alternately with this one's, so
both are measured under the same load; --repeat N keeps the best of N runs of each.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def make_header(path: Path, n: int) -> None:
    header = {f"model.layers.{i}.t{i}": {"dtype": "F32", "shape": [0, 4], "data_offsets": [0, 0]}
              for i in range(n)}
    blob = json.dumps(header).encode()
    blob += b" " * ((-len(blob)) % 8)
    path.write_bytes(len(blob).to_bytes(8, "little") + blob)


def make_plan(path: Path, n: int) -> None:
    r = random.Random(0)
    rules = []
    for i in range(n):
        k = r.randrange(4)
        if k == 0:
            rules.append({"match": f"re:layers\\.{i}\\.(mlp|self_attn)\\.", "scheme": "q4_0"})
        elif k == 1:
            rules.append({"match": f"model.layers.{i}.mlp.up_proj.weight", "scheme": "q8_0"})
        elif k == 2:
            rules.append({"match": f"re:^blk\\.{i}\\.ffn_(up|down)", "scheme": "q5_0"})
        else:
            rules.append({"match": f"re:[a-z]+{i}x", "scheme": "q4_1"})
    rules.append({"match": "re:down_proj", "scheme": "q5_1"})
    path.write_text(json.dumps({"format": "quant-workbench-plan", "version": 1,
                                "default": "q8_0", "rules": rules}))


def timed(argv, checkout: Path, timeout: float) -> dict:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, str(checkout / "main.py"), *argv], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           timeout=timeout)
        rc = r.returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"exit": rc, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2)}


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fuzz.bench_scale")
    p.add_argument("--tensors", type=int, default=300_000)
    p.add_argument("--rules", type=int, default=100_000)
    p.add_argument("--checkout", default=str(ROOT))
    p.add_argument("--baseline", default=None, help="another checkout, measured alternately")
    p.add_argument("--repeat", type=int, default=1, help="best of N runs of each command")
    p.add_argument("--timeout", type=float, default=300.0)
    a = p.parse_args()
    d = Path(tempfile.mkdtemp(prefix="qw-scale-"))
    st, plan = d / "big.safetensors", d / "plan.json"
    make_header(st, a.tensors)
    make_plan(plan, a.rules)
    raw = st.read_bytes()[8:]
    floor = float("inf")
    for _ in range(max(1, a.repeat)):
        t0 = time.process_time()
        json.loads(raw)
        floor = min(floor, time.process_time() - t0)
    demo = ROOT / "resources" / "demo_model"
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "load_average": round(os.getloadavg()[0], 2), "checkout": a.checkout,
           "baseline": a.baseline, "repeat": a.repeat,
           "header_bytes": len(raw), "json_loads_cpu_s": round(floor, 2)}
    commands = {"inspect": ["inspect", str(st)],
                "inspect_json": ["inspect", str(st), "--json"],
                "inspect_no_stats": ["inspect", str(st), "--no-stats"],
                "evaluate_1_rule": ["evaluate", str(demo), "--scheme", "q8_0"],
                "evaluate_100k_rules": ["evaluate", str(demo), "--plan", str(plan)]}
    checkouts = {"this": Path(a.checkout)}
    if a.baseline:
        checkouts["baseline"] = Path(a.baseline)
    for key, argv in commands.items():
        best: dict = {}
        for _ in range(max(1, a.repeat)):
            for label, co in checkouts.items():
                r = timed(argv, co, a.timeout)
                b = best.get(label)
                if b is None or (r["exit"] == 0 and r["cpu_s"] < b["cpu_s"]):
                    best[label] = r
        out[key] = best["this"] if not a.baseline else best
    out["load_average_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

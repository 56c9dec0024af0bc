"""bench-cluster: the weight sweep (every tensor x candidate scheme, as the sensitivity table
measures it) of a generated bf16 checkpoint on a local Dask cluster of 1 and 2 single-threaded
worker processes, against the in-process loop on one thread; from those figures the projected
time of the same sweep over a DeepSeek-V3-shaped model (671 B parameters) on N machines.

Measured: tasks per second and seconds per task (one task = one tensor, all schemes), the
per-task overhead (empty tasks through the same scheduler), and the scaling efficiency
T(1 worker) / (2 T(2 workers)).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

HIDDEN, MLP, KV = 1024, 2816, 256
#: DeepSeek-V3 (config.json of deepseek-ai/DeepSeek-V3): parameters and weight matrices
DSV3_PARAMS = 671e9
DSV3_MATRICES = 3 * 3 + 58 * (256 * 3 + 3 + 1) + 61 * 5 + 2   # dense MLPs, experts + shared + router, attention, embed + head


def layer_shapes() -> dict[str, tuple[int, int]]:
    return {"self_attn.q_proj.weight": (HIDDEN, HIDDEN), "self_attn.k_proj.weight": (KV, HIDDEN),
            "self_attn.v_proj.weight": (KV, HIDDEN), "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
            "mlp.gate_proj.weight": (MLP, HIDDEN), "mlp.up_proj.weight": (MLP, HIDDEN),
            "mlp.down_proj.weight": (HIDDEN, MLP)}


def generate(path, layers: int, seed: int = 0) -> dict:
    """A bf16 safetensors file of `layers` llama-shaped blocks (7 matrices each)."""
    from workbench.core.floatbits import f32_to_bf16
    from workbench.export.st_writer import StreamingSafetensorsWriter
    rng = np.random.default_rng(seed)
    pool = f32_to_bf16(rng.standard_normal(1 << 22).astype(np.float32) * 0.02)
    w = StreamingSafetensorsWriter(Path(path), {"format": "pt"})
    params = 0
    for i in range(layers):
        for k, shape in layer_shapes().items():
            n = shape[0] * shape[1]
            arr = np.resize(np.roll(pool, int(rng.integers(0, pool.size))), n)
            w.add(f"model.layers.{i}.{k}", arr.reshape(shape), dtype="BF16")
            params += n
    w.finish()
    return {"params": params, "tensors": layers * len(layer_shapes())}


def _requests(model, schemes):
    from workbench.quant.runtimes import decide
    out = []
    for n in model.tensors:
        info = model.info(n)
        out.append((n, [(s, decide(info, s, "any")) for s in schemes]))
    return out


def in_process(model, reqs) -> float:
    """Seconds for the sweep in this process, one kernel thread (what one worker does)."""
    from workbench.quant.evaluate import evaluate_tensor
    t0 = time.perf_counter()
    for n, rs in reqs:
        for s, d in rs:
            evaluate_tensor(model, n, s, None, decision=d)
    return time.perf_counter() - t0


def on_cluster(path: str, model, reqs, workers: int, noop_tasks: int, repeats: int = 3) -> dict:
    """The sweep on a local cluster of `workers` single-threaded processes: a warm-up pass
    (each worker opens the file, loads its kernels), then the timed passes (the best of
    `repeats`: other load on the machine only ever adds); and `noop_tasks` empty tasks for the
    per-task overhead (best of `repeats` too)."""
    from workbench.jobs.cluster import ClusterExecutor, evaluate_task, signature, timed_noop
    from workbench.core.progress import run
    sig = signature(model)
    tasks = [(sig, n, rs) for n, rs in reqs]
    with ClusterExecutor("local", workers) as ex:
        ex.client.wait_for_workers(workers, timeout=120)
        run(ex.sweep(evaluate_task, tasks[:2 * workers]))   # warm: open, kernels from cache
        noop_s = sweep_s = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            run(ex.sweep(timed_noop, [(i,) for i in range(noop_tasks)]))
            noop_s = min(noop_s, time.perf_counter() - t0)
            t0 = time.perf_counter()
            run(ex.sweep(evaluate_task, tasks))
            sweep_s = min(sweep_s, time.perf_counter() - t0)
    return {"workers": workers, "seconds": sweep_s, "tasks": len(tasks),
            "tasks_per_s": len(tasks) / sweep_s, "noop_tasks": noop_tasks,
            "overhead_ms": 1000 * noop_s / noop_tasks}


def measure(folder, layers: int = 8, schemes=("q4_0", "q4_k", "q8_0", "int4-g128"),
            noop_tasks: int = 200, repeats: int = 3) -> dict:
    import os
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")
    from workbench.formats.loaders import open_model
    path = Path(folder) / "bench-cluster.safetensors"
    gen = generate(path, layers)
    model = open_model(path)
    reqs = _requests(model, list(schemes))
    in_process(model, reqs[:2])                      # kernels loaded
    try:
        import numba
        numba.set_num_threads(1)
    except ImportError:
        pass
    local_s = min(in_process(model, reqs) for _ in range(repeats))
    runs = [on_cluster(str(path), model, reqs, w, noop_tasks, repeats) for w in (1, 2)]
    t1, t2 = runs[0]["seconds"], runs[1]["seconds"]
    n = len(reqs)
    res = {"params": gen["params"], "tensors": n, "schemes": list(schemes),
           "in_process_s": local_s, "in_process_task_ms": 1000 * local_s / n,
           "runs": runs, "scaling_efficiency": t1 / (2 * t2),
           "speedup_2": t1 / t2, "cpus": os.cpu_count(), "repeats": repeats,
           "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}
    res["projection"] = project(res)
    return res


def project(res: dict, machines=(1, 8, 32, 128), workers_per_machine: int = 32) -> dict:
    """The DeepSeek-V3-shaped sweep (671 B parameters, the same candidate schemes) from the
    measured figures: one worker's rate in parameters x schemes per second (the 1-worker run),
    the per-task overhead, and the measured 2-worker efficiency held for every worker count
    (an assumption: shared storage keeps up, each worker reads its tensor once)."""
    one = res["runs"][0]
    rate = res["params"] * len(res["schemes"]) / one["seconds"]    # param x scheme / s, 1 worker
    eff = min(1.0, res["scaling_efficiency"])
    work = DSV3_PARAMS * len(res["schemes"]) / rate                 # worker-seconds
    overhead = DSV3_MATRICES * one["overhead_ms"] / 1000
    out = {"rate_param_schemes_per_s": rate, "worker_hours": work / 3600,
           "workers_per_machine": workers_per_machine, "efficiency": eff, "hours": {}}
    for m in machines:
        w = m * workers_per_machine
        out["hours"][m] = (work / (w * eff) + overhead / w) / 3600
    return out


def measure_in_subprocess(folder, layers: int, schemes, noop_tasks: int,
                          repeats: int = 3) -> dict:
    """measure() in a fresh interpreter with one numba thread, so the in-process figure is
    one thread's (as one worker's) whatever this process set."""
    import json
    import os
    import subprocess
    import sys
    env = dict(os.environ, NUMBA_NUM_THREADS="1")
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    code = ("import json, sys; from workbench.bench.cluster import measure; "
            f"print(json.dumps(measure({str(folder)!r}, {layers}, {list(schemes)!r}, "
            f"{noop_tasks}, {repeats})))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, cwd=root)
    if out.returncode != 0:
        from workbench.core.errors import WorkbenchError
        raise WorkbenchError("bench-cluster failed: " + (out.stderr.strip().splitlines() or
                                                         ["no output"])[-1])
    return json.loads(out.stdout.strip().splitlines()[-1])

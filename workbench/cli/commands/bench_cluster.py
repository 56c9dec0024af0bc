"""`quant-workbench bench-cluster [--layers 8] [--schemes A,B] [--repeats 3] [--json]`.

The weight sweep of a generated bf16 checkpoint through a local Dask cluster of 1 and 2
single-threaded workers on this machine (workbench.bench.cluster): tasks per second, per-task
overhead, scaling efficiency, and the projected time of a DeepSeek-V3-shaped sweep on N
machines. Needs the [cluster] extra.
"""

from __future__ import annotations

import shutil
import sys
import tempfile

from workbench.cli.common import print_json


def register(sub) -> None:
    p = sub.add_parser("bench-cluster", help="benchmark the sweep on a local Dask cluster of "
                                             "1 and 2 workers; project a 671B-parameter sweep")
    p.add_argument("--layers", type=int, default=8,
                   help="llama-shaped blocks generated (7 matrices, 11.3 M parameters each)")
    p.add_argument("--schemes", default="q4_0,q4_k,q8_0,int4-g128",
                   help="candidate schemes per tensor (default: q4_0,q4_k,q8_0,int4-g128)")
    p.add_argument("--noop-tasks", type=int, default=200,
                   help="empty tasks timed for the per-task overhead")
    p.add_argument("--repeats", type=int, default=3,
                   help="timed passes per configuration; the best is reported (default 3)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    from workbench.api import parse_schemes
    from workbench.bench.cluster import measure_in_subprocess
    from workbench.core.errors import WorkbenchError
    from workbench.core.optional import require
    require("distributed", "cluster")
    if args.layers < 1 or args.noop_tasks < 1 or args.repeats < 1:
        raise WorkbenchError("--layers, --noop-tasks and --repeats must be at least 1")
    schemes = parse_schemes(args.schemes)
    folder = tempfile.mkdtemp(prefix="qwb-bench-cluster-")
    try:
        print(f"generating {args.layers} blocks; sweeping {len(schemes)} schemes in process, "
              "then on 1 and 2 workers ...", file=sys.stderr)
        res = measure_in_subprocess(folder, args.layers, schemes, args.noop_tasks,
                                    args.repeats)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if args.json:
        print_json(res)
        return 0
    print(f"checkpoint   {res['params']:,} params bf16, {res['tensors']} tensors x "
          f"{len(res['schemes'])} schemes ({','.join(res['schemes'])}); {res['cpus']} CPUs")
    load = res.get("load_average")
    print(f"best of {res['repeats']} passes each" + (f"; load average {load:.1f} at the end"
                                                     if load is not None else ""))
    print(f"in process   {res['in_process_s']:.2f} s on one thread "
          f"({res['in_process_task_ms']:.0f} ms per tensor)")
    for r in res["runs"]:
        print(f"{r['workers']} worker{'s' if r['workers'] > 1 else ' '}    {r['seconds']:.2f} s, "
              f"{r['tasks_per_s']:.2f} tasks/s, per-task overhead {r['overhead_ms']:.1f} ms "
              f"({r['noop_tasks']} empty tasks)")
    print(f"scaling      {res['speedup_2']:.2f}x with 2 workers: efficiency "
          f"{100 * res['scaling_efficiency']:.0f} %")
    p = res["projection"]
    print(f"projection   DeepSeek-V3 (671 B params), same schemes: {p['worker_hours']:.0f} "
          f"worker-hours at this machine's per-worker rate; with "
          f"{p['workers_per_machine']} workers per machine:")
    for m, h in p["hours"].items():
        print(f"             {m:>4} machine{'s' if int(m) > 1 else ' '}  {h:6.2f} h "
              f"({60 * h:.1f} min)")
    return 0

"""`quant-workbench bench-load [--params 1e9] [--dir DIR] [--keep] [--json]`.

Generates a llama-shaped bf16 sharded checkpoint in a temporary folder and reports the time
to open it, the time and GB/s to compute all statistics against a plain numpy pass over the
same memory-mapped tensors (measured in the same run), and the peak resident memory.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time

from workbench.cli.common import print_json


def register(sub) -> None:
    p = sub.add_parser("bench-load", help="benchmark opening and statistics on a generated "
                                          "~1B-parameter sharded bf16 checkpoint")
    p.add_argument("--params", type=float, default=1.0e9, help="approximate parameter count")
    p.add_argument("--dir", help="folder to generate into (default: a temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep the generated checkpoint")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    from workbench.bench.load import generate, measure_in_subprocess
    folder = args.dir or tempfile.mkdtemp(prefix="qwb-bench-")
    try:
        print(f"generating ~{args.params:.3g} parameters in {folder} ...", file=sys.stderr)
        t0 = time.perf_counter()
        gen = generate(folder, args.params)
        gen_s = time.perf_counter() - t0
        print(f"generated {gen['params']:,} params in {gen['shards']} shards "
              f"({gen_s:.1f} s); measuring in a fresh process ...", file=sys.stderr)
        res = measure_in_subprocess(folder, args.repeats)
        res.update(shards=gen["shards"], generate_s=gen_s)
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(folder, ignore_errors=True)
    if args.json:
        print_json(res)
        return 0
    print(f"checkpoint      {res['params']:,} params, {res['bytes'] / 1e9:.2f} GB bf16, "
          f"{res['tensors']} tensors in {res['shards']} shards")
    print(f"open            {res['open_s'] * 1000:.1f} ms")
    print(f"statistics      {res['stats_s']:.2f} s  {res['stats_gbps']:.2f} GB/s")
    print(f"numpy sum pass  {res['numpy_sum_s']:.2f} s  {res['numpy_sum_gbps']:.2f} GB/s "
          f"(baseline, same run)")
    print(f"ratio           statistics at {res['stats_vs_numpy_sum']:.2f}x the baseline's speed")
    print(f"peak RSS        {res['peak_rss_mb']:.0f} MB")
    return 0

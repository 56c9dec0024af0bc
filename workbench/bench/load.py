"""Loading and statistics benchmark on a generated llama-shaped bf16 sharded checkpoint.

`generate(folder, params)` writes a TinyLlama-shaped checkpoint (hidden 2048, MLP 5632,
32 heads / 4 KV heads, vocab 32000; layers scaled to reach `params`) as ~500 MB bf16 shards
with a `model.safetensors.index.json`. `measure(folder)` runs in a fresh process and reports:
time to open, time and GB/s for all statistics, the same for a plain numpy pass that decodes
and sums every memory-mapped tensor (the baseline, measured in the same run), and the peak
resident memory of the measuring process.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HIDDEN, MLP, HEADS, KV_HEADS, VOCAB = 2048, 5632, 32, 4, 32000
HEAD_DIM = HIDDEN // HEADS
SHARD_BYTES = 500 * 1024 * 1024


def layer_shapes() -> dict[str, tuple[int, ...]]:
    kv = KV_HEADS * HEAD_DIM
    return {"input_layernorm.weight": (HIDDEN,), "self_attn.q_proj.weight": (HIDDEN, HIDDEN),
            "self_attn.k_proj.weight": (kv, HIDDEN), "self_attn.v_proj.weight": (kv, HIDDEN),
            "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
            "post_attention_layernorm.weight": (HIDDEN,), "mlp.gate_proj.weight": (MLP, HIDDEN),
            "mlp.up_proj.weight": (MLP, HIDDEN), "mlp.down_proj.weight": (HIDDEN, MLP)}


def plan_tensors(params: float) -> list[tuple[str, tuple[int, ...]]]:
    per_layer = sum(int(np.prod(s)) for s in layer_shapes().values())
    fixed = 2 * VOCAB * HIDDEN + HIDDEN
    layers = max(1, round((params - fixed) / per_layer))
    out = [("model.embed_tokens.weight", (VOCAB, HIDDEN))]
    for i in range(layers):
        out += [(f"model.layers.{i}.{k}", s) for k, s in layer_shapes().items()]
    out += [("model.norm.weight", (HIDDEN,)), ("lm_head.weight", (VOCAB, HIDDEN))]
    return out


def generate(folder, params: float = 1.0e9, seed: int = 0) -> dict:
    """Write the sharded checkpoint into `folder`; returns {params, bytes, shards}."""
    from workbench.core.checks import check_float
    check_float("params", params, 1e6, 1e12)
    from workbench.core.floatbits import f32_to_bf16
    from workbench.export.st_writer import StreamingSafetensorsWriter

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    pool = f32_to_bf16(rng.standard_normal(1 << 24).astype(np.float32) * 0.02)
    tensors = plan_tensors(params)
    shards: list[list[tuple[str, tuple]]] = [[]]
    size = 0
    for name, shape in tensors:
        nb = int(np.prod(shape)) * 2
        if size + nb > SHARD_BYTES and shards[-1]:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nb
    weight_map = {}
    total_params = 0
    for k, items in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        w = StreamingSafetensorsWriter(folder / fname, {"format": "pt"})
        for name, shape in items:
            n = int(np.prod(shape))
            if len(shape) == 1:
                arr = f32_to_bf16(1.0 + 0.1 * rng.standard_normal(n).astype(np.float32))
            else:
                start = int(rng.integers(0, pool.size))
                arr = np.resize(np.roll(pool, start), n)
            w.add(name, arr.reshape(shape), dtype="BF16")
            weight_map[name] = fname
            total_params += n
        w.finish()
    index = {"metadata": {"total_size": total_params * 2}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return {"params": total_params, "bytes": total_params * 2, "shards": len(shards)}


def _numpy_sum_pass(model) -> float:
    """Baseline: decode each memory-mapped tensor to float32 in chunks and sum it."""
    from workbench.formats.dtypes import decode_rows
    total = 0.0
    for name, info in model.tensors.items():
        raw = model.raw(name)
        step = max(1, (1 << 23) // max(info.cols, 1))
        for r0 in range(0, info.rows, step):
            total += float(decode_rows(raw[r0:r0 + step], info).sum(dtype=np.float32))
    return total


def measure(folder, repeats: int = 2) -> dict:
    """Open + statistics + baseline timings, in this process (call in a fresh one)."""
    from workbench.formats.loaders import open_model
    from workbench.core.progress import run
    from workbench.quant.stats import model_stats

    t0 = time.perf_counter()
    model = open_model(folder)
    t_open = time.perf_counter() - t0
    nbytes = model.total_bytes
    # compile the stats kernels on a small tensor first (JIT is cached on disk)
    small = min(model.tensors.values(), key=lambda i: i.numel).name
    run(model_stats(model, [small], cache=None))
    base, stat = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        _numpy_sum_pass(model)
        base.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        run(model_stats(model, cache=None))
        stat.append(time.perf_counter() - t0)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t_stats, t_base = min(stat), min(base)
    return {"tensors": len(model), "params": model.total_params, "bytes": nbytes,
            "open_s": t_open, "stats_s": t_stats, "stats_gbps": nbytes / t_stats / 1e9,
            "numpy_sum_s": t_base, "numpy_sum_gbps": nbytes / t_base / 1e9,
            "stats_vs_numpy_sum": t_base / t_stats, "peak_rss_mb": peak_kib / 1024,
            "stats_runs_s": stat, "numpy_sum_runs_s": base}


def measure_in_subprocess(folder, repeats: int = 2) -> dict:
    from workbench.core.checks import check_int
    check_int("repeats", repeats, 1, 1000)
    code = ("import json,sys; from workbench.bench.load import measure; "
            f"print(json.dumps(measure(sys.argv[1], {int(repeats)})))")
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True,
                         text=True, env=env, check=False)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip()[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])

"""Latency of the float against the quantized ONNX model in ONNX Runtime on this CPU, in one run.

Both files are written by the ONNX exporter (workbench.export.onnx_format) from the same network:
the float one with every tensor kept (plain MatMul), the quantized one with the plan. Each is
loaded in its own CPU-execution-provider session with the same thread count, warmed up, then
timed on the same input (`batch` × `seq` token ids) alternately, `repeats` times each; the figure
is the median milliseconds per run. File sizes are the bytes on disk.
"""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from workbench.quant.plan import KEEP, Plan
from workbench.core.progress import Progress


def _inputs(vocab: int, batch: int, seq: int):
    rng = np.random.default_rng(0)
    ids = rng.integers(1, max(vocab, 2), size=(batch, seq), dtype=np.int64)
    return ids, np.ones_like(ids)


def bench_onnx(model, plan, batch: int = 1, seq: int = 128, repeats: int = 20,
               threads: int | None = None, accuracy_level: int | None = None, keep_dir=None):
    """Job: {"float": {...}, "quantized": {...}, "speedup", "size_ratio", ...}."""
    from workbench.export.onnx_format import DEFAULT_ACCURACY_LEVEL, build_onnx
    from workbench.export.onnx_check import session
    from workbench.running.onnx_graph import import_onnx
    from workbench.core.progress import subjob
    from workbench.running.runner_config import read_config
    _, ort = import_onnx()
    level = DEFAULT_ACCURACY_LEVEL if accuracy_level is None else int(accuracy_level)
    base_model = model.base if type(model).__name__ == "MethodModel" else model
    vocab = int(read_config(base_model).get("vocab_size", 1000) or 1000)
    from workbench.core.atomic import make_temp_dir
    tmp = Path(keep_dir) if keep_dir else make_temp_dir(tempfile.gettempdir(), "qwb-onnx-bench")
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        fpath, qpath = tmp / "float.onnx", tmp / "quantized.onnx"
        finfo = yield from subjob(build_onnx(base_model, Plan(default=KEEP), fpath,
                                             accuracy_level=level), 0, 30, 100)
        qinfo = yield from subjob(build_onnx(model, plan, qpath, accuracy_level=level),
                                  30, 30, 100)
        ids, mask = _inputs(vocab, batch, seq)
        feeds = {"input_ids": ids, "attention_mask": mask}
        sessions = {"float": session(fpath, threads), "quantized": session(qpath, threads)}
        for s in sessions.values():          # warm-up (first runs pre-pack weights)
            for _ in range(3):
                s.run(None, feeds)
        times = {k: [] for k in sessions}
        for r in range(repeats):
            yield Progress(60 + int(40 * r / max(repeats, 1)), 100, "timing")
            for k, s in sessions.items():
                t = time.perf_counter()
                s.run(None, feeds)
                times[k].append((time.perf_counter() - t) * 1000)
        res = {}
        for k, path, info in (("float", fpath, finfo), ("quantized", qpath, qinfo)):
            res[k] = {"ms_median": statistics.median(times[k]), "ms_min": min(times[k]),
                      "bytes": os.path.getsize(path), "nodes": info["nodes"]}
    finally:
        if not keep_dir:
            shutil.rmtree(tmp, ignore_errors=True)
    yield Progress(100, 100, "done")
    return {**res, "speedup": res["float"]["ms_median"] / res["quantized"]["ms_median"],
            "size_ratio": res["quantized"]["bytes"] / res["float"]["bytes"],
            "batch": batch, "seq": seq, "repeats": repeats,
            "threads": threads or (os.cpu_count() or 1), "accuracy_level": level,
            "onnxruntime": ort.__version__, "provider": "CPUExecutionProvider",
            "cpu": platform.processor() or platform.machine(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}

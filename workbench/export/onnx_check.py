"""Run an exported ONNX model in ONNX Runtime (CPU execution provider) and compare it with the
float model: the figures of `check` (workbench.running.runner_jobs.compare_outputs), measured on what ONNX
Runtime computes from the exported file.

``check --runtime onnxruntime``: the plan is exported to a temporary file (the same writer as
``export --format onnx``), run in ONNX Runtime on the calibration inputs, and compared against
the float transformers model's outputs (encoders: cosine of the attention-masked mean-pooled
final hidden state; causal LMs: KL, top-1 agreement and perplexity of the next-token
distributions).
"""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.core.progress import Progress


def session(path, threads: int | None = None, optimized_path=None):
    """An onnxruntime InferenceSession on the CPU execution provider, on `threads` threads
    (default: $OMP_NUM_THREADS when set, as torch and numpy take it; onnxruntime itself reads
    no variable and takes every core)."""
    from workbench.running.onnx_graph import import_onnx
    _, ort = import_onnx()
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if not threads:
        env = os.environ.get("OMP_NUM_THREADS", "").strip()
        threads = int(env) if env.isdigit() and int(env) > 0 else None
    if threads:
        so.intra_op_num_threads = int(threads)
        so.inter_op_num_threads = 1
    if optimized_path is not None:
        so.optimized_model_filepath = str(optimized_path)
    try:
        return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 (onnxruntime raises its own exception types)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise WorkbenchError(f"onnxruntime cannot load it: {first[:300]}", path=str(path)) from None


def optimized_op_counts(path) -> dict[str, int]:
    """Operator counts of the graph ONNX Runtime runs after its CPU graph optimizations (QDQ
    pairs fused into integer matmuls show as MatMulIntegerToFloat)."""
    import collections

    from workbench.running.onnx_graph import import_onnx
    onnx, _ = import_onnx()
    from workbench.core.atomic import make_temp_dir
    tmp = make_temp_dir(tempfile.gettempdir(), "qwb-onnx-opt")
    try:
        session(path, optimized_path=tmp / "optimized.onnx")
        proto = onnx.load(str(tmp / "optimized.onnx"))
        return dict(collections.Counter(n.op_type for n in proto.graph.node))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def forward(sess, kind: str, ids: np.ndarray, mask: np.ndarray):
    """The Runner.forward figures from ONNX Runtime: encoders (n, hidden) pooled states, causal LMs
    a list of (len-1, vocab) next-token log-probabilities."""
    feeds = {"input_ids": ids.astype(np.int64), "attention_mask": mask.astype(np.int64)}
    if kind == "encoder":
        return sess.run(["pooled"], feeds)[0].astype(np.float32)
    logits = sess.run(["logits"], feeds)[0].astype(np.float64)
    logits -= logits.max(-1, keepdims=True)
    lp = (logits - np.log(np.exp(logits).sum(-1, keepdims=True))).astype(np.float32)
    out = []
    for i in range(ids.shape[0]):
        n = int(mask[i].sum())
        out.append(lp[i, : max(n - 1, 0)])
    return out


def run_onnx_outputs(sess, kind: str, samples, batch_size: int = 16, label: str = "onnxruntime"):
    """Job: ONNX Runtime's outputs for every sample (as workbench.running.runner_passes.run_outputs)."""
    from workbench.running.calibration import batches
    outs = []
    n = len(samples)
    done = 0
    for ids, mask in batches(samples, batch_size):
        yield Progress(done, n, label)
        o = forward(sess, kind, ids, mask)
        outs.extend(list(o))
        done += ids.shape[0]
    yield Progress(n, n, label)
    return outs


def check_onnx(model, plan, calib=None, samples: int | None = None, max_len: int = 128,
               accuracy_level: int | None = None, keep_path=None):
    """Job: export `plan` to ONNX, run it in ONNX Runtime on the calibration inputs and compare
    with the float model. Returns check's figures plus ``runtime``, ``onnxruntime``, ``opset``,
    ``accuracy_level``, ``onnx_bytes``. `keep_path`: also keep the exported file there."""
    from workbench.running.calibration import calibration_samples
    from workbench.export.onnx_format import DEFAULT_ACCURACY_LEVEL, build_onnx
    from workbench.core.progress import subjob
    from workbench.running.runner_jobs import compare_outputs
    from workbench.running.runner_passes import get_runner, run_outputs
    from workbench.running.onnx_graph import import_onnx
    import_onnx()
    level = DEFAULT_ACCURACY_LEVEL if accuracy_level is None else int(accuracy_level)
    base_model = model.base if type(model).__name__ == "MethodModel" else model
    runner = get_runner(base_model)
    data = yield from subjob(calibration_samples(base_model, calib, samples, max_len), 0, 5, 100)
    base = yield from subjob(run_outputs(runner, data, label="float model"), 5, 25, 100)
    from workbench.core.atomic import make_temp_dir
    tmp = make_temp_dir(tempfile.gettempdir(), "qwb-onnx-check")
    try:
        path = tmp / "model.onnx"
        info = yield from subjob(build_onnx(model, plan, path, accuracy_level=level), 30, 40, 100)
        sess = session(path)
        ops = optimized_op_counts(path)
        quant = yield from subjob(run_onnx_outputs(sess, runner.kind, data), 70, 30, 100)
        if keep_path is not None:
            from workbench.core.atomic import atomic_write
            with atomic_write(keep_path) as fh:
                fh.write(path.read_bytes())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n_tok = int(sum(len(s) for s in data))
    return {"model_kind": runner.kind, "samples": len(data), "tokens": n_tok,
            **compare_outputs(runner.kind, base, quant, data),
            "runtime": "onnxruntime", "provider": "CPUExecutionProvider",
            "onnxruntime": info["onnxruntime"], "opset": info["opset"],
            "accuracy_level": level, "onnx_bytes": info["bytes"], "nodes": info["nodes"],
            "ort_ops": {k: ops.get(k, 0) for k in ("MatMulNBits", "MatMulIntegerToFloat",
                                                   "MatMul", "FusedMatMul", "Gemm")}}

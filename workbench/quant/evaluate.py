"""Error evaluation of a plan over a model: per-tensor metrics and model totals.

`evaluate(model, plan)` is a job (generator with progress). `evaluate_tensor` does one
tensor and is what the GUI calls after an edit; results are cached per
(model, tensor, scheme) so re-assigning a scheme already measured is instant.
Quantize / dequantize-and-measure go through the numba kernels when they are available
(bit-identical to the numpy reference), else through the numpy reference.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass

import numpy as np

from workbench.core.errors import WorkbenchError, context
from workbench.quant.metrics import ErrorSums, ModelTotals, TensorError, from_sums
from workbench.quant.plan import KEEP
from workbench.core.progress import Progress
from workbench.quant.runtimes import Decision, Summary, check_strict, decide, plan_decisions, summarize
from workbench.schemes import get_scheme
from workbench.quant.stats import file_signature


@dataclass
class TensorResult:
    name: str
    scheme: str               # the scheme applied ("keep" when stored unchanged)
    requested: str            # the scheme the plan asked for
    shape: tuple
    params: int
    bytes_before: int
    bytes: int
    error: TensorError
    note: str | None = None   # why the requested scheme was not applied
    seconds: float = 0.0
    kind: str = "ok"          # ok | fallback | kept | skipped (workbench.quant.runtimes)
    method: str = "rtn"       # the quantization method (workbench.quant.methods)

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.bytes / self.params if self.params else 0.0

    def to_dict(self) -> dict:
        d = {"name": self.name, "scheme": self.scheme, "requested": self.requested,
             "kind": self.kind, "shape": list(self.shape),
             "params": self.params, "bits_per_weight": self.bits_per_weight,
             "bytes": self.bytes, "method": self.method, **self.error.to_dict()}
        if self.note:
            d["note"] = self.note
        return d


@dataclass
class Evaluation:
    tensors: dict[str, TensorResult]
    totals: ModelTotals
    summary: Summary | None = None
    runtime: str = "any"

    def to_dict(self) -> dict:
        d = {"tensors": [r.to_dict() for r in self.tensors.values()],
             "totals": self.totals.to_dict(), "runtime": self.runtime}
        if self.summary is not None:
            d["fallbacks"] = self.summary.to_dict()
        return d


def quantize(w: np.ndarray, scheme_name: str, tensor: str | None = None):
    """QuantizedTensor of a matrix: the numba kernel when available, else the reference.
    A WorkbenchError when the scheme cannot represent finite weights (a scale or value that
    overflows its storage type) instead of a tensor of Inf."""
    from workbench.quant import accel     # (a scheme without a kernel: accel runs the reference)
    scheme = get_scheme(scheme_name)
    try:
        qt = accel.quantize(scheme, w)
    except WorkbenchError as exc:
        raise WorkbenchError(exc.problem, path=exc.path, tensor=tensor) from None
    if scheme.reference_needed(qt):   # an edge of the scale range: the reference refuses/handles it
        qt = scheme.quantize(w, tensor=tensor)
    check_representable(qt, w, tensor)   # the safety net for every scheme (GGML ones too)
    return qt


def _float_parts(arr: np.ndarray):
    if arr.dtype.fields:
        for name, (dt, _off) in arr.dtype.fields.items():
            if dt.kind == "f":
                yield arr[name]
    elif arr.dtype.kind == "f":
        yield arr


def check_representable(qt, w: np.ndarray, tensor: str | None = None) -> None:
    """Refuse a quantized tensor whose stored floats (scales, mins, cast values) are not finite
    while the weights are: the storage type overflowed (e.g. fp16 above 65504, a float16
    group scale of a 1e30 outlier)."""
    for key, arr in qt.arrays.items():
        parts = list(_float_parts(arr))
        if qt.scheme == "bf16" and arr.dtype == np.uint16:   # bfloat16 bits: exponent all ones
            parts = [np.where((arr & 0x7F80) == 0x7F80, np.float32(np.inf), np.float32(0))]
        for part in parts:
            if part.size and not np.isfinite(part).all():
                if not np.isfinite(w).all():
                    return  # non-finite input: refused (or passed through) by the scheme
                amax = float(np.abs(w).max()) if w.size else 0.0
                raise WorkbenchError(
                    f"{qt.scheme} cannot represent these weights (max |w| = {amax:.3g}): its "
                    f"{key} overflow their storage type; use a wider scheme (fp32, bf16, int8-"
                    "channel) for this tensor", tensor=tensor)


def quantize_measure(w: np.ndarray, scheme_name: str, tensor: str | None = None):
    """(QuantizedTensor, ErrorSums) for a 2-D float32 matrix, kernels when available."""
    from workbench.quant import accel     # (no kernel for the scheme: the reference's sums)
    qt = quantize(w, scheme_name, tensor=tensor)
    return qt, accel.dequant_error(w, qt)


def measure(w: np.ndarray, scheme_name: str, tensor: str | None = None):
    """(quantized bytes, ErrorSums) of a 2-D float32 matrix: quantize_measure's figures, from
    one pass over the weights where a kernel does both (accel.quantize_error: integer and
    ternary schemes on the CPU), else through quantize_measure."""
    from workbench.quant import accel
    got = accel.quantize_error(scheme_name, w)
    if got is not None:
        return got
    qt, sums = quantize_measure(w, scheme_name, tensor=tensor)
    return qt.nbytes, sums


class EvalCache:
    """Results keyed by (model path, tensor, scheme); an entry is dropped when the file at the
    model path has changed since (its mtime/size), so a rewritten file is measured again."""

    def __init__(self):
        self._data: dict[tuple, tuple] = {}
        self._lock = threading.Lock()

    def get(self, key):
        sig = file_signature(key[0])
        with self._lock:
            hit = self._data.get(key)
            if hit is None or hit[0] != sig:
                return None
            return hit[1]

    def put(self, key, value) -> None:
        sig = file_signature(key[0])
        with self._lock:
            self._data[key] = (sig, value)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


DEFAULT_EVAL_CACHE = EvalCache()


def evaluate_tensor(model, name: str, scheme_name: str,
                    cache: EvalCache | None = DEFAULT_EVAL_CACHE, *,
                    decision: Decision | None = None,
                    matrix: np.ndarray | None = None) -> TensorResult:
    """One tensor under `scheme_name`; `decision` (workbench.quant.runtimes.decide) says what is
    applied — by default the fallback rules of the ``any`` runtime. `matrix`: the tensor as
    `model.read_matrix(name)` returns it, when the caller holds it already (not modified)."""
    info = model.info(name)
    if decision is None:
        decision = decide(info, scheme_name, "any")
    key = (model.path, name, scheme_name, decision.applied, decision.kind)
    method_of = getattr(model, "method_of", None)
    if method_of is not None and method_of(name) != "rtn":
        # a method's result depends on its statistics: never shared through the cache
        cache = None
    if cache is not None and (hit := cache.get(key)) is not None:
        return hit
    with context(getattr(info, "file", None) or model.path, name):
        res = _evaluate_tensor(model, info, name, scheme_name, decision, matrix)
    if cache is not None:
        cache.put(key, res)
    return res


def _evaluate_tensor(model, info, name, scheme_name, decision, matrix=None) -> TensorResult:
    t0 = time.perf_counter()
    applied, note = decision.applied, decision.note
    from workbench.quant import streaming
    method_model = getattr(model, "quantize_tensor", None) is not None and (
        model.method_of(name) != "rtn" or name in model.folded_names)
    if matrix is None and not method_model and streaming.streamed(info, applied) \
            and (applied != KEEP or info.is_float):
        # a tensor too big to hold whole (with its codes and error) at once: row chunks
        if applied == KEEP:
            sums, nbytes = streaming.keep_sums(model, name), info.nbytes
        else:
            nbytes, sums = streaming.measure_rows(model, name, applied)
        return TensorResult(name, applied, scheme_name, info.shape, info.numel, info.nbytes,
                            nbytes, from_sums(sums), note, time.perf_counter() - t0,
                            decision.kind, model.method_of(name) if getattr(
                                model, "method_of", None) and applied != KEEP else "rtn")
    if matrix is None and method_model and streaming.method_streamed(model, info, name, applied):
        # a method whose rows are independent, on a tensor too big to hold whole: row chunks
        nbytes, sums = streaming.measure_rows_method(model, name, applied)
        return TensorResult(name, applied, scheme_name, info.shape, info.numel, info.nbytes,
                            nbytes, from_sums(sums), note, time.perf_counter() - t0,
                            decision.kind, model.method_of(name))
    w = matrix if matrix is not None else model.read_matrix(name)
    if applied == KEEP:
        if info.is_float:
            finite = np.where(np.isfinite(w), w, 0)
            sums = ErrorSums.zero(finite)
        else:
            sums = ErrorSums(info.numel, 0.0, 0.0, 0.0, 0.0, 0.0, np.zeros(info.rows),
                             np.zeros(info.rows))
        nbytes = info.nbytes
    elif method_model:
        # a method (workbench.running.methods_apply.MethodModel): the error of the weight the folded
        # model computes with, mapped back, against the original weights
        qt = model.quantize_tensor(name, w, applied)
        from workbench.quant.accel import dequantize
        wq = model.unfold(name, dequantize(qt).reshape(w.shape))
        w0 = model.base.read_matrix(name)
        sums = ErrorSums.from_arrays(w0, wq)
        nbytes = qt.nbytes
    else:
        nbytes, sums = measure(w, applied, tensor=name)
        if not (math.isfinite(sums.sse) and math.isfinite(sums.max_abs_err)) \
                and np.isfinite(w).all():
            raise WorkbenchError(
                f"{applied} cannot represent these weights (max |w| = "
                f"{float(np.abs(w).max()):.3g}): their dequantized values overflow float32; "
                "keep this tensor or use fp32", tensor=name)
    method = model.method_of(name) if getattr(model, "method_of", None) and applied != KEEP \
        else "rtn"
    return TensorResult(name, applied, scheme_name, info.shape, info.numel, info.nbytes, nbytes,
                        from_sums(sums), note, time.perf_counter() - t0, decision.kind, method)


def evaluate(model, plan, names=None, cache: EvalCache | None = DEFAULT_EVAL_CACHE,
             runtime: str = "any", strict: bool = False, executor=None):
    """Job: evaluate `plan` on `model` (all tensors or `names`) as `runtime` would apply it
    (workbench.quant.runtimes: fallbacks, tensors it never re-types). Returns an Evaluation.
    `executor` (workbench.jobs.cluster): the tensors are measured on its workers first."""
    names = list(model.tensors) if names is None else list(names)
    decisions = plan_decisions(model, plan, runtime, names)
    if strict:
        check_strict(decisions.values(), path=model.path)
    if executor is not None and executor.takes(model):
        from workbench.core.progress import subjob
        cache = cache if cache is not None else EvalCache()
        yield from subjob(executor.prefetch_evaluations(
            model, [(n, decisions[n].requested, decisions[n]) for n in names],
            cache, "evaluating"), 0, 95, 100)
        results, totals = yield from subjob(_evaluate_all(model, names, decisions, cache),
                                            95, 5, 100)
    else:
        results, totals = yield from _evaluate_all(model, names, decisions, cache)
    return Evaluation(results, totals, summarize(decisions.values()), runtime)


def _evaluate_all(model, names, decisions, cache):
    total = sum(max(model.info(n).numel, 1) for n in names) or 1
    done = 0
    results: dict[str, TensorResult] = {}
    totals = ModelTotals()
    for k, n in enumerate(names, 1):
        yield Progress(done, total, f"evaluating {k}/{len(names)} {n}")
        d = decisions[n]
        r = evaluate_tensor(model, n, d.requested, cache, decision=d)
        results[n] = r
        totals.add(r.params, r.bytes_before, r.bytes, r.error.sig, r.error.sse)
        done += max(model.info(n).numel, 1)
    yield Progress(total, total, "done")
    return results, totals


def totals_of(results) -> ModelTotals:
    t = ModelTotals()
    for r in results:
        t.add(r.params, r.bytes_before, r.bytes, r.error.sig, r.error.sse)
    return t

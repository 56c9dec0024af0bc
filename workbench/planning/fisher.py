"""The ``fisher`` sensitivity measure (workbench.planning.sensitivity): 1/2 sum_ij F_ij dW_ij^2 with
F the diagonal of the output's Fisher information per weight, estimated in one calibration
pass with random probes (`fisher_diagonals`), and the errors of each tensor under each scheme
weighted by it (`fisher_errors`; on sampled rows for big tensors, or during the pass with
`EarlyFisherErrors`).
"""

from __future__ import annotations


import numpy as np

from workbench.quant.plan import KEEP
from workbench.core.progress import Progress


_FISHER_CACHE: dict[tuple, tuple] = {}


def fisher_diagonals(model, calib=None, samples=None, probes: int = 1, max_len: int = 128,
                     batch_size: int = 32, seed: int = 0, early=None):
    """Job: ({workbench name: F (the tensor's shape, float32)}, count) with F_ij summed over
    calibration samples (encoders) or next-token positions (causal LMs) and `probes` random
    probes each, so that 1/2 * sum_ij F_ij dW_ij^2 / count estimates the ``output`` measure of a
    weight change dW to second order:

    * encoders (1 - cosine of the pooled embedding b): probe v = P z / |b|, z ~ N(0, I), P the
      projection orthogonal to b; E[(v . db)^2] = |P db|^2 / |b|^2 = 2 (1 - cos) to second order;
    * causal LMs (KL of next-token distributions): a probe of the logits with the covariance
      of the score of a token drawn from the model's own distribution, diag(p) - p p^T (the
      Fisher information of the logits; E[(probe . dz)^2] = 2 KL to second order), drawn
      Gaussian (`runner_measures._logit_probe`) rather than as a sampled label: on a model
      whose next tokens are peaked, rare labels made one probe's estimate noisy.

    The gradients of one batch are summed before squaring: the probes of different samples
    (positions) are independent with zero mean, so the cross terms vanish in expectation, and
    the estimate stays unbiased whatever the batch; larger batches and fewer probes only add
    noise, which the sums over a tensor's weights average out. The default, one probe of
    batches of 32, costs 2.4x less than two probes of 8 on SmolLM2-135M and its plan scored
    the same held-out KL divergence in llama.cpp (docs/methods.md)."""
    from workbench.running.calibration import calibration_samples
    from workbench.core.progress import subjob
    from workbench.running.runner_passes import runner_job
    from workbench.running.runner_measures import by_tensor, fisher_pass
    runner = yield from runner_job(model)
    data = yield from subjob(calibration_samples(model, calib, samples, max_len), 0, 5, 100)
    key = (str(model.path), tuple(map(id, data)), probes, seed, str(runner.device))
    if key in _FISHER_CACHE:
        return _FISHER_CACHE[key]
    data = sorted(data, key=len)
    on_final = None if early is None else (lambda pn, acc, c: early(runner, pn, acc, c))
    acc, count = yield from subjob(fisher_pass(runner, data, probes, batch_size, seed,
                                               on_final), 5, 100, 100)
    res = (by_tensor(runner, model, acc), count)
    _FISHER_CACHE.clear()
    _FISHER_CACHE[key] = res
    yield Progress(100, 100, "output gradients")
    return res


def _weighted_sq_err(f, w, dq) -> float:
    """sum f (dq - w)^2 in float64: the kernel (one pass, no temporaries), else numpy."""
    f = np.asarray(f)
    if f.dtype == np.float32 and w.dtype == np.float32 and dq.dtype == np.float32:
        try:
            from kernels.stats_kernels import weighted_sq_err
        except ImportError:
            pass
        else:
            return weighted_sq_err(f, np.ascontiguousarray(w), np.ascontiguousarray(dq))
    dw = (np.asarray(dq, np.float64) - np.asarray(w, np.float64))
    return float(np.vdot(f.astype(np.float64, copy=False), dw * dw))


def _cast_error(f, w, applied: str) -> float | None:
    """sum f (cast(w) - w)^2 of the fp16 / bf16 casts in one pass over the float32 weights
    (kernels.stats_kernels.cast_sq_err: 10x faster than casting, widening and weighing, which
    cost more than Q4_0's error); None for other schemes, non-finite weights or an overflow
    (the scheme's own path then gives its result, or its refusal)."""
    if applied not in ("fp16", "bf16") or np.asarray(f).dtype != np.float32 \
            or w.dtype != np.float32:
        return None
    try:
        from kernels.stats_kernels import cast_sq_err
    except ImportError:
        return None
    return cast_sq_err(np.asarray(f), w, applied)


#: rows of a tensor whose fisher errors are measured on every row; a taller tensor's errors
#: under a scheme that quantizes each row on its own are estimated from a proportional sample
#: of ERROR_ROW_FRACTION of its rows (`_error_rows`)
ERROR_ROWS_MIN = 512     # (1,024 until 27 Nov: the errors took 17 of allocate's ~35 CPU s on
#                          SmolLM2-135M, its 576-row tensors all measured whole; docs/methods.md)


ERROR_ROW_FRACTION = 4


def _error_rows(f, wm):
    """(row indices, F of those rows times their Horvitz-Thompson weights, the rows' weights)
    for a tensor taller than ERROR_ROWS_MIN, else None. Rows are drawn with probability
    proportional to sum_j F_ij W_ij^2 (a row's share of the error: a scheme's step in a row
    scales with the row's weights), the same rows for every scheme, so the ratio of two schemes'
    errors, which decides the allocation, keeps the whole tensor's to a fraction of a percent
    (docs/methods.md, "Fisher errors from sampled rows")."""
    from workbench.planning.estimate import proportional_rows
    if wm.ndim != 2 or wm.shape[0] <= ERROR_ROWS_MIN:
        return None
    fm = np.asarray(f, np.float32).reshape(wm.shape)
    score = np.einsum("ij,ij,ij->i", fm, wm, wm, dtype=np.float64)
    limit = max(ERROR_ROWS_MIN // 2, wm.shape[0] // ERROR_ROW_FRACTION)
    idx, hw = proportional_rows(score, limit)
    fs = np.ascontiguousarray(fm[idx] * hw[:, None].astype(np.float32))
    ws = np.ascontiguousarray(wm[idx], np.float32)
    from workbench.core.pages import release
    release(f)      # a mapped F was read whole for the scores: its pages leave the resident set
    return idx, fs, ws


def _error_rows_chunked(model, n, f):
    """`_error_rows` for a tensor read a row chunk at a time, never whole (above
    `streaming.STREAM_ELEMENTS`): the rows' scores in one pass over the chunks (F read
    alongside), the drawn rows gathered in a second."""
    from workbench.planning.estimate import proportional_rows
    from workbench.quant import streaming
    from workbench.core.pages import release
    rows, cols = model.info(n).matrix_shape
    if rows <= ERROR_ROWS_MIN:
        return None
    fm = f.reshape(rows, cols)
    score = np.empty(rows)
    for r0, w in streaming.chunks(model, n):
        fc = fm[r0:r0 + len(w)]
        score[r0:r0 + len(w)] = np.einsum("ij,ij,ij->i", np.asarray(fc, np.float32), w, w,
                                          dtype=np.float64)
        release(fc)
    idx, hw = proportional_rows(score, max(ERROR_ROWS_MIN // 2, rows // ERROR_ROW_FRACTION))
    ws = np.empty((len(idx), cols), np.float32)
    for r0, w in streaming.chunks(model, n):
        sel = np.flatnonzero((idx >= r0) & (idx < r0 + len(w)))
        ws[sel] = w[idx[sel] - r0]
    fs = np.ascontiguousarray(np.asarray(fm[idx], np.float32) * hw[:, None].astype(np.float32))
    release(f)
    return idx, fs, ws


def _row_local(applied: str, shape) -> bool:
    """Whether `applied` quantizes each row of a matrix of `shape` on its own and takes the
    shape as it is (no fallback), so that a subset of the rows quantizes as inside the whole."""
    from workbench.schemes import get_scheme
    if applied == KEEP:
        return False
    sch = get_scheme(applied)
    return bool(sch.row_local) and not sch.ineligible_reason(tuple(shape))


def _dequantized_rows(ws, applied: str, name: str):
    from workbench.quant.accel import dequantize
    from workbench.quant.evaluate import quantize
    return dequantize(quantize(ws, applied, tensor=name)).reshape(ws.shape)


def _fisher_error(model, n, info, applied, f, w, wm, rows, count, dequantized) -> float:
    """1/2 sum_ij F_ij dW_ij^2 / count of tensor `n` under `applied` (see `fisher_errors`)."""
    from workbench.quant import streaming
    from workbench.core.pages import release
    if rows is not None and _row_local(applied, info.matrix_shape if wm is None else wm.shape):
        _idx, fs, ws = rows
        if (val := _cast_error(fs, ws, applied)) is not None:
            return 0.5 * val / max(count, 1)
        return 0.5 * _weighted_sq_err(fs, ws, _dequantized_rows(ws, applied, n)) / max(count, 1)
    if w is None:                    # streamed: a row chunk at a time, F read alongside
        tot = 0.0
        for r0, w0, dq in streaming.dequantized_rows(model, n, applied):
            fc = f.reshape(-1, w0.shape[1])[r0:r0 + w0.shape[0]]
            tot += _weighted_sq_err(fc, w0, dq)
            release(fc)
        release(f)
        return 0.5 * tot / max(count, 1)
    if (val := _cast_error(f, w, applied)) is not None:
        release(f)
        return 0.5 * val / max(count, 1)
    dq = dequantized(model, n, applied, matrix=wm).reshape(info.shape)
    val = 0.5 * _weighted_sq_err(f, w, dq) / max(count, 1)
    release(f)      # a mapped F (a large model's): its pages leave the resident set
    return val


def tensor_fisher_errors(model, n, schemes, f, count: int, runtime: str = "any",
                         rows_sampled: bool = True) -> dict:
    """{(n, scheme): 1/2 sum_ij F_ij dW_ij^2 / count} for tensor `n` and its F `f` (None: the
    network does not read it; 0 for every scheme). See `fisher_errors`."""
    from workbench.core import spill
    from workbench.quant import streaming
    from workbench.quant.streaming import dequantized
    from workbench.quant.runtimes import decide
    info = model.info(n)
    live = f is not None and spill.any_nonzero(f)
    out = {}
    w = wm = rows = None
    sampled = not rows_sampled         # rows drawn (or not to be drawn) already
    by_applied: dict = {}      # a runtime's fallbacks map several candidates to one scheme
    for s in schemes:
        applied = decide(info, s, runtime).applied
        if applied == KEEP or not live:
            out[(n, s)] = 0.0
        elif applied in by_applied:
            out[(n, s)] = by_applied[applied]
        else:
            if w is None and not streaming.dequantized_in_chunks(info, applied):
                wm = model.read_matrix(n)      # read (and widened) once for every scheme
                w = np.ascontiguousarray(wm.reshape(info.shape), np.float32)
                if not sampled:
                    rows, sampled = _error_rows(f, wm), True
            elif w is None and not sampled and _row_local(applied, info.matrix_shape):
                rows, sampled = _error_rows_chunked(model, n, f), True   # never whole
            out[(n, s)] = by_applied[applied] = _fisher_error(
                model, n, info, applied, f, w, wm, rows, count, dequantized)
    return out


def _fisher_items(model) -> list[str]:
    return [n for n in model.tensors if model.info(n).ndim >= 2 and model.info(n).is_float]


def fisher_errors(model, schemes, diag: dict, count: int, runtime: str = "any",
                  rows_sampled: bool = True, early=None):
    """Job: {(name, scheme): 1/2 sum_ij F_ij dW_ij^2 / count} (see `fisher_diagonals`); tensors
    the network does not read (no gradient) get 0, like the ``output`` measure. A tensor the
    streaming path chunks (`workbench.quant.streaming.streamed`) is quantized, and its F read (a
    memory-mapped array for a large model), a row chunk at a time. With `rows_sampled`, a tall
    tensor's errors under row-local schemes come from a proportional sample of its rows
    (`_error_rows`). `early` (an `EarlyFisherErrors` fed during the pass): the tensors it
    measured already are taken from it (all of them awaited first, so the kernels never run
    on two threads at once)."""
    items = _fisher_items(model)
    done: dict = {}
    for n, fut in (early.pending() if early is not None else []):
        yield Progress(len(done), len(items), f"sensitivity {len(done) + 1}/{len(items)} {n} "
                                              "(measured during the pass)")
        done[n] = fut.result()
    out = {}
    k = len(done)
    for n in items:
        if n in done:
            out.update(done[n])
            continue
        yield Progress(k, len(items), f"sensitivity {k + 1}/{len(items)} {n}")
        k += 1
        out.update(tensor_fisher_errors(model, n, schemes, diag.get(n), count, runtime,
                                        rows_sampled))
    yield Progress(len(items), len(items), "done")
    return out


class EarlyFisherErrors:
    """Fisher errors measured on a worker thread while the output-gradient pass goes on: the
    pass (`runner_measures.fisher_pass`'s `on_final`) hands over each block's parameters as
    soon as their sums are final, and the tensors they alone make up are quantized and
    measured at once, while torch runs the blocks below. Tensors made of several parameters
    (a tied embedding / head table) wait for `fisher_errors`. The kernels release the GIL;
    the pass is torch's. `close()` drops what has not started (Ctrl-C)."""

    def __init__(self, model, schemes, runtime: str = "any", rows_sampled: bool = True):
        from concurrent.futures import ThreadPoolExecutor
        self.model, self.schemes, self.runtime = model, list(schemes), runtime
        self.rows_sampled = rows_sampled
        self.items = set(_fisher_items(model))
        self.futures: dict = {}
        self._sources: dict | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fisher-errors")

    def __call__(self, runner, pnames, acc, count) -> None:
        from workbench.running.runner_measures import by_tensor
        if self._sources is None:                    # tensor -> the parameters it feeds
            self._sources = {}
            for pn in runner.all_params():
                try:
                    srcs = runner._source(pn)
                except KeyError:
                    continue
                for n in srcs:
                    self._sources.setdefault(n, set()).add(pn)
        for pn in pnames:
            if pn not in acc:
                continue
            ready = by_tensor(runner, self.model, {pn: acc[pn]})
            for n, f in ready.items():
                if n in self.futures or n not in self.items or self._sources.get(n) != {pn}:
                    continue
                self.futures[n] = self._pool.submit(
                    tensor_fisher_errors, self.model, n, self.schemes, f, count,
                    self.runtime, self.rows_sampled)

    def pending(self) -> list:
        return list(self.futures.items())

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

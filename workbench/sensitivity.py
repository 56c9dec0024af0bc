"""Per-tensor, per-scheme sensitivity: four measures, one table the CLI, GUI and allocator share.

* ``weight``: squared reconstruction error (evaluate's sse).
* ``activation``: sum_j E[x_j^2] * ||dW[:, j]||^2 with E[x_j^2] from calibration (or an imatrix),
  the quantity llama.cpp's imatrix weights the K-quant search with. Embedding tables (whose input
  is a one-hot token / position / type) are weighted by how often each row is used in the
  calibration samples: sum_t p(t) * ||dW[t, :]||^2, the same per-token output error.
* ``fisher``: 1/2 sum_ij F_ij * dW_ij^2 with F the diagonal of the output measure's Fisher
  information per weight, estimated from one calibration pass with random probes (see
  `fisher_diagonals`): the activation-weighted error with each weight also weighted by how much
  a change of its output reaches the model's output (E[g_i^2 x_j^2], g the gradient arriving at
  the layer's output). Its value estimates the ``output`` measure (second order) without running
  the model once per tensor and scheme.
* ``output``: the measured change of the model's outputs with only that tensor quantized (all
  others original): mean KL divergence of next-token distributions (causal LM, nats per token) or
  mean 1 - cosine of the mean-pooled sentence embeddings (encoders), over the calibration samples.
  Cached on disk by (model file signature, calibration signature, tensor, applied scheme) under
  ``$XDG_CACHE_HOME/quant-workbench/output-sensitivity``.

Mixture-of-experts (docs/moe.md): routers are not a choice (they stay in float unless pinned);
with target ``llama.cpp`` one projection's experts of a layer are one decision (llama.cpp stores
them as one merged tensor of one type: `SensitivityTable.groups`), with ``vllm`` every expert of a
layer (vLLM's FusedMoE quantizes them as one layer); and where the measure does
not already see the routing (``weight`` with --calib, ``activation``), each expert's value is
weighted by the fraction of calibration tokens the router sends to it (`expert_usage`), so an
expert every token reaches counts like a dense layer and a rarely picked one little.

Every value is for the scheme the runtime applies (workbench.runtimes.decide: a scheme whose
block does not divide a tensor's rows falls back), so values and bytes describe the same tensor.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import WorkbenchError, one_line
from .plan import KEEP
from .progress import Progress, run as run_job

MEASURES = ("weight", "activation", "fisher", "output")


# ---- activation statistics -------------------------------------------------------------------
def second_moments(model, calib=None, imatrix=None, samples=None):
    """Job: {workbench name: E[x_j^2]} from calibration inputs or an imatrix file."""
    if imatrix:
        from .export.llama_tensor_types import detect_family, llama_cpp_name
        from .imatrix import check_imatrix_for, read_imatrix
        im = read_imatrix(imatrix)
        fam = detect_family(model)
        out = {}
        from .catalog import expert_index
        for n in model.tensors:
            g = llama_cpp_name(n, fam)
            if g in im:
                v = im[g]
                e = expert_index(n)
                info = model.info(n)
                if e is not None and info.ndim == 2 and v.size > info.cols \
                        and v.size % info.cols == 0:
                    # a merged llama.cpp expert tensor (blk.N.ffn_up_exps): one row per expert
                    if e >= v.size // info.cols:
                        raise WorkbenchError(f"imatrix has {v.size // info.cols} experts for "
                                             f"{g}, not expert {e}", path=str(imatrix),
                                             tensor=n)
                    v = v[e * info.cols:(e + 1) * info.cols]
                check_imatrix_for(model, imatrix, n, v)
                out[n] = v
        yield Progress(1, 1, "imatrix read")
        return out
    from .imatrix import collect
    stats, _, _ = yield from collect(model, calib, samples)
    return {n: s2 / max(c, 1) for n, (s2, c) in stats.items()}


def embedding_usage(model, calib=None, samples=None, max_len: int = 128):
    """Job: {workbench name: p(row)} for the runnable model's embedding tables (token, position,
    token type) from the calibration samples: how often each row is looked up, per token."""
    import torch
    from .calibration import calibration_samples
    from .runner import get_runner
    runner = get_runner(model)
    data = yield from calibration_samples(model, calib, samples, max_len)
    n_tok = sum(len(s) for s in data)
    out = {}
    for n, slot in runner.slots.items():
        mod, attr = runner._owner[slot.param]
        if not isinstance(mod, torch.nn.Embedding) or runner.block_of(n) != "pre":
            continue
        rows = int(mod.num_embeddings)
        hf = slot.param.lower()
        cnt = np.zeros(rows)
        if "position" in hf or ".wpe." in hf:
            off = int(runner.cfg.get("pad_token_id") or 0) + 1 \
                if runner.cfg.get("model_type") in ("roberta", "xlm-roberta") else 0
            for s in data:
                idx = np.arange(len(s)) + off
                np.add.at(cnt, idx[idx < rows], 1.0)
        elif "token_type" in hf:
            cnt[0] = n_tok
        else:
            for s in data:
                np.add.at(cnt, s[s < rows], 1.0)
        out[n] = cnt / max(n_tok, 1)
    return out


def activation_error(model, name: str, scheme: str, ex2: np.ndarray, rows: bool = False) -> float:
    """sum_j ex2[j] * ||dW[:, j]||^2 (columns: a Linear's inputs); `rows`: sum_t ex2[t] *
    ||dW[t, :]||^2 (an embedding table's rows)."""
    from .streaming import dequantized_rows
    row_sq, col_sq = [], None
    for _r0, w, wq in dequantized_rows(model, name, scheme):   # row chunks for big tensors
        dw = (wq - w).astype(np.float64)
        dw = dw.reshape(dw.shape[0], -1)
        sq = dw ** 2
        row_sq.append(sq.sum(1))
        col_sq = sq.sum(0) if col_sq is None else col_sq + sq.sum(0)
    row_sq = np.concatenate(row_sq)
    if rows:
        return float(row_sq @ ex2)
    if len(col_sq) != len(ex2) and len(row_sq) == len(ex2):   # GPT-2 Conv1D stores (in, out)
        return float(row_sq @ ex2)
    return float(col_sq @ ex2)


def activation_errors(model, schemes, moments: dict, usage: dict | None = None,
                      runtime: str = "any", executor=None):
    """Job: {(name, scheme): activation-weighted error} for the tensors with moments (and the
    embedding tables in `usage`). Values are for the scheme `runtime` applies. `executor`
    (workbench.cluster): one task per tensor on its workers."""
    from .runtimes import decide
    out = {}
    usage = usage or {}
    items = [n for n in model.tensors if n in moments or n in usage]
    if executor is not None:
        from .cluster import is_plain
        if is_plain(model):
            return (yield from _activation_errors_cluster(executor, model, schemes, moments,
                                                          usage, runtime, items))
    for i, n in enumerate(items):
        yield Progress(i, len(items), f"sensitivity {i + 1}/{len(items)} {n}")
        info = model.info(n)
        for s in schemes:
            applied = decide(info, s, runtime).applied
            if applied == KEEP:
                out[(n, s)] = 0.0
            elif n in moments:
                out[(n, s)] = activation_error(model, n, applied, moments[n])
            else:
                out[(n, s)] = activation_error(model, n, applied, usage[n], rows=True)
    yield Progress(len(items), len(items), "done")
    return out


def _activation_errors_cluster(executor, model, schemes, moments, usage, runtime, items):
    from .cluster import activation_task, signature
    from .runtimes import decide
    sig = signature(model)
    tasks, plans = [], []
    for n in items:
        info = model.info(n)
        applied = {s: decide(info, s, runtime).applied for s in schemes}
        todo = list(dict.fromkeys(a for a in applied.values() if a != KEEP))
        plans.append((n, applied, todo))
        if n in moments:
            tasks.append((sig, n, todo, moments[n], False))
        else:
            tasks.append((sig, n, todo, usage[n], True))
    weights = [max(model.info(n).numel, 1) * max(len(t), 1) for n, _a, t in plans]
    got = yield from executor.sweep(activation_task, tasks, "sensitivity", weights)
    out = {}
    for (n, applied, todo), vals in zip(plans, got):
        by = dict(zip(todo, vals))
        for s in schemes:
            out[(n, s)] = 0.0 if applied[s] == KEEP else by[applied[s]]
    return out


# ---- output-gradient-weighted (Fisher) error ----------------------------------------------------
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
    from .calibration import calibration_samples
    from .progress import subjob
    from .runner import runner_job
    from .runner_measures import by_tensor, fisher_pass
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


#: rows of a tensor whose fisher errors are measured on every row; a taller tensor's errors
#: under a scheme that quantizes each row on its own are estimated from a proportional sample
#: of ERROR_ROW_FRACTION of its rows (`_error_rows`)
ERROR_ROWS_MIN = 1024
ERROR_ROW_FRACTION = 4


def _error_rows(f, wm):
    """(row indices, F of those rows times their Horvitz-Thompson weights, the rows' weights)
    for a tensor taller than ERROR_ROWS_MIN, else None. Rows are drawn with probability
    proportional to sum_j F_ij W_ij^2 (a row's share of the error: a scheme's step in a row
    scales with the row's weights), the same rows for every scheme, so the ratio of two schemes'
    errors, which decides the allocation, keeps the whole tensor's to a fraction of a percent
    (docs/methods.md, "Fisher errors from sampled rows")."""
    from .estimate import proportional_rows
    if wm.ndim != 2 or wm.shape[0] <= ERROR_ROWS_MIN:
        return None
    fm = np.asarray(f, np.float32).reshape(wm.shape)
    score = np.einsum("ij,ij,ij->i", fm, wm, wm, dtype=np.float64)
    limit = max(ERROR_ROWS_MIN // 2, wm.shape[0] // ERROR_ROW_FRACTION)
    idx, hw = proportional_rows(score, limit)
    fs = np.ascontiguousarray(fm[idx] * hw[:, None].astype(np.float32))
    ws = np.ascontiguousarray(wm[idx], np.float32)
    return idx, fs, ws


def _row_local(applied: str, shape) -> bool:
    """Whether `applied` quantizes each row of a matrix of `shape` on its own and takes the
    shape as it is (no fallback), so that a subset of the rows quantizes as inside the whole."""
    from .schemes import get_scheme
    if applied == KEEP:
        return False
    sch = get_scheme(applied)
    return bool(sch.row_local) and not sch.ineligible_reason(tuple(shape))


def _dequantized_rows(ws, applied: str, name: str):
    from .accel import dequantize
    from .evaluate import quantize
    return dequantize(quantize(ws, applied, tensor=name)).reshape(ws.shape)


def _fisher_error(model, n, info, applied, f, w, wm, rows, count, dequantized) -> float:
    """1/2 sum_ij F_ij dW_ij^2 / count of tensor `n` under `applied` (see `fisher_errors`)."""
    from . import streaming
    from .pages import release
    if w is None:                    # streamed: a row chunk at a time, F read alongside
        tot = 0.0
        for r0, w0, dq in streaming.dequantized_rows(model, n, applied):
            fc = f.reshape(-1, w0.shape[1])[r0:r0 + w0.shape[0]]
            tot += _weighted_sq_err(fc, w0, dq)
            release(fc)
        release(f)
        return 0.5 * tot / max(count, 1)
    if rows is not None and _row_local(applied, wm.shape):
        _idx, fs, ws = rows
        return 0.5 * _weighted_sq_err(fs, ws, _dequantized_rows(ws, applied, n)) / max(count, 1)
    dq = dequantized(model, n, applied, matrix=wm).reshape(info.shape)
    val = 0.5 * _weighted_sq_err(f, w, dq) / max(count, 1)
    release(f)      # a mapped F (a large model's): its pages leave the resident set
    return val


def predicted_unit(model, measure: str) -> str:
    """What a table's totals (the allocator's objective, frontier's "predicted") are in:
    ``kl`` (mean KL divergence of the next-token distributions, nats per token: the fisher and
    output measures on a causal LM; `check`'s ``kl_mean`` measures the same), ``1-cosine``
    (the same measures on an encoder: mean 1 - cosine of the pooled embeddings, `check`'s
    1 - ``cosine_mean``), else ``sensitivity`` (weight / activation: no output units)."""
    if measure not in ("fisher", "output"):
        return "sensitivity"
    try:
        from .runner import model_kind, read_config
        kind = model_kind(read_config(model))
    except Exception:                                # not runnable: no output units
        return "sensitivity"
    return "1-cosine" if kind == "encoder" else "kl"


def tensor_fisher_errors(model, n, schemes, f, count: int, runtime: str = "any",
                         rows_sampled: bool = True) -> dict:
    """{(n, scheme): 1/2 sum_ij F_ij dW_ij^2 / count} for tensor `n` and its F `f` (None: the
    network does not read it; 0 for every scheme). See `fisher_errors`."""
    from . import spill, streaming
    from .runner import dequantized
    from .runtimes import decide
    info = model.info(n)
    live = f is not None and spill.any_nonzero(f)
    out = {}
    w = wm = rows = None
    by_applied: dict = {}      # a runtime's fallbacks map several candidates to one scheme
    for s in schemes:
        applied = decide(info, s, runtime).applied
        if applied == KEEP or not live:
            out[(n, s)] = 0.0
        elif applied in by_applied:
            out[(n, s)] = by_applied[applied]
        else:
            if w is None and not streaming.streamed(info, applied):
                wm = model.read_matrix(n)      # read (and widened) once for every scheme
                w = np.ascontiguousarray(wm.reshape(info.shape), np.float32)
                rows = _error_rows(f, wm) if rows_sampled else None
            out[(n, s)] = by_applied[applied] = _fisher_error(
                model, n, info, applied, f, w, wm, rows, count, dequantized)
    return out


def _fisher_items(model) -> list[str]:
    return [n for n in model.tensors if model.info(n).ndim >= 2 and model.info(n).is_float]


def fisher_errors(model, schemes, diag: dict, count: int, runtime: str = "any",
                  rows_sampled: bool = True, early=None):
    """Job: {(name, scheme): 1/2 sum_ij F_ij dW_ij^2 / count} (see `fisher_diagonals`); tensors
    the network does not read (no gradient) get 0, like the ``output`` measure. A tensor the
    streaming path chunks (`workbench.streaming.streamed`) is quantized, and its F read (a
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
        from .runner_measures import by_tensor
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


# ---- measured output change -------------------------------------------------------------------
def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "quant-workbench" \
        / "output-sensitivity"


def model_signature(model) -> list:
    from .stats import file_signature
    files = sorted({getattr(model.info(n), "file", "") or str(model.path) for n in model.tensors})
    return [str(Path(model.path).resolve())] + [[f, file_signature(f)] for f in files]


def _cache_file(model, calib, samples, max_len) -> Path:
    from .calibration import DEFAULT_CALIB
    from .stats import file_signature
    c = str(Path(calib or DEFAULT_CALIB).resolve())
    key = json.dumps([model_signature(model), c, file_signature(c), samples, max_len, 1])
    return cache_dir() / (hashlib.sha1(key.encode()).hexdigest() + ".json")


def _read_cache(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return {k: float(v) for k, v in data.get("values", {}).items()}
    except (OSError, ValueError, AttributeError, TypeError):
        return {}


def _write_cache(path: Path, values: dict) -> None:
    from .atomic import write_text_atomic
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps({"version": 1, "values": values}))
    except OSError:
        pass   # a cache that cannot be written only costs time


def output_measure(kind: str, base, quant) -> float:
    """Mean KL(base || quant) per token (causal LM) or mean 1 - cosine per sample (encoder)."""
    if kind == "encoder":
        b = np.asarray(base, dtype=np.float64)
        q = np.asarray(quant, dtype=np.float64)
        nb = np.linalg.norm(b, axis=1)
        nq = np.linalg.norm(q, axis=1)
        cos = (b * q).sum(1) / np.maximum(nb * nq, 1e-300)
        return float(np.mean(1.0 - cos))
    tot, cnt = 0.0, 0
    for lb, lq in zip(base, quant):
        if len(lb) == 0:
            continue
        pb = np.exp(lb.astype(np.float64))
        tot += float((pb * (lb.astype(np.float64) - lq)).sum())
        cnt += len(lb)
    return tot / max(cnt, 1)


def output_errors_job(model, schemes, calib=None, samples=None, names=None, runtime: str = "any",
                      max_len: int = 128, batch_size: int = 32, use_cache: bool = True):
    """Job: {(name, scheme): measured output change} (see the module doc)."""
    from .calibration import calibration_samples
    from .progress import subjob
    from .runner import dequantized, runner_job
    from .runner_measures import output_pass
    from .runtimes import decide
    runner = yield from runner_job(model)
    data = yield from subjob(calibration_samples(model, calib, samples, max_len), 0, 2, 100)
    names = [n for n in (names if names is not None else model.tensors)
             if model.info(n).ndim >= 2 and model.info(n).is_float]
    cpath = _cache_file(model, calib, samples, max_len)
    cached = _read_cache(cpath) if use_cache else {}
    todo = {}
    out = {}
    for n in names:
        info = model.info(n)
        for s in schemes:
            applied = decide(info, s, runtime).applied
            if applied == KEEP or runner.block_of(n) is None:
                out[(n, s)] = 0.0    # unchanged, or not read by the network's forward pass
                continue
            k = f"{n}|{applied}"
            if k in cached:
                out[(n, s)] = cached[k]
            else:
                todo.setdefault(k, (n, applied, []))[2].append(s)
    if not todo:
        yield Progress(100, 100, "output sensitivity (cached)")
        return out

    def only(n, applied):
        def ov(m):
            return dequantized(model, n, applied) if m == n else None
        ov.changes = lambda m: m == n
        return ov

    items = [(k, n, only(n, applied)) for k, (n, applied, _) in todo.items()]
    data = sorted(data, key=len)          # less padding per batch; the means do not change
    got = yield from subjob(output_pass(runner, data, items, batch_size), 2, 100, 100)
    for k, (n, applied, ss) in todo.items():
        cached[k] = got[k]
        for s in ss:
            out[(n, s)] = got[k]
    if use_cache:
        _write_cache(cpath, cached)
    yield Progress(100, 100, "done")
    return out


def output_errors(model, schemes, calib=None, samples=None, names=None, progress=None,
                  cancel=None, runtime: str = "any") -> dict:
    """{(name, scheme): float}: mean KL (causal LM, nats per token) or 1 - cosine (encoders) of
    the model's outputs with only that tensor quantized, over the calibration samples (default:
    resources/calibration.txt). `progress(Progress)`, `cancel() -> bool`."""
    return run_job(output_errors_job(model, schemes, calib, samples, names, runtime),
                   progress, cancel)


def spearman(a, b) -> float:
    """Spearman rank correlation (average ranks for ties)."""
    def ranks(x):
        x = np.asarray(x, dtype=np.float64)
        o = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[o] = np.arange(len(x), dtype=np.float64)
        for v in np.unique(x):
            m = x == v
            if m.sum() > 1:
                r[m] = r[m].mean()
        return r
    ra, rb = ranks(a), ranks(b)
    ra -= ra.mean()
    rb -= rb.mean()
    den = np.sqrt((ra ** 2).sum() * (rb ** 2).sum())
    return float((ra * rb).sum() / den) if den > 0 else float("nan")


def rank_agreement(table, reference, scheme: str, names=None) -> float:
    """Spearman correlation over tensors of `table`'s values against `reference`'s (e.g. the
    weight or activation measure against the measured output change) for one scheme; tensors
    whose reference value is 0 up to rounding (not read by the network's forward pass, e.g.
    BERT's pooler for mean-pooled embeddings) are left out."""
    names = [n for n in (names or table.names) if (n, scheme) in reference.values
             and (n, scheme) in table.values]
    top = max([abs(reference.values[(n, scheme)]) for n in names] + [0.0])
    names = [n for n in names if abs(reference.values[(n, scheme)]) > 1e-9 * top]
    return spearman([table.values[(n, scheme)] for n in names],
                    [reference.values[(n, scheme)] for n in names])


def best_measure(model, calib=None, imatrix=None) -> tuple[str, str]:
    """(measure, why): the best sensitivity measure the inputs allow. fisher (an estimate of
    the output change, rank correlation 0.99 with it on MiniLM) when the model is runnable: a
    config.json of a supported architecture, the [model] extra installed and calibration
    inputs that tokenize; activation with an imatrix; weight otherwise."""
    if imatrix:
        return "activation", "an imatrix was given"
    try:
        from .calibration import calibration_samples
        from .runner import _import_transformers, model_kind, read_config
        model_kind(read_config(model))
        _import_transformers()
        run_job(calibration_samples(model, calib, 1))
    except WorkbenchError as exc:
        return "weight", f"the model is not runnable: {one_line(str(exc))}"
    return "fisher", "the model is runnable"


def _sizes(model, runtime: str):
    """(runtime, gguf names or None, decide) shared by the size-only helpers below."""
    from .runtimes import get_runtime
    rt = get_runtime(runtime)
    gnames = None
    if rt.name == "llama.cpp":
        from .llama_names import gguf_names
        try:
            gnames = gguf_names(model)
        except WorkbenchError:
            gnames = None
    return rt, gnames


def _bytes_as(info, d) -> int:
    from .schemes import get_scheme
    return int(info.nbytes if d.applied == KEEP else get_scheme(d.applied).nbytes(tuple(info.shape)))


def size_floor(model, schemes, runtime: str = "any", pins: dict | None = None) -> tuple[int, int]:
    """(bytes of the smallest plan the candidates allow, parameters), from shapes alone (nothing
    is quantized or run), counted as `build_table` and `evaluate` count them: lets `allocate`
    refuse an impossible budget before it measures anything."""
    from .runtimes import decide
    rt, gnames = _sizes(model, runtime)
    pins = dict(pins or {})
    total, params = 0, 0
    for n in model.tensors:
        info = model.info(n)
        params += info.numel
        keep = _bytes_as(info, decide(info, KEEP, rt))
        if n in pins:
            total += _bytes_as(info, decide(info, pins[n], rt, explicit=True,
                                            gguf_name=gnames.get(n) if gnames else None))
            continue
        if not (info.ndim >= 2 and info.is_float):
            total += keep
            continue
        best = keep
        for sch in schemes:
            d = decide(info, sch, rt, explicit=True, gguf_name=gnames.get(n) if gnames else None)
            best = min(best, _bytes_as(info, d))
        total += best
    return total, params


def uniform_sizes(model, runtime: str = "any", exclude=()) -> dict[str, int]:
    """Bytes of the uniform plan (every float matrix at one scheme) of each scheme `runtime`
    can run, except `exclude`, smallest first (sizes only)."""
    from .runtimes import candidate_schemes, decide
    rt, gnames = _sizes(model, runtime)
    out = {}
    for sch in candidate_schemes(rt.name):
        if sch in exclude:
            continue
        total = 0
        for n in model.tensors:
            info = model.info(n)
            if info.ndim >= 2 and info.is_float:
                d = decide(info, sch, rt, explicit=True,
                           gguf_name=gnames.get(n) if gnames else None)
                total += min(_bytes_as(info, d), info.nbytes)
            else:
                total += _bytes_as(info, decide(info, KEEP, rt))
        out[sch] = int(total)
    return dict(sorted(out.items(), key=lambda kv: kv[1]))


def below_smallest_message(model, budget_bytes: int, cheapest: int, params: int, schemes,
                           runtime: str) -> str:
    """The refusal of a budget below the smallest plan: that plan's size, and the schemes the
    target runs (not among the candidates) whose uniform plan would fit the budget."""
    p = max(params, 1)
    msg = (f"budget {budget_bytes:,d} bytes ({8.0 * budget_bytes / p:.3f} bits/weight) is below "
           f"the smallest plan the candidates allow, {cheapest:,d} bytes "
           f"({8.0 * cheapest / p:.3f} bits/weight, every tensor at its cheapest of "
           f"{', '.join(schemes)})")
    sizes = uniform_sizes(model, runtime, exclude=schemes) if model is not None else {}
    reach = [f"{s} ({8.0 * b / p:.3f})" for s, b in sizes.items() if b <= budget_bytes]
    if reach:
        return msg + "; candidates that reach the budget as a uniform plan: " + ", ".join(reach)
    return msg + f"; no scheme {runtime} runs reaches it: raise the budget"


# ---- the table --------------------------------------------------------------------------------
@dataclass
class SensitivityTable:
    """Per tensor x scheme: the measure and the bytes `evaluate` counts for `runtime`."""
    model_path: str
    measure: str
    runtime: str
    schemes: list[str]
    names: list[str]                                   # tensors with a choice
    values: dict = field(default_factory=dict)         # (name, scheme) -> float
    bytes: dict = field(default_factory=dict)          # (name, scheme) -> int
    applied: dict = field(default_factory=dict)        # (name, scheme) -> applied scheme
    params: int = 0                                    # every tensor's params (evaluate's)
    fixed_bytes: int = 0                               # bytes of the tensors without a choice
    fixed_names: list[str] = field(default_factory=list)
    #: tensors the runtime fuses into one layer (vLLM's q/k/v, gate/up): one scheme per group
    groups: list = field(default_factory=list)
    #: {expert tensor: fraction of calibration tokens routed to it} the values were weighted by
    usage: dict = field(default_factory=dict)
    #: {(name, scheme): method} where a method other than rtn gave the value
    #: (workbench.allocate_methods; absent pairs are rtn)
    methods: dict = field(default_factory=dict)

    def value(self, name: str, scheme: str) -> float:
        return self.values[(name, scheme)]

    def bytes_of(self, assignment: dict[str, str]) -> int:
        """Total bytes of a plan assigning `assignment` (every tensor in `names`)."""
        return self.fixed_bytes + sum(self.bytes[(n, assignment[n])] for n in self.names)

    def bits_per_weight(self, assignment: dict[str, str]) -> float:
        return 8.0 * self.bytes_of(assignment) / self.params if self.params else 0.0

    def predicted(self, assignment: dict[str, str]) -> float:
        """Total sensitivity of an assignment (the allocator's objective)."""
        return float(sum(self.values[(n, assignment[n])] for n in self.names))

    def budget_bytes(self, budget_bytes: int | None = None, budget_bpw: float | None = None) -> int:
        if budget_bytes is None:
            if budget_bpw is None:
                raise WorkbenchError("give --budget-bpw or --budget-bytes")
            budget_bytes = int(np.floor(budget_bpw * self.params / 8.0 + 1e-9))
        return int(budget_bytes)

    def plan_for(self, assignment: dict[str, str]):
        from .plan import Plan
        default = self.schemes[0] if self.schemes else KEEP
        return Plan(default=default).with_assignments(
            {n: assignment[n] for n in self.names})

    def solve(self, budget_bytes: int, pins: dict[str, str] | None = None):
        """(Plan, allocate.Solution): least total sensitivity within `budget_bytes` (the plan's
        totals.bytes as evaluate counts them), pinned tensors kept."""
        from .allocate import solve_detailed
        pins = dict(pins or {})
        for p, s in pins.items():
            if p not in self.names and p not in self.fixed_names:
                raise WorkbenchError(f"pinned tensor {p!r} is not in the model",
                                     path=self.model_path)
            if p in self.names and (p, s) not in self.bytes:
                raise WorkbenchError(f"pinned scheme {s} was not measured for {p}")
        # items: single tensors, or a fused group whose members take one scheme together
        grouped = {n: g for g in self.groups for n in g if all(m in self.names for m in g)}
        items, seen = [], set()
        for n in self.names:
            if n in seen:
                continue
            item = grouped.get(n, [n])
            seen.update(item)
            items.append(item)
        costs, errs, opts = [], [], []
        for item in items:
            pinned = {pins[m] for m in item if m in pins}
            if len(pinned) > 1:
                raise WorkbenchError(f"pins differ within a fused group the {self.runtime} "
                                     f"runtime needs one scheme for: {', '.join(item)}",
                                     path=self.model_path)
            cands = sorted(pinned) if pinned else [s for s in self.schemes
                                                   if all((m, s) in self.bytes for m in item)]
            opts.append(cands)
            costs.append([sum(int(self.bytes[(m, s)]) for m in item) for s in cands])
            errs.append([sum(float(self.values[(m, s)]) for m in item) for s in cands])
        try:
            sol = solve_detailed(costs, errs, budget_bytes - self.fixed_bytes)
        except WorkbenchError as exc:
            if "budget" not in str(exc):
                raise
            cheapest = self.fixed_bytes + sum(min(c) for c in costs)
            raise WorkbenchError(self._below_smallest(budget_bytes, cheapest),
                                 path=self.model_path) from exc
        assignment = {m: o[k] for item, o, k in zip(items, opts, sol.choice) for m in item}
        return self.plan_for(assignment), sol

    def _below_smallest(self, budget_bytes: int, cheapest: int) -> str:
        from .loaders import open_model
        try:
            model = open_model(self.model_path)
        except WorkbenchError:
            model = None
        return below_smallest_message(model, budget_bytes, cheapest, self.params,
                                      self.schemes, self.runtime)

    def assignment_of(self, plan, model) -> dict[str, str]:
        """The table's view of a plan: the scheme it requests per tensor with a choice."""
        out = {}
        for n in self.names:
            info = model.info(n)
            out[n] = plan.scheme_and_source(n, info.ndim, info.is_float)[0]
        return out

    def rows(self, scheme: str | None = None) -> list[str]:
        """Tensor names, most sensitive first (by `scheme`'s value, else the mean over schemes)."""
        def key(n):
            if scheme is not None:
                return self.values[(n, scheme)]
            return float(np.mean([self.values[(n, s)] for s in self.schemes]))
        return sorted(self.names, key=key, reverse=True)

    def to_dict(self) -> dict:
        return {"model": self.model_path, "measure": self.measure, "runtime": self.runtime,
                "schemes": list(self.schemes), "params": self.params,
                "fixed_bytes": self.fixed_bytes,
                "tensors": {n: {s: {"value": self.values[(n, s)], "bytes": self.bytes[(n, s)],
                                    "applied": self.applied[(n, s)]}
                                for s in self.schemes if (n, s) in self.values}
                            for n in self.rows()},
                **({"groups": [list(g) for g in self.groups]} if self.groups else {}),
                **({"expert_usage": {n: (v.tolist() if isinstance(v, np.ndarray) else v)
                                     for n, v in self.usage.items()}} if self.usage else {})}


def merged_expert_errors(model, name: str, scheme: str) -> np.ndarray:
    """Squared error per expert of a merged 3-D expert tensor under `scheme` (each expert's
    rows quantized alone: the row-wise schemes give the same bytes as the whole tensor)."""
    from .evaluate import quantize
    from .moe import expert_slices
    from .schemes import get_scheme
    out = []
    sch = get_scheme(scheme)
    for _e, w in expert_slices(model, name):
        if sch.ineligible_reason(w.shape):
            out.append(0.0)
            continue
        q = np.asarray(sch.dequantize(quantize(w, scheme, tensor=name)),
                       dtype=np.float64).reshape(w.shape)
        out.append(float(((q - w) ** 2).sum()))
    return np.array(out)


def build_table(model, schemes, errors: dict | None = None, runtime: str = "any",
                pins: dict | None = None, measure: str = "weight", missing_scale: float = 1.0,
                extra=(), usage: dict | None = None, executor=None):
    """Job: a SensitivityTable from given `errors[(name, scheme)]`; entries missing there (all of
    them when `errors` is None) are evaluate's sse times `missing_scale`. Bytes are
    evaluate_tensor's under `runtime`. `usage`: {expert tensor: routed-token fraction} to weight
    the experts' values by (workbench.moe.expert_usage). Routers are not a choice unless
    pinned; with llama.cpp one projection's experts of a layer form one group (`groups`).
    `executor` (workbench.cluster): every tensor x scheme is measured on its workers first."""
    from .evaluate import DEFAULT_EVAL_CACHE, evaluate_tensor
    from .progress import subjob
    from .runtimes import decide
    rt, gnames = _sizes(model, runtime)
    pins = dict(pins or {})
    for p in pins:
        if p not in model.tensors:
            raise WorkbenchError(f"pinned tensor {p!r} is not in the model", path=model.path)
    names, fixed, fixed_bytes, params = [], [], 0, 0
    values, nbytes, applied = {}, {}, {}
    all_names = list(model.tensors)
    rows = []   # (name, info, choosable, {scheme: decision}, KEEP's decision)
    for n in all_names:
        info = model.info(n)
        g = gnames.get(n) if gnames else None
        cands = list(dict.fromkeys(list(schemes) + list(extra)
                                   + ([pins[n]] if n in pins else [])))
        choosable = (info.ndim >= 2 and info.is_float and info.role != "router") or n in pins
        decs = {}
        if choosable:
            for s in cands:
                decs[s] = decide(info, s, rt, explicit=True, gguf_name=g)
            if all(d.kind in ("kept", "skipped") for d in decs.values()) and n not in pins:
                choosable = False
        rows.append((n, info, choosable, decs, decide(info, KEEP, rt)))
    span = 0
    if executor is not None:
        from .cluster import is_plain, prefetch_evaluations
        if is_plain(model):
            reqs = [(n, KEEP, dk) for n, _i, _c, _d, dk in rows]
            reqs += [(n, s, d) for n, _i, c, decs, _dk in rows if c for s, d in decs.items()]
            span = 95
            yield from subjob(prefetch_evaluations(executor, model, reqs, DEFAULT_EVAL_CACHE,
                                                   "measuring"), 0, span, 100)
    for i, (n, info, choosable, decs, dk) in enumerate(rows):
        yield Progress(span + (100 - span) * i / max(len(rows), 1), 100,
                       f"sizes {i + 1}/{len(rows)} {n}")
        params += info.numel
        if not choosable:
            fixed_bytes += _bytes_as(info, dk)
            fixed.append(n)
            continue
        names.append(n)
        nbytes[(n, KEEP)] = _bytes_as(info, dk)
        values[(n, KEEP)] = 0.0
        applied[(n, KEEP)] = KEEP
        for s, d in decs.items():
            applied[(n, s)] = d.applied
            if errors is not None and (n, s) in errors:
                # the measure gave the value: the bytes follow from the shape (the same count
                # evaluate makes), so the tensor is not quantized a second time here
                nbytes[(n, s)] = _bytes_as(info, d)
                values[(n, s)] = float(errors[(n, s)])
                from_sse = False
            else:
                r = evaluate_tensor(model, n, s, decision=d)
                nbytes[(n, s)] = int(r.bytes)
                values[(n, s)] = float(r.error.sse) * missing_scale
                from_sse = True
            u = (usage or {}).get(n)
            if u is not None and d.applied != KEEP:   # weight by the routed-token fraction
                if not isinstance(u, np.ndarray):
                    values[(n, s)] *= float(u)
                elif from_sse and missing_scale:      # merged: sum_e f_e * sse_e
                    values[(n, s)] = float(merged_expert_errors(model, n, d.applied) @ u) \
                        * missing_scale
                else:
                    values[(n, s)] *= float(np.mean(u))
    yield Progress(100, 100, "sizes")
    from .moe import decision_groups
    from .runtimes import fused_groups
    groups = merge_groups(fused_groups(names, rt.name)
                          + list(decision_groups(model, names, rt.name).values()))
    return SensitivityTable(str(model.path), measure, rt.name, list(schemes), names, values,
                            nbytes, applied, params, fixed_bytes, fixed, groups,
                            dict(usage or {}))


def merge_groups(groups) -> list[list[str]]:
    """Groups that share a tensor joined into one (vLLM's fused gate/up of an expert and
    a runtime's expert group are one decision together), in first-seen order."""
    out: list[list[str]] = []
    for g in groups:
        g = list(dict.fromkeys(g))
        hit = [o for o in out if set(o) & set(g)]
        for o in hit:
            out.remove(o)
            g = list(dict.fromkeys(o + g))
        out.append(g)
    return out


def _has_experts(model) -> bool:
    return any(model.info(n).role == "expert" for n in model.tensors)


def routing_usage(model, calib=None, samples=None):
    """Job: {expert tensor: routed-token fraction} (workbench.moe.find_expert_usage: the
    runner's expert_usage when it has one), or {} when the model cannot run."""
    from .moe import find_expert_usage
    try:
        return (yield from find_expert_usage()(model, calib, samples))
    except WorkbenchError:
        return {}


def sensitivity_table_job(model, schemes, measure: str = "weight", calib=None, imatrix=None,
                          samples=None, runtime: str = "any", pins: dict | None = None,
                          extra=(), expert_weighting: bool | None = None, executor=None):
    """Job: the SensitivityTable for `measure` (see the module doc). Activation measure: tensors
    the statistics do not reach get their weight error times the mean second moment. `extra`:
    schemes measured too (e.g. a recipe's types) that the allocator does not choose from.
    `expert_weighting`: weight experts by how often the router picks them (None: for the
    ``activation`` measure, and ``weight`` when `calib` is given, on a mixture of experts; the
    ``fisher`` and ``output`` measures already see the routing). `executor`
    (workbench.cluster): the per-tensor weight and activation work runs on its workers."""
    from .progress import subjob
    from .schemes import get_scheme
    schemes = [get_scheme(s).name for s in schemes]
    if measure not in MEASURES:
        raise WorkbenchError(f"unknown measure {measure!r} (choose from {', '.join(MEASURES)})")
    extra = [get_scheme(s).name for s in extra]
    cands = list(dict.fromkeys(list(schemes) + extra + list((pins or {}).values())))
    errors, scale = None, 1.0
    if measure == "activation":
        mom = yield from subjob(second_moments(model, calib, imatrix, samples), 0, 30, 100)
        try:
            usage = yield from subjob(embedding_usage(model, calib, samples), 30, 5, 100)
        except WorkbenchError:
            usage = {}   # an imatrix without a runnable model: linear weights only
        errors = yield from subjob(activation_errors(model, cands, mom, usage, runtime,
                                                     executor), 35, 45, 100)
        if mom:
            scale = float(np.mean([np.mean(v) for v in mom.values()]))
    elif measure == "fisher":
        early = EarlyFisherErrors(model, cands, runtime)
        try:
            diag, count = yield from subjob(fisher_diagonals(model, calib, samples,
                                                             early=early), 0, 45, 100)
            errors = yield from subjob(fisher_errors(model, cands, diag, count, runtime,
                                                     early=early), 45, 35, 100)
        finally:
            early.close()
        scale = 0.0
    elif measure == "output":
        errors = yield from subjob(output_errors_job(model, cands, calib, samples,
                                                     runtime=runtime), 0, 80, 100)
        scale = 0.0
    start = 0 if errors is None else 80
    if expert_weighting is None:
        expert_weighting = measure == "activation" or (measure == "weight" and calib is not None)
    usage = {}
    if expert_weighting and not imatrix and _has_experts(model):
        usage = yield from subjob(routing_usage(model, calib, samples), start, 5, 100)
        start += 5
    table = yield from subjob(build_table(model, schemes, errors, runtime, pins, measure, scale,
                                          extra, usage, executor),
                              start, 100 - start, 100)
    return table


def sensitivity_table(model, schemes, measure: str = "weight", calib=None, imatrix=None,
                      samples=None, progress=None, cancel=None, runtime: str = "any",
                      pins: dict | None = None, extra=(), executor=None) -> SensitivityTable:
    """Per tensor x scheme: the measure (weight | activation | output) plus the bytes evaluate
    counts, the one table the CLI, the GUI and the allocator share. `progress(Progress)`,
    `cancel() -> bool` (raises workbench.errors.Cancelled)."""
    return run_job(sensitivity_table_job(model, schemes, measure, calib, imatrix, samples,
                                         runtime, pins, extra, executor=executor),
                   progress, cancel)

"""Schedules the computations the views need, as tasks on the compute thread.

Reacts to the document: on open, statistics and error evaluation of every tensor
(background); on an edit, evaluation of the tensors whose scheme changed (cached results
are applied at once); on selection, the selected tensor's statistics, error, histogram
overlay, quantization grid and throughput (interactive priority). Results are delivered
to the document on the GUI thread.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
from PySide6.QtCore import QObject

from workbench.api.tensors import MIN_ELEMENTS, can_estimate, estimate_tensor
from workbench.api.tensors import DEFAULT_EVAL_CACHE, evaluate_tensor
from workbench.api.plans import KEEP
from workbench.core.progress import Progress
from workbench.api.plans import get_scheme, list_schemes
from workbench.api.tensors import DEFAULT_CACHE, model_stats

from . import analysis, throughput
from .workers import BACKGROUND, FOREGROUND, IDLE, INTERACTIVE


class _one_thread:
    """numba's parallel kernels on the calling thread only, for the block (numba's thread
    count is per calling thread; restored after)."""

    def __enter__(self):
        try:
            import numba
            self.prev = numba.get_num_threads()
            numba.set_num_threads(1)
        except Exception:  # noqa: BLE001 - no numba: the numpy reference runs anyway
            self.prev = None

    def __exit__(self, *exc):
        if self.prev is not None:
            import numba
            numba.set_num_threads(self.prev)


class Matrices:
    """The float32 matrices of the large tensors evaluated last (two at most, 384 MiB in
    all; none of more than 256 MiB), so trying scheme after scheme on one tensor does not
    read and decode it from the file each time (a 4096x4096 matrix: a 64 MiB copy, page
    faults and its release: about a fifth of the exact evaluation). Loader models only (a
    method model's matrix depends on its state). Used on the compute thread; cleared when
    the model changes."""

    ENTRIES = 2
    MAX_TENSOR = 256 << 20
    MAX_TOTAL = 384 << 20

    def __init__(self):
        from collections import OrderedDict
        self._lock = threading.Lock()
        self._data: OrderedDict = OrderedDict()
        self._model = None

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._model = None

    def _eligible(self, model, name) -> bool:
        if getattr(model, "quantize_tensor", None) is not None:
            return False
        info = model.info(name)
        return info.is_float and MIN_ELEMENTS <= info.numel and 4 * info.numel <= self.MAX_TENSOR

    def peek(self, model, name):
        """The cached matrix, or None (never reads)."""
        with self._lock:
            if model is not self._model:
                return None
            w = self._data.get(name)
            if w is not None:
                self._data.move_to_end(name)
            return w

    def get(self, model, name):
        """The matrix (read and kept when eligible), or None when not kept (the caller reads)."""
        w = self.peek(model, name)
        if w is not None or not self._eligible(model, name):
            return w
        w = model.read_matrix(name)
        with self._lock:
            if model is not self._model:
                self._data.clear()
                self._model = model
            self._data[name] = w
            while len(self._data) > self.ENTRIES or (
                    len(self._data) > 1 and sum(a.nbytes for a in self._data.values())
                    > self.MAX_TOTAL):
                self._data.popitem(last=False)
        return w

    def names(self) -> list[str]:
        with self._lock:
            return list(self._data)


@dataclass
class Detail:
    """What the plots of one tensor need beyond its statistics, for one scheme."""
    scheme: str
    deq_counts: np.ndarray | None
    grid: np.ndarray | None


def _stats_of(model, name):
    """Job: statistics of one tensor through the shared cache."""
    hit = DEFAULT_CACHE.get(model, name)
    if hit is not None:
        return hit
    out = yield from model_stats(model, [name], cache=DEFAULT_CACHE)
    return out[name]


class Analyzer(QObject):
    def __init__(self, doc, runner, parent=None):
        super().__init__(parent)
        self.doc = doc
        self.runner = runner
        self._lock = threading.Lock()
        self._queue: list[str] = []
        self._eval_running = False
        self._generation = 0
        self._interactive = None
        self._compare = None
        self._predict = None
        self._predict_for = None
        self.matrices = Matrices()
        self.errors: list[str] = []
        self.on_error = None  # callable(title, message), set by the window
        doc.modelChanged.connect(self._model_changed)
        doc.stateChanged.connect(self._state_changed)
        doc.currentChanged.connect(self._current_changed)

    # ---- start-up -------------------------------------------------------------------------
    def warmup(self, jit: bool = True) -> None:
        """Find the kernel backend; then (lowest priority) compile the kernels ahead of use."""
        self.runner.submit(throughput.backend_name, "kernel backend", BACKGROUND,
                           on_done=self.doc.set_backend, on_error=self._failed("Kernels"))
        if jit:
            first = sorted(set(self.doc.assignment.values())) if self.doc.model is not None \
                else []
            self.runner.submit(lambda: throughput.warmup_job(first),
                               "Compiling kernels (numba, first run)", IDLE,
                               on_error=self._failed("Kernels"))

    # ---- model --------------------------------------------------------------------------
    def _model_changed(self) -> None:
        self._generation += 1
        self.matrices.clear()
        with self._lock:
            self._queue.clear()
        if self._compare is not None:
            self._compare.cancel()
        model = self.doc.model
        if model is None:
            return
        gen = self._generation
        from . import perf
        if perf.FAST:   # the first edit's "never re-typed" check needs them: not on the GUI thread
            from .commands import gguf_names_of
            self.runner.submit(lambda: gguf_names_of(model), "llama.cpp tensor names",
                               BACKGROUND)
        self.runner.submit(lambda: self._all_stats(model, gen), "Computing statistics",
                           BACKGROUND, visible=True, on_error=self._failed("Statistics"))
        self._schedule(list(model.tensors))

    def _all_stats(self, model, gen):
        names = list(model.tensors)
        total = len(names)
        batch = {}
        from workbench.core.progress import subjob
        for done, n in enumerate(names, 1):
            if gen != self._generation:
                return None
            # the tensor's own progress scaled into the whole model's: the work queue counts
            # tensors ("12/272"), the bar moves within a large one
            st = yield from subjob(_stats_of(model, n), done - 1, 1, total)
            batch[n] = st
            yield Progress(done, total, f"statistics: {n}")
            if len(batch) >= 16 or done == total:
                self.runner.post(self._deliver_stats, gen, batch)
                batch = {}
        if batch:
            self.runner.post(self._deliver_stats, gen, batch)
        return None

    def _deliver_stats(self, gen, batch) -> None:
        if gen == self._generation:
            self.doc.add_stats(batch)

    # ---- evaluation ----------------------------------------------------------------------
    def _state_changed(self, changed) -> None:
        model = self.doc.model
        if model is None:
            return
        todo = []
        for n in changed:
            hit = DEFAULT_EVAL_CACHE.get((model.path, n, self.doc.scheme_of(n)))
            if hit is not None:
                self.doc.add_result(hit)
            elif self.doc.result(n) is None:
                todo.append(n)
        self._estimate(todo)    # queued first: the compute thread takes it before the exact
        self._schedule(todo)
        if self.doc.current in changed:
            self._current_changed(self.doc.current)

    def _estimate(self, names) -> None:
        """Large tensors whose scheme changed: a sampled-rows estimate of their error first
        (workbench.planning.estimate, a few ms), so the totals show "≈ SQNR" at once; the exact
        evaluation follows behind it (queued after)."""
        from . import perf
        model, doc = self.doc.model, self.doc
        if not perf.FAST or model is None:
            return
        todo = [(n, doc.scheme_of(n)) for n in names
                if doc.estimate(n) is None and model.info(n).numel >= MIN_ELEMENTS]
        todo = [(n, s) for n, s in todo if can_estimate(model, n, s)]
        if not todo:
            return
        gen = self._generation

        def job():
            for i, (n, s) in enumerate(todo):
                if gen != self._generation:
                    return None
                with _one_thread():   # a few ms of work: the other core stays with the GUI
                    # as the exact evaluation decides; rows from the matrix when it is held
                    e = estimate_tensor(model, n, s, matrix=self.matrices.peek(model, n))
                if e is not None:
                    self.runner.post(self._deliver_estimate, gen, e)
                yield Progress(i + 1, len(todo), f"estimating {n}")
            return None

        self.runner.submit(job, "Estimating error", INTERACTIVE,
                           on_error=lambda _m: None)   # the exact evaluation reports errors

    def _deliver_estimate(self, gen, est) -> None:
        if gen == self._generation:
            self.doc.add_estimate(est)

    def _schedule(self, names) -> None:
        if not names:
            return
        with self._lock:
            known = set(self._queue)
            self._queue.extend(n for n in names if n not in known)
            if self._eval_running:
                return
            self._eval_running = True
        model, gen = self.doc.model, self._generation
        # the totals' SQNR waits for it: ahead of the whole-model sensitivity and check
        self.runner.submit(lambda: self._evaluate_queue(model, gen), "Evaluating error",
                           FOREGROUND, visible=True, on_error=self._eval_failed)

    def _evaluate_queue(self, model, gen):
        done = 0
        while True:
            with self._lock:
                if not self._queue or gen != self._generation:
                    self._eval_running = False
                    return done
                name = self._queue.pop(0)
                left = len(self._queue)
            scheme = self.doc.assignment.get(name, KEEP)
            r = evaluate_tensor(model, name, scheme, matrix=self._matrix(model, name, scheme))
            self.runner.post(self._deliver_result, gen, r)
            done += 1
            yield Progress(done, done + left, f"error: {name}")

    def _matrix(self, model, name, scheme):
        """The held matrix of a large tensor (read once, then kept) when its evaluation is not
        cached already; else None (evaluate_tensor reads it, or needs nothing)."""
        from . import perf
        if not perf.FAST:
            return None
        from workbench.api.plans import decide
        d = decide(model.info(name), scheme, "any")     # evaluate_tensor's cache key
        if d.applied == KEEP or DEFAULT_EVAL_CACHE.get(
                (model.path, name, scheme, d.applied, d.kind)) is not None:
            return None
        return self.matrices.get(model, name)

    def _eval_failed(self, message: str) -> None:
        with self._lock:
            self._eval_running = False
            self._queue.clear()
        self._failed("Evaluation")(message)

    def _deliver_result(self, gen, result) -> None:
        if gen == self._generation:
            self.doc.add_result(result)

    # ---- the selected tensor ---------------------------------------------------------------
    def _current_changed(self, name) -> None:
        if self._interactive is not None:
            self._interactive.cancel()
        model = self.doc.model
        if not name or model is None:
            return
        scheme, gen = self.doc.scheme_of(name), self._generation
        need_stats = name not in self.doc.stats
        need_eval = self.doc.result(name) is None
        need_detail = (name, scheme) not in self.doc.details
        need_gbs = (name, scheme) not in self.doc.throughput
        if not (need_stats or need_eval or need_detail or need_gbs):
            return

        def job():
            from workbench.core.progress import subjob
            st = yield from subjob(_stats_of(model, name), 0, 1, 3)   # steps: stats, error, plots
            if need_stats:
                self.runner.post(self._deliver_stats, gen, {name: st})
            # each step named in the work queue's row (issue 33: "throughput" was not listed)
            if need_eval:
                yield Progress(1, 3, f"error: {name}")
                r = evaluate_tensor(model, name, scheme, matrix=self._matrix(model, name, scheme))
                self.runner.post(self._deliver_result, gen, r)
            if need_detail:
                yield Progress(1, 3, f"histogram overlay and grid: {name}")
                grid = counts = None
                if scheme != KEEP and st.count:
                    counts = analysis.dequantized_histogram(model, name, scheme, st.hist_edges)
                    if counts is not None:
                        grid = analysis.grid_levels(scheme, st.min, st.max)
                self.runner.post(self._deliver_detail, gen, name, scheme,
                                 Detail(scheme, counts, grid))
            if need_gbs:
                yield Progress(2, 3, f"throughput (dequantize GB/s): {name}")
                g = throughput.dequant_gbs(model, name, scheme)
                self.runner.post(self._deliver_gbs, gen, name, scheme, g)
            return None

        self._interactive = self.runner.submit(job, f"Analysing {name}", INTERACTIVE,
                                               on_error=self._failed(name))

    def _deliver_detail(self, gen, name, scheme, detail) -> None:
        if gen == self._generation:
            self.doc.add_detail(name, scheme, detail)

    def _deliver_gbs(self, gen, name, scheme, gbs) -> None:
        if gen == self._generation:
            self.doc.add_throughput(name, scheme, gbs)

    # ---- comparison and throughput of the whole plan ---------------------------------------
    def eligible_schemes(self, name: str) -> list[str]:
        info = self.doc.model.info(name)
        if not info.is_float:
            return [KEEP]
        return [KEEP] + [s for s in list_schemes()
                         if get_scheme(s).ineligible_reason(info.shape) is None]

    def compare(self, name: str, schemes=None):
        """Evaluate (and time) every eligible scheme for one tensor; results arrive one by one."""
        if self._compare is not None:
            self._compare.cancel()
        model, gen = self.doc.model, self._generation
        schemes = list(schemes or self.eligible_schemes(name))

        def job():
            from workbench.api.tensors import is_plain, prefetch_evaluations
            from workbench.core.progress import subjob
            from workbench.api.plans import decide

            from .cluster_setting import executor_of
            todo = [s for s in schemes if self.doc.result_for(name, s) is None]
            executor = executor_of(self.runner) if todo and is_plain(model) else None
            half = 0.0
            if executor is not None:   # every scheme a task of its own on the cluster
                info = model.info(name)
                reqs = [(name, s, decide(info, s, "any")) for s in todo]
                yield from subjob(prefetch_evaluations(executor, model, reqs, DEFAULT_EVAL_CACHE,
                                                       f"comparing {name}", per_scheme=True),
                                  0, len(schemes) / 2, len(schemes))
                half = 0.5   # the rest (the timings, here) fills the other half of the bar
            for i, s in enumerate(schemes):
                if self.doc.result_for(name, s) is None:
                    r = evaluate_tensor(model, name, s)
                    self.runner.post(self._deliver_result, gen, r)
                if (name, s) not in self.doc.throughput:
                    g = throughput.dequant_gbs(model, name, s, repeats=9, budget_s=0.2)
                    self.runner.post(self._deliver_gbs, gen, name, s, g)
                yield Progress(half * len(schemes) + (1 - half) * (i + 1), len(schemes),
                               f"comparing {s}")
            return None

        self._compare = self.runner.submit(job, f"Comparing schemes for {name}", FOREGROUND,
                                           visible=True, on_error=self._failed("Comparison"))
        return self._compare

    def predict(self, name: str, schemes=None):
        """Evaluate the error of `name` under every scheme not evaluated yet (the scheme
        picker's figures; no timing). Results arrive one by one; a new call cancels the last."""
        if self._predict is not None and not self._predict.finished:
            if self._predict_for == name:
                return self._predict
            self._predict.cancel()
        model, gen = self.doc.model, self._generation
        if model is None or name not in model.tensors:
            return None
        todo = [s for s in (schemes or self.eligible_schemes(name))
                if self.doc.result_for(name, s) is None]
        if not todo:
            return None

        def job():
            for i, s in enumerate(todo):
                if self.doc.result_for(name, s) is None:
                    r = evaluate_tensor(model, name, s)
                    self.runner.post(self._deliver_result, gen, r)
                yield Progress(i + 1, len(todo), f"predicting {s}")
            return None

        self._predict_for = name
        self._predict = self.runner.submit(job, f"Predicting errors for {name}", FOREGROUND,
                                           on_error=self._failed("Prediction"))
        return self._predict

    def measure_all(self):
        model, gen = self.doc.model, self._generation
        names = [n for n in self.doc.names() if self.doc.scheme_of(n) != KEEP]

        def job():
            for i, n in enumerate(names):
                s = self.doc.assignment.get(n, KEEP)
                g = throughput.dequant_gbs(model, n, s)
                self.runner.post(self._deliver_gbs, gen, n, s, g)
                yield Progress(i + 1, len(names), f"throughput: {n}")
            return None

        return self.runner.submit(job, "Measuring dequant throughput", FOREGROUND, visible=True,
                                  on_error=self._failed("Throughput"))

    def _failed(self, what: str):
        def report(message: str) -> None:
            self.errors.append(f"{what}: {message}")
            if self.on_error is not None:
                self.on_error(what, message)
        return report

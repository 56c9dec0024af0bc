"""The comparison view's methods (issue 12): one tensor under (scheme, method) pairs, computed
on the compute thread by ``workbench.running.methods_compare`` with the calibration file the app's
end-to-end check uses (``PlanEffects.calib``; the shipped text by default).

Two tasks per request: the calibration pass for the tensor (and its AWQ fold peers), run
``exclusive`` because it drives the shared transformers network (as the check does), then the
pairs one by one (interruptible, cancellable, results streamed). Statistics and results are
cached per (model, calibration file); a result also keys on what its AWQ fold depends on: the
(scheme, method) the plan gives the tensor's fold peers.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from workbench.core.errors import WorkbenchError
from workbench.api.methods import METHOD_NAMES
from workbench.api.methods import applies, evaluate_method, peers_of, tensor_stats
from workbench.core.progress import Progress

from .workers import BACKGROUND, FOREGROUND

#: the methods the view offers beside rtn (all read calibration statistics)
CALIBRATED = tuple(m for m in METHOD_NAMES if m != "rtn")
STATS_KEEP = 24   # tensors whose statistics stay cached (H is in² float64 each)
RUNNABLE_JOB = "Checking that the model can run"


def _quick_verdict(model) -> str | None:
    """The reasons the methods cannot run that need no transformers import: no readable
    config.json, torch or transformers not installed (None: none of these)."""
    try:
        from workbench.api.models import read_config
        read_config(model)
    except WorkbenchError as exc:
        return exc.problem if hasattr(exc, "problem") else str(exc)
    for mod in ("torch", "transformers"):
        if importlib.util.find_spec(mod) is None:
            return f"not runnable: {mod} is not installed (pip install -e \".[model]\")"
    return None


def transformers_ready() -> bool:
    """transformers' model mappings are imported already, and not still being imported on
    another thread (model_kind costs no import and waits for no import lock)."""
    import sys
    mods = [sys.modules.get(m) for m in ("transformers", "transformers.models.auto.modeling_auto")]
    return all(m is not None and not getattr(getattr(m, "__spec__", None), "_initializing", False)
               for m in mods)


def _kind_verdict(model) -> str | None:
    """Why transformers cannot run the model's config (None: it can). Imports transformers."""
    try:
        from workbench.api.models import model_kind, read_config
        model_kind(read_config(model))
    except WorkbenchError as exc:
        return exc.problem if hasattr(exc, "problem") else str(exc)
    return None


class MethodComparer(QObject):
    resultAdded = Signal(str, str, str)     # name, scheme, method
    statsFailed = Signal(str, str)          # name, message
    nonLinear = Signal(str)                 # name: not the input of a Linear layer
    runnableKnown = Signal()                # the model-can-run verdict arrived

    def __init__(self, doc, runner, parent=None):
        super().__init__(parent)
        self.doc = doc
        self.runner = runner
        self.calib_source = None            # callable -> calibration file path (the window's)
        self.results: dict[tuple, object] = {}
        self.stats: dict[tuple, dict] = {}  # (model path, calib) -> {name: LayerStats}
        self.not_linear: set[tuple] = set()  # (model path, calib, name)
        self.failed: dict[tuple, str] = {}  # (model path, calib) -> why the pass failed
        self.task = None
        self._stats_task = None
        self._runnable: tuple | None = None  # (model path, why-not or None)
        self._runnable_task = None
        doc.modelChanged.connect(self._model_changed)

    # ---- what can run ----------------------------------------------------------------------
    def calib(self) -> str:
        path = self.calib_source() if self.calib_source is not None else None
        if not path:
            from workbench.api.models import DEFAULT_CALIB
            path = str(DEFAULT_CALIB)
        return str(path)

    def unavailable(self) -> str | None:
        """Why the methods that need calibration cannot run here (None: they can). Whether
        transformers has a model class for the config is decided on the compute thread (it
        imports transformers and torch: 3-5 s quiet, 25 s on a busy machine, which froze the
        window as a model opened); until then the reason says it is being checked."""
        model = self.doc.model
        if model is None:
            return "no model open"
        if self._runnable is None or self._runnable[0] != model.path:
            why = _quick_verdict(model)
            if why is None and not transformers_ready():
                self._check_runnable(model)
                from .work_queue import waiting_text
                return waiting_text(self.runner, RUNNABLE_JOB, "the check that the model can "
                                    "run") or "checking that the model can run"
            if why is None:
                why = _kind_verdict(model)
            self._runnable = (model.path, why)
        why = self._runnable[1]
        if why:
            return f"the model cannot be run to collect calibration inputs ({why})"
        calib = self.calib()
        if not Path(calib).is_file():
            return f"the calibration file {calib} does not exist (Effects ▸ Calibration File…)"
        failed = self.failed.get((model.path, calib))
        if failed:
            return f"the calibration pass failed: {failed}"
        return None

    def _check_runnable(self, model) -> None:
        """model_kind (the transformers import) as a compute-thread job, once per model; the
        verdict is kept and `runnableKnown` tells the view to re-read it."""
        if self._runnable_task is not None and not self._runnable_task.finished:
            return
        path = model.path

        def done(why) -> None:
            if self.doc.model is model:
                self._runnable = (path, why)
                self.runnableKnown.emit()

        self._runnable_task = self.runner.submit(lambda: _kind_verdict(model), RUNNABLE_JOB,
                                                 BACKGROUND, on_done=done,
                                                 on_error=lambda m: done(m.split("\n")[0]))

    def tensor_unavailable(self, name: str | None) -> str | None:
        """Why `name` takes no method (None: it does, as far as is known before its pass)."""
        if not name or self.doc.model is None:
            return "no tensor selected"
        info = self.doc.model.info(name)
        if not info.is_float or info.ndim < 2:
            return "methods quantize weight matrices; this tensor is not one"
        if (self.doc.model.path, self.calib(), name) in self.not_linear:
            return "not the input of a Linear layer (no calibration inputs): methods fall back to rtn"
        return None

    # ---- cache -----------------------------------------------------------------------------
    def peers(self, name: str) -> dict:
        """{peer: (scheme, method)} from the current plan (app results key on it)."""
        model = self.doc.model
        cache = getattr(model, "_app_awq_peers", None)
        if cache is None:
            cache = {}
            try:
                model._app_awq_peers = cache
            except AttributeError:
                pass
        if name not in cache:
            cache[name] = peers_of(model, name)
        return {p: (self.doc.scheme_of(p), self.doc.method_of(p)) for p in cache[name]}

    def key(self, name: str, scheme: str, method: str) -> tuple:
        ctx = tuple(sorted(self.peers(name).items()))
        return (self.doc.model.path, self.calib(), name, scheme, method, ctx)

    def get(self, name: str, scheme: str, method: str):
        if self.doc.model is None or not name:
            return None
        return self.results.get(self.key(name, scheme, method))

    def running(self) -> bool:
        return any(t is not None and not t.finished for t in (self.task, self._stats_task))

    def cancel(self) -> None:
        for t in (self._stats_task, self.task):
            if t is not None and not t.finished:
                t.cancel()

    # ---- computing -------------------------------------------------------------------------
    def request(self, name: str, pairs) -> None:
        """Compute the (scheme, method) pairs of `name` not cached yet (a new request cancels
        the last). Methods are applied as :func:`workbench.running.methods_compare.evaluate_method`."""
        self.cancel()
        model = self.doc.model
        if model is None or not name or self.unavailable() or self.tensor_unavailable(name):
            return
        pairs = [(s, m) for s, m in pairs if (m == "rtn" or applies(m, s) is None)
                 and self.get(name, s, m) is None]
        if not pairs:
            return
        calib = self.calib()
        peers = self.peers(name)
        need = [name] + [p for p, (_s, m) in peers.items() if m == "awq"]
        have = self.stats.setdefault((model.path, calib), {})
        missing = [n for n in need if n not in have
                   and (model.path, calib, n) not in self.not_linear]
        if missing:
            def stats_done(got):
                for n in missing:
                    if n in got:
                        have[n] = got[n]
                    else:
                        self.not_linear.add((model.path, calib, n))
                old = [n for n in have if n not in need]       # oldest first
                for n in old[:max(0, len(have) - STATS_KEEP)]:
                    del have[n]
                if name not in have:
                    self.nonLinear.emit(name)
                    return
                if self.doc.model is model:
                    self._evaluate(model, calib, name, pairs, peers)

            def stats_failed(msg):
                self.failed[(model.path, calib)] = msg.split("\n")[0]
                self.statsFailed.emit(name, msg.split("\n")[0])

            self._stats_task = self.runner.submit(
                lambda: tensor_stats(model, missing, calib),
                f"Calibration inputs of {name}", FOREGROUND, visible=True, exclusive=True,
                on_done=stats_done, on_error=stats_failed)
        else:
            self._evaluate(model, calib, name, pairs, peers)

    def _evaluate(self, model, calib, name, pairs, peers) -> None:
        stats = dict(self.stats.get((model.path, calib), {}))
        ctx = tuple(sorted(peers.items()))

        def job():
            for i, (s, m) in enumerate(pairs):
                yield Progress(i, len(pairs), f"{name}: {s} · {m}")
                try:
                    mr = yield from evaluate_method(model, name, s, m, stats, peers)
                except WorkbenchError as exc:   # one pair that cannot be made: skip it
                    mr = exc
                self.runner.post(self._deliver, model, (model.path, calib, name, s, m, ctx), mr)
            yield Progress(len(pairs), len(pairs), f"{name}: methods compared")
            return None

        self.task = self.runner.submit(job, f"Comparing methods for {name}", FOREGROUND,
                                       visible=True, on_error=self._failed)

    def _deliver(self, model, key, mr) -> None:
        if self.doc.model is not model:
            return
        self.results[key] = mr
        self.resultAdded.emit(key[2], key[3], key[4])

    def _failed(self, message: str) -> None:
        self.statsFailed.emit(self.doc.current or "", message.split("\n")[0])

    def _model_changed(self) -> None:
        self.cancel()
        self.results.clear()
        self.stats.clear()
        self.not_linear.clear()
        self.failed.clear()
        self._runnable = None
        if self._runnable_task is not None and not self._runnable_task.finished:
            self._runnable_task.cancel()
        self._runnable_task = None

"""What a plan does to the model (issue 11): the end-to-end check, the sensitivity table, the
budget allocation and the size / predicted-error frontier, scheduled on the compute thread.

Every number comes from a `workbench` function: the sensitivity table and the budget's
allocation from the public API with its defaults (``workbench.api.measure_sensitivity``,
``workbench.api.allocate_plan``: the plan `quant-workbench allocate` writes), the check from
``workbench.running.runner_jobs.check``, the frontier's allocations from
``workbench.planning.allocate`` over the cached table; a GGUF source runs converted on the
fly, as on the command line (:mod:`app.gguf_source`). This module only schedules them, caches their results per model and hands them to the views in
:mod:`app.check_panel`, :mod:`app.sensitivity_view` and :mod:`app.budget_view`. The jobs
themselves (the table, allocation and frontier) are in :mod:`app.effects_jobs`.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal

from workbench.core.errors import WorkbenchError
from workbench.api.plans import KEEP
from workbench.api.choices import MEASURES as _MEASURES  # weight, activation, ...

from .effects_jobs import (Point, SensTable, allocatable, allocation_job, check_job,
                           frontier_job, predicted_error, reads_calibration, table_job)
from .workers import BACKGROUND, FOREGROUND

DEBOUNCE_MS = 700
DEFAULT_SAMPLES = 16
#: the API's "auto" (workbench.api.AUTO): the best measure the model allows, the target
#: runtime's candidate schemes; the window's defaults are the API's (and `allocate`'s)
AUTO = "auto"
MEASURES = (AUTO,) + tuple(_MEASURES)
DEFAULT_SCHEMES = (AUTO,)


def default_calib() -> str:
    from workbench.api.models import DEFAULT_CALIB
    return str(DEFAULT_CALIB)


class PlanEffects(QObject):
    """Schedules and caches the check, sensitivity tables, allocations and the frontier."""

    checkChanged = Signal()
    tableChanged = Signal(str)         # measure
    frontierChanged = Signal()
    allocationChanged = Signal()       # a solved (previewed) allocation
    pinsChanged = Signal()

    def __init__(self, doc, runner, settings, push, parent=None):
        super().__init__(parent)
        self.doc = doc
        self.runner = runner
        self.settings = settings
        self.push = push
        # end-to-end check
        self.check_enabled = _to_bool(settings.value("effects/check_enabled", True))
        self.calib = str(settings.value("effects/calib", "") or "") or default_calib()
        if not Path(self.calib).is_file():
            self.calib = default_calib()
        self.samples = int(settings.value("effects/samples", DEFAULT_SAMPLES) or DEFAULT_SAMPLES)
        self.check_state = "off"       # off | stale | fresh | error
        self.figures: dict | None = None
        self.check_message = ""
        self.unrunnable: str | None = None
        self._check_task = None
        self._check_gen = 0
        self.check_runs = 0            # results delivered (tests)
        self._timer = QTimer(self, singleShot=True, interval=DEBOUNCE_MS)
        self._timer.timeout.connect(self._run_check)
        # sensitivity / allocation / frontier
        self.measure = str(settings.value("effects/measure", AUTO) or AUTO)
        if self.measure not in MEASURES:
            self.measure = AUTO
        stored = str(settings.value("effects/schemes", "") or "")
        self.schemes = [s for s in stored.split(",") if s] or list(DEFAULT_SCHEMES)
        #: calibration samples of the sensitivity measure and the allocation (None: the
        #: API's default, as `allocate` without --samples)
        sens = settings.value("effects/sensitivity_samples", None)
        self.sens_samples = int(sens) if sens not in (None, "") else None
        self.allocation_notes: list[str] = []    # the API's notes of the last allocation
        self.tables: dict[tuple, SensTable] = {}
        self.table_errors: dict[tuple, str] = {}
        self._table_tasks: dict[tuple, object] = {}
        self._extending: set = set()
        self.pins: dict[str, str] = {}
        self._kept = None
        self.frontier: list[Point] = []
        self._frontier_key = None
        self._frontier_task = None
        self.preview: tuple | None = None      # (budget label, assignment, bytes, predicted)
        self._alloc_task = None
        self.allocation = None                 # the last workbench.api.Allocation
        self._source = None                    # the model the cached work is for
        self.allocation_error: str | None = None
        doc.modelChanged.connect(self._model_changed)
        doc.stateChanged.connect(lambda _c: self.invalidate())
        doc.stateChanged.connect(lambda _c: self._drop_stale_preview())

    # ---- end-to-end check ---------------------------------------------------------------------
    def set_check_enabled(self, on: bool) -> None:
        on = bool(on)
        self.check_enabled = on
        self.settings.setValue("effects/check_enabled", on)
        if not on:
            self._timer.stop()
            self._cancel_check()
            self.check_state = "off"
            self.checkChanged.emit()
        else:
            self.invalidate(now=True)
            self.checkChanged.emit()   # with nothing to check yet too: the panel says "on"

    def set_calib(self, path: str) -> None:
        self.calib = str(path) if path else default_calib()
        self.settings.setValue("effects/calib", "" if self.calib == default_calib() else self.calib)
        self.unrunnable = None
        for key in [k for k in self.tables if k[3] is not None]:
            del self.tables[key]
        self.tableChanged.emit(self.measure)
        self.invalidate(now=True)

    def invalidate(self, now: bool = False) -> None:
        """The plan changed: mark the figures stale, drop a running check, re-run (debounced)."""
        self._frontier_mark()
        if not self.check_enabled or self.doc.model is None:
            return
        if self.unrunnable is not None:
            self.check_state = "error"
            self.check_message = self.unrunnable
            self.checkChanged.emit()
            return
        self._cancel_check()
        self.check_state = "stale"
        self.checkChanged.emit()
        self._timer.start(0 if now else DEBOUNCE_MS)

    def _cancel_check(self) -> None:
        self._check_gen += 1   # whatever is running is superseded: its result is dropped
        if self._check_task is not None and not self._check_task.finished:
            self._check_task.cancel()
        self._check_task = None

    def _run_check(self) -> None:
        model, plan = self.doc.model, self.doc.plan
        if model is None or not self.check_enabled:
            return
        self._check_gen += 1
        gen = self._check_gen
        calib, samples = self.calib, self.samples
        self._check_task = self.runner.submit(
            lambda: check_job(model, plan, calib, samples), "End-to-end check", BACKGROUND,
            visible=True, exclusive=True, on_done=lambda r: self._check_done(gen, r),
            on_error=lambda msg: self._check_failed(gen, msg),
            on_cancel=lambda: self._check_cancelled(gen))
        self.checkChanged.emit()    # the panel says where in the queue it is

    def _check_done(self, gen, result) -> None:
        if gen != self._check_gen:
            return  # superseded by a later edit
        self._check_task = None
        self.figures = result
        self.check_state = "fresh"
        self.check_message = ""
        self.check_runs += 1
        self.checkChanged.emit()

    def _check_failed(self, gen, message: str) -> None:
        if gen != self._check_gen:
            return
        self._check_task = None
        first = message.split("\n")[0]
        if "not runnable" in first:
            self.unrunnable = first
        self.check_state = "error"
        self.check_message = first
        self.checkChanged.emit()

    def _check_cancelled(self, gen) -> None:
        """Cancelled by the user (the work queue, Esc); not when an edit superseded it."""
        if gen != self._check_gen:
            return
        self._check_task = None
        self.check_state = "cancelled"
        self.check_message = "cancelled · F5 (Effects ▸ Re-run Check Now) runs it again"
        self.checkChanged.emit()

    def check_now(self) -> None:
        self.unrunnable = None
        self.invalidate(now=True)

    # ---- sensitivity tables -----------------------------------------------------------------------
    def _key(self, measure: str) -> tuple:
        m = self.doc.model
        return (str(m.path) if m is not None else "", measure, tuple(self.schemes),
                self.calib if reads_calibration(measure) else None, self.sens_samples)

    def calib_arg(self) -> str | None:
        """The calibration text for the API: None for the shipped one (its own default)."""
        return None if self.calib == default_calib() else self.calib

    def set_measure(self, measure: str) -> None:
        if measure not in MEASURES:
            raise WorkbenchError(f"unknown measure {measure!r}")
        self.measure = measure
        self.settings.setValue("effects/measure", measure)
        self.tableChanged.emit(measure)
        self.request_table()

    def set_schemes(self, schemes) -> None:
        """Candidate schemes: names, or "auto" (the API's: every scheme the runtime runs)."""
        from workbench.api.plans import get_scheme
        given = [s.strip() for s in schemes if s.strip()]
        if given == [AUTO]:
            names = [AUTO]
        else:
            names = [get_scheme(s).name for s in given]
        if not names:
            raise WorkbenchError("give at least one candidate scheme, or auto")
        self.schemes = list(dict.fromkeys(names))
        self.settings.setValue("effects/schemes", ",".join(self.schemes))
        self.tableChanged.emit(self.measure)
        self.request_table()

    def table(self, measure: str | None = None) -> SensTable | None:
        return self.tables.get(self._key(measure or self.measure))

    def table_error(self, measure: str | None = None) -> str | None:
        return self.table_errors.get(self._key(measure or self.measure))

    def table_running(self, measure: str | None = None) -> bool:
        t = self._table_tasks.get(self._key(measure or self.measure))
        return t is not None and not t.finished

    def request_table(self, measure: str | None = None):
        """Compute the table for a measure (cached; a running request is reused)."""
        measure = measure or self.measure
        model = self.doc.model
        if model is None:
            return None
        key = self._key(measure)
        if key in self.tables:
            self._after_table(measure)
            return None
        running = self._table_tasks.get(key)
        if running is not None and not running.finished:
            return running
        self.table_errors.pop(key, None)
        schemes, calib, samples = list(self.schemes), self.calib_arg(), self.sens_samples

        def make():
            return table_job(model, schemes, measure, calib, samples, runner=self.runner)

        def done(table):
            if self.doc.model is model:
                self.tables[key] = table
                self.tableChanged.emit(measure)
                self._after_table(measure)

        def failed(msg):
            self.table_errors[key] = msg.split("\n")[0]
            self.tableChanged.emit(measure)

        # a whole-model sweep: behind what the user waits for (a selected tensor, an export
        # check, the totals' error evaluation); the work queue lists it with its progress
        task = self.runner.submit(make, f"Sensitivity ({measure})", BACKGROUND, visible=True,
                                  exclusive=reads_calibration(measure),
                                  on_done=done, on_error=failed,
                                  on_cancel=lambda: self.tableChanged.emit(measure))
        self._table_tasks[key] = task
        self.tableChanged.emit(measure)
        return task

    def _after_table(self, measure: str) -> None:
        if measure == self.measure:
            self.request_frontier()
            self._extend_for_plan()

    def _extend_for_plan(self) -> None:
        """Add the current plan's non-candidate schemes to the table (columns only: the
        allocator keeps to the candidates), so the current plan has a predicted error."""
        table, model = self.table(), self.doc.model
        if table is None or model is None:
            return
        missing = sorted({self.doc.scheme_of(n) for n in table.names} - set(table.schemes)
                         - {KEEP})
        key = self._key(self.measure)
        if not missing or (key, tuple(missing)) in self._extending:
            return
        self._extending.add((key, tuple(missing)))
        # the same measure as the table (the one "auto" chose) on the same samples
        measure, calib, samples = self.measure, self.calib_arg(), table.samples
        chosen = table.measure

        def done(extra):
            self._extending.discard((key, tuple(missing)))
            cur = self.tables.get(key)
            if cur is not None and self.doc.model is model:
                self.tables[key] = cur.merged(extra)
                self.tableChanged.emit(measure)
                # the frontier holds pinned tensors at the plan's schemes: now measurable
                self._frontier_key = None
                self.request_frontier()
                self._extend_for_plan()

        def failed(_msg):
            self._extending.discard((key, tuple(missing)))
            if self.doc.model is model:
                self.request_frontier(force=True)   # without those schemes' errors

        self.runner.submit(lambda: table_job(model, missing, chosen, calib, samples,
                                             runner=self.runner),
                           f"Sensitivity ({measure}) of the plan's other schemes", BACKGROUND,
                           exclusive=reads_calibration(measure),
                           on_done=done, on_error=failed, on_cancel=lambda: failed(""))

    # ---- pins ---------------------------------------------------------------------------------
    def toggle_pin(self, name: str | None) -> None:
        if not name or self.doc.model is None or name not in self.doc.model.tensors:
            return
        if name in self.pins:
            del self.pins[name]
        else:
            self.pins[name] = self.doc.scheme_of(name)
        self.pinsChanged.emit()
        self.request_frontier()

    def effective_pins(self) -> dict:
        """User pins (kept at the scheme they had when pinned) plus every tensor the allocator
        does not choose for whose current scheme is not `keep` (so the total is exact)."""
        model = self.doc.model
        out = dict(self.pins)
        if model is None:
            return out
        for n, info in model.tensors.items():
            if n in out:
                continue
            if not (info.ndim >= 2 and info.is_float) and self.doc.scheme_of(n) != KEEP:
                out[n] = self.doc.scheme_of(n)
        for n in self.runtime_kept():
            out.setdefault(n, self.doc.scheme_of(n))
        return out

    def runtime_kept(self) -> list[str]:
        """Matrices llama.cpp never re-types (position / token-type embeddings: the same rule
        as the GGUF exporter, app.commands.never_retyped): the allocator leaves them as they are."""
        model = self.doc.model
        if model is None:
            return []
        if self._kept is None or self._kept[0] is not model:
            from .commands import never_retyped
            names = allocatable(model)
            self._kept = (model, [n for n, _ in never_retyped(model, {n: "q8_0" for n in names})])
        return self._kept[1]

    # ---- allocation -------------------------------------------------------------------------------
    def solve(self, budget_bpw: float | None = None, budget_bytes: int | None = None,
              apply: bool = True):
        """Allocate for a budget as `quant-workbench allocate` does (workbench.api.allocate_plan
        with the window's measure, candidates, calibration and samples, "auto" the API's own
        choice; the user's pins fixed), on the compute thread; with `apply`, its plan becomes
        the document's plan as one undoable edit. Returns the task (None: no table yet)."""
        table = self.table()
        model = self.doc.model
        if table is None or model is None:
            return None
        if self._alloc_task is not None and not self._alloc_task.finished:
            self._alloc_task.cancel()
        if budget_bytes is not None:
            label = f"Allocate for budget {budget_bytes / 1e6:.3f} MB"
        else:
            label = f"Allocate for budget {budget_bpw:.3f} bits/weight"
        schemes, measure, calib = list(self.schemes), self.measure, self.calib_arg()
        samples, pins = self.sens_samples, dict(self.pins)

        def make():
            return allocation_job(model, budget_bpw, budget_bytes, schemes, measure, calib,
                                  samples, pins, self.runner)

        def done(res):
            if self.doc.model is not model:
                return
            a, notes, plan = res
            self.allocation = a
            self.allocation_notes = notes
            assignment = plan.resolve(model)
            self.preview = (label, assignment, int(a.evaluation.totals.bytes_after),
                            float(a.solution.error), int(a.budget_bytes))
            self.allocationChanged.emit()
            if apply:
                self.apply_plan(plan, label)

        def failed(msg):
            self.preview = None
            self.allocation_error = msg.split("\n")[0]
            self.allocationChanged.emit()

        self.allocation_error = None
        self._alloc_task = self.runner.submit(make, "Allocating", FOREGROUND, visible=True,
                                              exclusive=True, on_done=done, on_error=failed)
        return self._alloc_task

    def choice_text(self) -> str:
        """What the API chose and why: the table's measure, its candidates, and (after an
        allocation) its candidates for the budget and the methods weighed."""
        table = self.table()
        if table is None:
            return ""
        parts = [f"measure {table.measure} ({table.reason})",
                 f"{len(table.candidates)} candidate schemes"]
        for line in self.allocation_notes if self.preview is not None else ():
            if line.startswith(("methods:", "candidates:")):
                parts.append(line)
        return " · ".join(parts)

    def apply_plan(self, plan, label: str) -> bool:
        """The allocated plan (the rules `allocate` writes) as the document's plan: one
        undoable edit."""
        from .commands import StateCommand
        doc = self.doc
        if plan == doc.plan:
            return False
        new = plan.resolve(doc.model)
        changes = {n: s for n, s in new.items() if doc.scheme_of(n) != s}
        return self.push(StateCommand(label, (doc.plan, doc.tiers), (plan, doc.tiers), changes))

    def apply_assignment(self, assignment: dict, label: str) -> bool:
        """One undoable edit: exact-name assignments over the current plan (its default,
        fallbacks, methods and regex rules stay; pinned tensors keep their scheme)."""
        from .commands import StateCommand
        doc = self.doc
        changes = {n: s for n, s in assignment.items()
                   if n in doc.model.tensors and doc.scheme_of(n) != s}
        plan = doc.plan.with_assignments(changes) if changes else doc.plan
        if plan.resolve(doc.model) == doc.assignment:
            return False
        return self.push(StateCommand(label, (doc.plan, doc.tiers), (plan, doc.tiers), changes))

    def apply_point(self, point: Point) -> bool:
        if point.kind == "allocated":
            label = f"Apply frontier plan for budget {point.budget_bpw:.2f} bits/weight"
        else:
            label = f"Apply {point.kind} plan {point.label} ({point.bits_per_weight:.2f} bits/weight)"
        return self.apply_assignment(point.assignment, label)

    # ---- frontier ---------------------------------------------------------------------------------
    def request_frontier(self, force: bool = False):
        """Compute the frontier over the cached table. Tensors the allocator does not choose
        for are held at the plan's schemes (e.g. MiniLM's position embeddings, which llama.cpp
        never re-types, at the default int8-channel): until those schemes are in the table
        (`_extend_for_plan`), no plan containing them has a predicted error, so the frontier
        waits for them (`force`: compute anyway)."""
        table = self.table()
        model = self.doc.model
        if table is None or model is None:
            return None
        pins = self.effective_pins()
        waiting = {pins[n] for n in table.names if n in pins} - {KEEP} - set(table.schemes)
        if waiting and not force:
            self._extend_for_plan()
            return None
        key = (self._key(self.measure), tuple(sorted(pins.items())))
        if key == self._frontier_key and self.frontier:
            self.frontierChanged.emit()
            return None
        if self._frontier_task is not None and not self._frontier_task.finished:
            self._frontier_task.cancel()

        def done(points):
            if self.doc.model is model:
                self.frontier = points
                self._frontier_key = key
                self.frontierChanged.emit()

        self._frontier_task = self.runner.submit(lambda: frontier_job(model, table, pins),
                                                 "Frontier", FOREGROUND, visible=True,
                                                 on_done=done)
        return self._frontier_task

    def current_point(self) -> Point | None:
        """The current plan on the frontier axes (None until its schemes are in the table)."""
        table, model = self.table(), self.doc.model
        if table is None or model is None:
            return None
        a = dict(self.doc.assignment)
        pred = predicted_error(table, a)
        if pred is None:
            return None
        nb = 0
        for n in model.tensors:
            s = a.get(n, KEEP)
            v = table.nbytes.get((n, s))
            nb += v if v is not None else self.doc.bytes_of(n)
        return Point("current", "current plan", nb, 8.0 * nb / max(table.params, 1), pred, a)

    def _frontier_mark(self) -> None:
        self._extend_for_plan()
        if self.frontier:
            key = (self._key(self.measure), tuple(sorted(self.effective_pins().items())))
            if key != self._frontier_key:
                self.request_frontier()
        self.frontierChanged.emit()

    def _drop_stale_preview(self) -> None:
        """An undo, redo or edit that leaves the plan other than the allocation shown: the
        panels stop showing that allocation (and an old "cannot allocate")."""
        if self.preview is None and self.allocation_error is None:
            return
        if self.preview is not None:
            a = self.preview[1]
            if all(self.doc.assignment.get(n, KEEP) == s for n, s in a.items()):
                return          # the plan is still the allocation shown
        self.preview = None
        self.allocation_error = None
        self.allocationChanged.emit()

    # ---- model ------------------------------------------------------------------------------------
    def _model_changed(self) -> None:
        from .gguf_source import release
        old, self._source = self._source, self.doc.model
        if old is not None and old is not self.doc.model:
            # its live model (a GGUF converted on the fly), on the compute thread once the
            # cancelled work below has stopped
            self.runner.submit(lambda: release(old), "Closing the previous model", FOREGROUND)
        self._timer.stop()
        self._cancel_check()
        for t in (self._frontier_task, self._alloc_task):
            if t is not None and not t.finished:
                t.cancel()
        self._frontier_task = self._alloc_task = None
        self._kept = None
        self._extending.clear()
        self.allocation_error = None
        for t in self._table_tasks.values():
            if not t.finished:
                t.cancel()
        self._table_tasks.clear()
        self.tables.clear()
        self.table_errors.clear()
        self.pins.clear()
        self.frontier = []
        self._frontier_key = None
        self.preview = None
        self.figures = None
        self.unrunnable = None
        self.check_state = "off"
        self.checkChanged.emit()
        self.tableChanged.emit(self.measure)
        self.allocationChanged.emit()
        self.frontierChanged.emit()
        if self.doc.model is not None:
            self.invalidate(now=True)


def _to_bool(v) -> bool:
    if isinstance(v, str):
        return v.lower() in ("1", "true", "yes", "on")
    return bool(v)

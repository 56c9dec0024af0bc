"""Long work off the GUI thread: a compute thread running `workbench` jobs by priority, and a
user lane for the light checks of what the user just opened (the Export dialog's format check).

A job is a `workbench.core.progress` generator (yields Progress, returns a result) or a plain
callable. Everything numeric runs on a single compute thread: numba's default threading
layer must not be entered from two threads at once, and two cores gain nothing from more.
Between two Progress events the thread checks the task's cancel flag and whether a task
of higher priority is waiting; if so, the running generator is parked and resumed later,
so selecting a tensor is answered while a whole-model evaluation is still going.
Callbacks (progress, done, failed, cancelled) run on the GUI thread.

`exclusive` jobs (those driving the shared transformers network: the end-to-end check, the
calibrated sensitivity tables) are never interleaved with one another, but a job of higher
priority that does not touch the network (the selected tensor's statistics) still parks them.
The user lane (``lane=USER``) is a second thread for jobs that never enter numba's parallel
kernels nor the network (metadata checks): they answer while a long job holds the compute
thread. A queued task that is cancelled leaves the queue at once (app.work_queue lists them).
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
import traceback
from typing import Callable

from PySide6.QtCore import QObject, Qt, QTimer, Signal, Slot

from workbench.core.errors import Cancelled, WorkbenchError
from workbench.core.progress import Progress

# priorities: higher runs first
INTERACTIVE = 30   # what the user is looking at (selected tensor)
FOREGROUND = 20    # an action the user started (export, comparison)
BACKGROUND = 10    # whole-model statistics and evaluation
IDLE = 0           # kernel JIT warm-up: only when nothing else waits

PROGRESS_EVERY_S = 0.05   # a task's progress is shown at most this often (GUI thread work)

COMPUTE = "compute"   # the numeric lane (numba, the network): one thread
USER = "user"         # light checks the user waits for (never numba, never the network)


class _Dispatcher(QObject):
    """Runs callables on the thread it lives in (the GUI thread)."""

    call = Signal(object)

    def __init__(self):
        super().__init__()
        self.call.connect(self._run, Qt.ConnectionType.QueuedConnection)
        self._lock = threading.Lock()
        self.pending = 0
        self.closed = False   # set when the runner shuts down: late deliveries are dropped

    def post(self, fn: Callable, *args) -> None:
        with self._lock:
            self.pending += 1
        self.call.emit((fn, args))

    @Slot(object)
    def _run(self, item) -> None:
        fn, args = item
        try:
            if not self.closed:   # the window (and its signals) may be gone already
                fn(*args)
        except RuntimeError as exc:
            # a result that arrives after its window was deleted has nowhere to go
            if "has been deleted" not in str(exc) and "already deleted" not in str(exc):
                raise
        finally:
            with self._lock:
                self.pending -= 1


def _call_job(fn):
    return fn()
    yield  # noqa: unreachable - makes this a generator


class Task:
    """One unit of work. Create with :meth:`Runner.submit`."""

    def __init__(self, runner: "Runner", make: Callable, name: str, priority: int,
                 on_done=None, on_error=None, on_progress=None, on_cancel=None,
                 visible: bool = False, exclusive: bool = False, lane: str = COMPUTE):
        self.runner = runner
        self.lane = lane
        #: never parked for a task of higher priority (jobs that swap weights in the shared
        #: transformers network: another such job in between would see the wrong weights)
        self.exclusive = exclusive
        self.make = make
        self.name = name
        self.priority = priority
        self.on_done = on_done
        self.on_error = on_error
        self.on_progress = on_progress
        self.on_cancel = on_cancel
        self.visible = visible
        self.gen = None
        self.state = "queued"      # queued, running, done, failed, cancelled
        self.fraction = 0.0
        self.message = name
        self.done = 0.0            # the last Progress event's done / total (GUI thread)
        self.total = 0.0
        self.submitted_at = time.monotonic()
        self.started_at: float | None = None
        self.progress_at: float | None = None     # when the last Progress event came
        self._cancel = threading.Event()
        self._last_post = 0.0          # when the GUI last showed a Progress event
        self._latest = None            # (Progress, time) last reported by the job
        self._post_pending = False     # a delivery of _latest is posted or deferred

    def cancel(self) -> None:
        """Stop the task: a queued one leaves the queue now; a running (or parked) one stops at
        its next progress event, its generator closed (its `finally` blocks run)."""
        if self.finished or self._cancel.is_set():
            return   # nothing to stop: waking the compute thread would cost the GIL
        self._cancel.set()
        self.runner._cancel_task(self)

    @property
    def started(self) -> bool:
        """The job has begun (it may be parked for a task of higher priority since)."""
        return self.gen is not None

    def progress_text(self) -> str:
        """'40/98' (counted steps), '37%' (a fraction) or '' (no progress reported yet)."""
        if self.total <= 0:
            return ""
        # counted steps (tensors, samples, formats); not bytes, not a percentage scale
        if float(self.total).is_integer() and 1 < self.total <= 1_000_000 and self.total != 100:
            return f"{int(self.done)}/{int(self.total)}"
        return f"{100 * self.fraction:.0f}%"

    def eta_s(self) -> float | None:
        """Seconds left at the pace so far (None: too early to say)."""
        if self.started_at is None or self.progress_at is None or not 0.02 <= self.fraction < 1.0:
            return None
        # as of the last progress event: every panel showing it says the same
        spent = self.progress_at - self.started_at
        return spent * (1.0 - self.fraction) / self.fraction

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed", "cancelled")



class _Lane:
    """One worker thread and its priority queue."""

    def __init__(self, name: str):
        self.name = name
        self.cond = threading.Condition()
        self.queue: list = []               # heap of (-priority, seq, task)
        self.current: Task | None = None
        self.reap: list[Task] = []          # cancelled parked tasks: close on this thread
        self.stop = False
        self.thread: threading.Thread | None = None

    def eligible(self, task: Task, running: Task | None) -> bool:
        """Whether `task` may run now: an exclusive task that has not started waits while
        another exclusive one is started (running or parked)."""
        if not task.exclusive or task.gen is not None:
            return True
        if running is not None and running.exclusive:
            return False
        return not any(t.exclusive and t.gen is not None for _, _, t in self.queue)

    def pop(self) -> Task:
        """The next task to run (highest priority first, eligible ones only)."""
        entries = sorted(self.queue)
        best = next((e for e in entries if self.eligible(e[2], None)), entries[0])
        self.queue.remove(best)
        heapq.heapify(self.queue)
        return best[2]

    def outranked(self, task: Task) -> bool:
        """A task of higher priority that may run now is waiting."""
        return any(-p > task.priority and self.eligible(t, task) for p, _, t in self.queue)

    def ordered(self) -> list[tuple[Task, str]]:
        """(task, 'running' | 'paused' | 'queued') in the order they will run."""
        out = [(self.current, "running")] if self.current is not None else []
        for _, _, t in sorted(self.queue):
            out.append((t, "paused" if t.gen is not None else "queued"))
        return out


class Runner(QObject):
    """The compute thread, the user lane and their priority queues."""

    taskSubmitted = Signal(object)
    taskStarted = Signal(object)
    taskProgress = Signal(object)
    taskFinished = Signal(object)

    def __init__(self, parent=None):
        super().__init__(parent)
        self._dispatch = _Dispatcher()
        self._lanes = {COMPUTE: _Lane(COMPUTE), USER: _Lane(USER)}
        self._seq = itertools.count()
        for lane in self._lanes.values():
            lane.thread = threading.Thread(target=self._loop, args=(lane,),
                                           name=f"workbench-{lane.name}", daemon=True)
            lane.thread.start()

    # ---- API (GUI thread) ---------------------------------------------------------------
    def submit(self, job, name: str = "", priority: int = BACKGROUND, *, on_done=None,
               on_error=None, on_progress=None, on_cancel=None, visible: bool = False,
               exclusive: bool = False, lane: str = COMPUTE) -> Task:
        """Queue `job`: a zero-argument callable returning a generator job or a value.
        `exclusive`: never interleaved with another exclusive job (the shared network).
        `lane`: COMPUTE, or USER for a light job that never enters numba nor the network."""
        task = Task(self, job, name, priority, on_done, on_error, on_progress, on_cancel, visible,
                    exclusive, lane)
        ln = self._lanes[lane]
        with ln.cond:
            heapq.heappush(ln.queue, (-priority, next(self._seq), task))
            ln.cond.notify()
        self.taskSubmitted.emit(task)
        return task

    def post(self, fn: Callable, *args) -> None:
        """Run `fn(*args)` on the GUI thread (callable from any thread)."""
        self._dispatch.post(fn, *args)

    def idle(self) -> bool:
        for ln in self._lanes.values():
            with ln.cond:
                if ln.queue or ln.current is not None or ln.reap:
                    return False
        return self._dispatch.pending == 0

    def tasks(self) -> list[Task]:
        """Every unfinished task, running ones first."""
        return [t for t, _ in self.snapshot()]

    def snapshot(self) -> list[tuple[Task, str]]:
        """(task, 'running' | 'paused' | 'queued') of every lane, in the order they run: the
        running tasks first."""
        rows = []
        for ln in self._lanes.values():
            with ln.cond:
                rows += ln.ordered()
        rows.sort(key=lambda r: r[1] != "running")
        return rows

    def running(self, lane: str = COMPUTE) -> Task | None:
        ln = self._lanes[lane]
        with ln.cond:
            return ln.current

    def cancel_all(self) -> None:
        for t in self.tasks():
            t.cancel()

    def shutdown(self, timeout: float = 5.0) -> None:
        self._dispatch.closed = True
        self.cancel_all()
        for ln in self._lanes.values():
            with ln.cond:
                ln.stop = True
                ln.cond.notify_all()
        for ln in self._lanes.values():
            ln.thread.join(timeout)

    def _cancel_task(self, task: Task) -> None:
        """A cancelled task that waits in its queue leaves it now (a parked one is closed on
        its lane's thread); a running one stops at its next event."""
        ln = self._lanes[task.lane]
        waiting = False
        with ln.cond:
            for i, entry in enumerate(ln.queue):
                if entry[2] is task:
                    ln.queue.pop(i)
                    heapq.heapify(ln.queue)
                    if task.gen is not None:   # parked: closed on its lane's thread before
                        ln.reap.append(task)   # any other task takes another step there
                    waiting = True
                    break
            ln.cond.notify_all()
        if waiting:
            self._finish(task, "cancelled")

    # ---- the lanes' threads -------------------------------------------------------------
    def _loop(self, ln: _Lane) -> None:
        while True:
            with ln.cond:
                while not ln.queue and not ln.reap and not ln.stop:
                    ln.cond.wait()
                if ln.stop:
                    return
            self._reap(ln)
            with ln.cond:
                if not ln.queue:
                    continue
                task = ln.pop()
                ln.current = task
            try:
                self._step(ln, task)
            finally:
                with ln.cond:
                    ln.current = None

    def _reap(self, ln: _Lane) -> None:
        with ln.cond:
            reap, ln.reap = ln.reap, []
        for t in reap:   # reported cancelled already (it left the list at once)
            try:
                t.gen.close()
            except Exception:  # noqa: BLE001 - a job's cleanup failing must not stop the lane
                pass

    def _finish(self, task: Task, state: str, payload=None) -> None:
        def deliver():
            task.state = state
            cb = {"done": task.on_done, "failed": task.on_error,
                  "cancelled": task.on_cancel}[state]
            try:
                if cb is not None:
                    cb(payload) if state != "cancelled" else cb()
            finally:
                self.taskFinished.emit(task)
        self.post(deliver)

    def _step(self, ln: _Lane, task: Task) -> None:
        if task.cancelled:
            if task.gen is not None:
                task.gen.close()
            self._finish(task, "cancelled")
            return
        try:
            if task.gen is None:
                task.started_at = time.monotonic()
                self.post(self._started, task)
                made = task.make()
                task.gen = made if hasattr(made, "__next__") and hasattr(made, "send") \
                    else _call_job(lambda: made)
            while True:
                ev = next(task.gen)
                if task.cancelled:
                    task.gen.close()
                    self._finish(task, "cancelled")
                    return
                if isinstance(ev, Progress):
                    self._progress(task, ev)
                if ln.reap:
                    self._reap(ln)
                with ln.cond:
                    if ln.outranked(task):
                        heapq.heappush(ln.queue, (-task.priority, next(self._seq), task))
                        return  # parked; resumed when its turn comes again
        except StopIteration as stop:
            self._finish(task, "done", stop.value)
        except Cancelled:
            self._finish(task, "cancelled")
        except WorkbenchError as exc:
            self._finish(task, "failed", str(exc))
        except Exception as exc:  # a bug or an unexpected library error: report, stay up
            tb = traceback.format_exc(limit=6)
            self._finish(task, "failed", f"{type(exc).__name__}: {exc}\n\n{tb}")

    def _started(self, task: Task) -> None:
        if task.state == "queued":
            task.state = "running"
        self.taskStarted.emit(task)

    def _progress(self, task: Task, ev: Progress) -> None:
        """Called on the lane's thread: keep the event as the task's latest and post one
        delivery unless one is on its way already (it reads the latest event when it runs)."""
        task._latest = (ev, time.monotonic())
        if task._post_pending:
            return
        task._post_pending = True
        self.post(self._show_progress, task)

    def _show_progress(self, task: Task) -> None:
        """GUI thread: the task's latest Progress event, at most every PROGRESS_EVERY_S. A
        burst of events is one delivery, and the last event of a burst is shown, not dropped
        (the last was dropped before: the export check read "checking llama-tensor-types" for
        the 40 s its onnx step took on a busy machine)."""
        if task.finished or self._dispatch.closed:
            task._post_pending = False
            return
        wait = task._last_post + PROGRESS_EVERY_S - time.monotonic()
        if wait > 0 and task._latest[0].fraction < 1.0:
            with self._dispatch._lock:           # idle() waits for it as for a posted call
                self._dispatch.pending += 1
            QTimer.singleShot(max(1, int(1000 * wait)), self._dispatch,
                              lambda: self._deferred_progress(task))
            return
        task._post_pending = False               # before reading: a newer event posts again
        ev, at = task._latest
        task._last_post = time.monotonic()
        task.fraction, task.message = ev.fraction, ev.message or task.name
        task.done, task.total = float(ev.done), float(ev.total)
        task.progress_at = at
        if task.on_progress is not None:
            task.on_progress(ev)
        self.taskProgress.emit(task)

    def _deferred_progress(self, task: Task) -> None:
        with self._dispatch._lock:
            self._dispatch.pending -= 1
        self._show_progress(task)

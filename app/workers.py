"""Long work off the GUI thread: one compute thread running `workbench` jobs by priority.

A job is a `workbench.core.progress` generator (yields Progress, returns a result) or a plain
callable. Everything numeric runs on a single compute thread: numba's default threading
layer must not be entered from two threads at once, and two cores gain nothing from more.
Between two Progress events the thread checks the task's cancel flag and whether a task
of higher priority is waiting; if so, the running generator is parked and resumed later,
so selecting a tensor is answered while a whole-model evaluation is still going.
Callbacks (progress, done, failed, cancelled) run on the GUI thread.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
import traceback
from typing import Callable

from PySide6.QtCore import QObject, Qt, Signal, Slot

from workbench.core.errors import Cancelled, WorkbenchError
from workbench.core.progress import Progress

# priorities: higher runs first
INTERACTIVE = 30   # what the user is looking at (selected tensor)
FOREGROUND = 20    # an action the user started (export, comparison)
BACKGROUND = 10    # whole-model statistics and evaluation
IDLE = 0           # kernel JIT warm-up: only when nothing else waits


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
                 visible: bool = False, exclusive: bool = False):
        self.runner = runner
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
        self._cancel = threading.Event()
        self._last_post = 0.0

    def cancel(self) -> None:
        if self.finished:   # nothing to stop: waking the compute thread would cost the GIL
            return
        self._cancel.set()
        self.runner._wake()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed", "cancelled")


class Runner(QObject):
    """The compute thread and its priority queue."""

    taskStarted = Signal(object)
    taskProgress = Signal(object)
    taskFinished = Signal(object)

    def __init__(self, parent=None):
        super().__init__(parent)
        self._dispatch = _Dispatcher()
        self._cond = threading.Condition()
        self._queue: list = []
        self._seq = itertools.count()
        self._stop = False
        self._current: Task | None = None
        self._thread = threading.Thread(target=self._loop, name="workbench-compute", daemon=True)
        self._thread.start()

    # ---- API (GUI thread) ---------------------------------------------------------------
    def submit(self, job, name: str = "", priority: int = BACKGROUND, *, on_done=None,
               on_error=None, on_progress=None, on_cancel=None, visible: bool = False,
               exclusive: bool = False) -> Task:
        """Queue `job`: a zero-argument callable returning a generator job or a value.
        `exclusive`: run to the end (or its cancellation) without being parked."""
        task = Task(self, job, name, priority, on_done, on_error, on_progress, on_cancel, visible,
                    exclusive)
        with self._cond:
            heapq.heappush(self._queue, (-priority, next(self._seq), task))
            self._cond.notify()
        return task

    def post(self, fn: Callable, *args) -> None:
        """Run `fn(*args)` on the GUI thread (callable from any thread)."""
        self._dispatch.post(fn, *args)

    def idle(self) -> bool:
        with self._cond:
            busy = bool(self._queue) or self._current is not None
        return not busy and self._dispatch.pending == 0

    def tasks(self) -> list[Task]:
        with self._cond:
            out = [t for _, _, t in self._queue]
            if self._current is not None:
                out.insert(0, self._current)
        return out

    def cancel_all(self) -> None:
        for t in self.tasks():
            t.cancel()

    def shutdown(self, timeout: float = 5.0) -> None:
        self._dispatch.closed = True
        self.cancel_all()
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # ---- the compute thread -------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                _, _, task = heapq.heappop(self._queue)
                self._current = task
            try:
                self._step(task)
            finally:
                with self._cond:
                    self._current = None

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

    def _step(self, task: Task) -> None:
        if task.cancelled:
            if task.gen is not None:
                task.gen.close()
            self._finish(task, "cancelled")
            return
        try:
            if task.gen is None:
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
                with self._cond:
                    if not task.exclusive and self._queue and -self._queue[0][0] > task.priority:
                        heapq.heappush(self._queue, (-task.priority, next(self._seq), task))
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
        now = time.monotonic()
        if now - task._last_post < 0.05 and ev.fraction < 1.0:
            return
        task._last_post = now

        def deliver():
            task.fraction, task.message = ev.fraction, ev.message or task.name
            if task.on_progress is not None:
                task.on_progress(ev)
            self.taskProgress.emit(task)
        self.post(deliver)

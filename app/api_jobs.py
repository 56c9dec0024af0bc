"""The public API (workbench.api) as jobs of the app's compute thread (app.workers).

An API function is not a generator: it runs its stages through a `driver` (a callable given
each stage's progress job, returning its result). :func:`api_job` runs the function on a helper
thread whose driver hands every stage back to the compute thread: the job steps the stage
there (``yield from``), so its Progress events reach the work queue, a cancel stops it between
two events and a task of higher priority may park it, and sends the result back. The two
threads take turns (one of them always waits for the other): numba and the shared network are
never entered from two threads at once, and the GUI thread runs none of it.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable

from workbench.core.errors import Cancelled

_CANCEL = object()


def api_job(call: Callable[[Callable], Any]):
    """Job: ``call(driver)`` (e.g. ``lambda d: api.allocate_plan(model, budget, driver=d)``),
    its stages stepped here; returns its result, raises what it raises. Closed (cancelled),
    the API call gets :class:`Cancelled` at its next stage and is waited for."""
    to_job: queue.Queue = queue.Queue()
    to_api: queue.Queue = queue.Queue()

    def driver(job):
        to_job.put(("stage", job))
        kind, value = to_api.get()
        if kind == "cancel":
            raise Cancelled("cancelled")
        if kind == "raise":
            raise value
        return value

    def body():
        try:
            to_job.put(("done", call(driver)))
        except BaseException as exc:   # noqa: BLE001 - handed to the job, raised there
            to_job.put(("raise", exc))

    thread = threading.Thread(target=body, name="workbench-api", daemon=True)
    thread.start()
    finished = False
    try:
        while True:
            kind, value = to_job.get()
            if kind == "done":
                finished = True
                return value
            if kind == "raise":
                finished = True
                raise value
            try:
                result = yield from value
            except GeneratorExit:
                raise
            except Exception as exc:   # noqa: BLE001 - the API call may handle it
                to_api.put(("raise", exc))
                continue
            to_api.put(("result", result))
    finally:
        if not finished:          # closed or cancelled: stop the call at its next stage
            to_api.put(("cancel", None))
            while True:
                kind, value = to_job.get()
                if kind != "stage":
                    break
                value.close()
                to_api.put(("cancel", None))
        thread.join()


"""Python's cyclic garbage collector runs in whichever thread happens to allocate. When that is
a worker thread (the compute thread compiling a kernel, say) and the garbage holds Qt wrappers,
their QObjects are destroyed outside the GUI thread: the destructor takes a Qt lock, then waits
for the GIL, while the GUI thread holds the GIL and waits for that lock — both stop for good
(seen in the test suite: QObject::~QObject in "workbench-compute" under gc_collect_main).

`install` turns automatic collection off and collects on a timer in the GUI thread instead,
generation by generation as Python's own thresholds would (the pattern Qt applications with
Python worker threads use)."""

from __future__ import annotations

import gc

_timer = None


def install(app, interval_ms: int = 200) -> None:
    """Collect cyclic garbage in the GUI thread only, every `interval_ms` (once per process)."""
    global _timer
    if _timer is not None:
        return
    from PySide6.QtCore import QTimer
    gc.disable()
    _timer = QTimer(app)
    _timer.setInterval(interval_ms)
    _timer.timeout.connect(collect)
    _timer.start()


def collect() -> None:
    """One collection of the oldest generation whose count passed its threshold (none when
    none did), as the automatic collector would have run it."""
    counts = gc.get_count()
    limits = gc.get_threshold()
    for gen in (2, 1, 0):
        if counts[gen] > limits[gen]:
            gc.collect(gen)
            return

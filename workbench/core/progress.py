"""Long work as Qt-free generators that yield progress (DESIGN.md example 8).

A job is a generator that yields :class:`Progress` events and *returns* its result.
The CLI drives it with :func:`run` and a text bar; the GUI drives the same generator on a
worker thread and checks a cancel flag between events.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Callable, Generator, TypeVar

from workbench.core.errors import Cancelled

T = TypeVar("T")


@dataclass(frozen=True)
class Progress:
    done: float
    total: float
    message: str = ""

    @property
    def fraction(self) -> float:
        return 0.0 if self.total <= 0 else min(1.0, self.done / self.total)


Job = Generator[Progress, None, T]


def run(job: Job, on_progress: Callable[[Progress], None] | None = None,
        should_cancel: Callable[[], bool] | None = None) -> T:
    """Drive a job to completion and return its result."""
    while True:
        try:
            event = next(job)
        except StopIteration as stop:
            return stop.value
        if should_cancel is not None and should_cancel():
            job.close()
            raise Cancelled("cancelled")
        if on_progress is not None:
            on_progress(event)


def subjob(job: Job, start: float, span: float, total: float) -> Job:
    """Re-scale the progress of a nested job into [start, start+span] of `total`."""
    while True:
        try:
            ev = next(job)
        except StopIteration as stop:
            return stop.value
        yield Progress(start + span * ev.fraction, total, ev.message)


class TextProgress:
    """A single-line progress bar on stderr (only drawn when stderr is a terminal or forced)."""

    def __init__(self, stream=None, enabled: bool | None = None, width: int = 30):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.width = width
        self._last = 0.0
        self._drawn = False

    def __call__(self, ev: Progress) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < 0.1 and ev.fraction < 1.0:
            return
        self._last = now
        filled = int(self.width * ev.fraction)
        bar = "#" * filled + "-" * (self.width - filled)
        msg = ev.message[:50]
        self.stream.write(f"\r[{bar}] {100 * ev.fraction:5.1f}% {msg:<50}")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\r" + " " * (self.width + 60) + "\r")
            self.stream.flush()
            self._drawn = False


class LineProgress:
    """Progress as plain lines on stderr, for a log or a pipe: the first event, then at least
    every `every` seconds, and the end (percent, the job's message, elapsed time and ETA)."""

    def __init__(self, stream=None, every: float = 10.0, label: str = "",
                 first_after: float = 0.0):
        self.stream = stream or sys.stderr
        self.every = every
        #: seconds before the first line: a job done (or failed) sooner prints nothing
        self.first_after = first_after
        self.label = f"{label}: " if label else ""
        self._t0 = None
        self._last = None
        self._ended = False

    def __call__(self, ev: Progress) -> None:
        now = time.monotonic()
        if self._t0 is None:
            self._t0 = now
        end = ev.fraction >= 1
        if self._last is None and now - self._t0 < self.first_after:
            return
        if self._last is not None and now - self._last < self.every and not (
                end and not self._ended):
            return
        self._last = now
        self._ended = self._ended or end
        spent = now - self._t0
        f = ev.fraction
        eta = f"ETA {_clock(spent * (1 - f) / f)}" if 0.01 <= f < 1 and spent > 1 else "ETA -"
        self.stream.write(f"{self.label}{100 * f:5.1f}% {ev.message} "
                          f"({_clock(spent)} elapsed, {eta})\n")
        self.stream.flush()


def _clock(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"

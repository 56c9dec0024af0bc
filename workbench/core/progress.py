"""Long work as Qt-free generators that yield progress (DESIGN.md example 8).

A job is a generator that yields :class:`Progress` events and *returns* its result.
The CLI drives it with :func:`run` and a text bar; the GUI drives the same generator on a
worker thread and checks a cancel flag between events.
"""

from __future__ import annotations

import re
import sys
import threading
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


def prefixed(job: Job, prefix: str) -> Job:
    """A nested job's events with `prefix` before their messages (which of several runs)."""
    while True:
        try:
            ev = next(job)
        except StopIteration as stop:
            return stop.value
        yield Progress(ev.done, ev.total, prefix + ev.message)


class TextProgress:
    """A single-line progress bar on stderr (only drawn when stderr is a terminal or forced):
    percent, i/N and the stage (as LineProgress), and the ETA."""

    def __init__(self, stream=None, enabled: bool | None = None, width: int = 30):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.width = width
        self._last = 0.0
        self._drawn = False
        self._t0 = None
        self._ref = None

    def __call__(self, ev: Progress) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if self._t0 is None:
            self._t0 = now
        if self._ref is None or ev.fraction <= self._ref[1]:
            self._ref = (now, ev.fraction)
        if now - self._last < 0.1 and ev.fraction < 1.0:
            return
        self._last = now
        filled = int(self.width * ev.fraction)
        bar = "#" * filled + "-" * (self.width - filled)
        msg = (_count(ev) + ev.message)[:40]         # (as wide as the bar was without ETA)
        eta = _eta(now - self._t0, self._ref, now, ev.fraction, 1.0)
        self.stream.write(f"\r[{bar}] {100 * ev.fraction:5.1f}% {msg:<40} {eta:<11}")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\r" + " " * (self.width + 62) + "\r")
            self.stream.flush()
            self._drawn = False


def default_progress():
    """What a library call shows when given no `progress`: a single line updated in place on
    a terminal or in Jupyter (its stderr redraws a carriage return in place), else (a script's
    stderr sent to a file) a plain line once the work has run 10 s, then every 10 s. Call its
    ``close()`` when the work ends."""
    stream = sys.stderr
    try:
        live = bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        live = False
    if live or "ipykernel" in sys.modules:
        return TextProgress(stream, enabled=True)
    return LineProgress(stream, every=10.0, first_after=10.0)


class LineProgress:
    """Progress as plain lines on stderr, for a log or a pipe: the first once the job has run
    `first_after` seconds, then at least every `every` seconds, and the end. A line holds the
    percent, i/N (the event's done/total when they count steps and the message has no count of
    its own), the job's message (its stage), the elapsed time and the ETA (at the rate since
    the fraction started moving: a set-up of seconds at 0 % does not inflate it):
    ``  42.5% 17/40 gptq model.layers.3.mlp.up_proj (1m05s elapsed, ETA 1m28s)``.

    With `heartbeat`, a daemon thread repeats the latest event's line (elapsed and ETA brought
    up to date) whenever `every` seconds pass without one, so a step that runs longer than
    `every` (one tensor's GPTQ, a numba compile) still shows the job alive; call :meth:`close`
    when the job ends (the driver does)."""

    def __init__(self, stream=None, every: float = 10.0, label: str = "",
                 first_after: float = 0.0, heartbeat: bool = False):
        self.stream = stream or sys.stderr
        self.every = every
        #: seconds before the first line: a job done (or failed) sooner prints nothing
        self.first_after = first_after
        self.label = f"{label}: " if label else ""
        self._t0 = None
        self._last = None
        self._ended = False
        self._event = None
        self._ref = None        # (time, fraction) when the fraction last stood at its first value
        self._top = 0.0         # the highest fraction since the reference
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        if heartbeat:
            self._t0 = time.monotonic()
            self._thread = threading.Thread(target=self._beat, name="progress-heartbeat",
                                            daemon=True)
            self._thread.start()

    def __call__(self, ev: Progress) -> None:
        with self._lock:
            now = time.monotonic()
            if self._t0 is None:
                self._t0 = now
            self._event = ev
            if self._ref is None or ev.fraction <= self._ref[1] or ev.fraction < self._top:
                # not moving yet (the set-up is not the rate), or gone back (a job counting
                # its stages from 0 each: the rate before says nothing of what is left)
                self._ref = (now, ev.fraction)
            self._top = ev.fraction if ev.fraction <= self._ref[1] else max(self._top,
                                                                              ev.fraction)
            end = ev.fraction >= 1
            if self._last is None and now - self._t0 < self.first_after:
                return
            if self._last is not None and now - self._last < self.every and not (
                    end and not self._ended):
                return
            self._ended = self._ended or end
            self._write(ev, now)

    def _beat(self) -> None:
        while not self._stop.wait(min(1.0, max(0.05, self.every / 4))):
            with self._lock:
                now = time.monotonic()
                due = self._t0 + self.first_after if self._last is None \
                    else self._last + self.every
                if now >= due:         # (after a 100 % event too: the job has not returned)
                    self._write(self._event or Progress(0, 0, "starting"), now)

    def _write(self, ev: Progress, now: float) -> None:
        self._last = now
        spent = now - self._t0
        f = ev.fraction
        eta = _eta(spent, self._ref, now, f, min(1.0, self.every))
        try:
            self.stream.write(f"{self.label}{100 * f:5.1f}% {_count(ev)}{ev.message} "
                              f"({_clock(spent)} elapsed, {eta})\n")
            self.stream.flush()
        except (OSError, ValueError):   # a closed pipe: progress is not worth failing for
            pass

    @property
    def last_line(self) -> float | None:
        """When the last line was written (time.monotonic), None before any."""
        return self._last

    def close(self) -> None:
        """Stop the heartbeat (idempotent)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


#: a larger event total counts bytes or elements, not steps (no i/N for it)
MAX_STEPS = 100_000
_COUNT = re.compile(r"\d+\s*/\s*\d+")


def _count(ev: Progress) -> str:
    """'i/N ' from the event when its total counts steps (a whole number from 2 to
    MAX_STEPS: not bytes or elements; not 100, the jobs' percent) and its message does not
    already hold a count."""
    t = ev.total
    if not 1 < t <= MAX_STEPS or t == 100 or t != int(t) or _COUNT.search(ev.message):
        return ""
    return f"{min(int(ev.done), int(t))}/{int(t)} "


def _eta(spent: float, ref, now: float, f: float, settle: float) -> str:
    """'ETA 1m22s' at the rate since the fraction started moving (`ref`: (time, fraction)
    when it last stood at its first value), once the job has run `settle` seconds and moved
    1 %; 'ETA -' before, and at the end."""
    if ref is None or f >= 1 or spent < settle or f - ref[1] < 0.01:
        return "ETA -"
    return f"ETA {_clock((now - ref[0]) * (1 - f) / (f - ref[1]))}"


def _clock(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"

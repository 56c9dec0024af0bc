"""The work queue (issue 33): one status area under the views that lists every job running or
waiting on the compute thread and the user lane (statistics, error evaluation, the end-to-end
check, sensitivity tables, the frontier, export checks, kernel compilation…), each with its
progress (i/N or %, the stage it is at, time left) and a Cancel button that stops it.

A task is listed once it has waited or run SHOW_AFTER_MS (the evaluation after an edit takes
tens of milliseconds: listing it would only flash); the list is redrawn on a timer while it
shows anything, never per progress event, so the GUI thread does a bounded amount of work
however fast the jobs report. `waiting_text` gives the panels that wait for a job the words
to say so ("End-to-end check: queued behind Sensitivity (weight)", "… running 40/98")."""

from __future__ import annotations

import time

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from .fit_label import never_widens, thin_bar

SHOW_AFTER_MS = 250
REFRESH_MS = 200
MAX_ROWS = 6

STYLE = """
QFrame#WorkQueue { background: #1d2027; border: 1px solid #2e333d; border-radius: 6px; }
QFrame#WorkQueue QLabel { background: transparent; }
QLabel#QueueState { font-size: 7pt; font-weight: bold; border-radius: 3px; padding: 0 4px; }
QLabel#QueueState[state="running"] { background: #1d3b26; color: #56d364; }
QLabel#QueueState[state="paused"] { background: #3a3320; color: #f2cc60; }
QLabel#QueueState[state="queued"] { background: #2e333d; color: #8a92a3; }
QPushButton#QueueCancel { padding: 0 8px; font-size: 8pt; }
QProgressBar#QueueBar { max-height: 10px; }
"""


def fmt_eta(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 60:
        return f"~{max(1, round(seconds))} s left"
    if seconds < 3600:
        return f"~{round(seconds / 60)} min left"
    return f"~{seconds / 3600:.1f} h left"


def task_line(task, state: str, ahead=None, stage: bool = True, figures: bool = True) -> str:
    """One task's state in words: 'running 40/98 · stage · ~12 s left', 'queued behind X',
    'paused for X' (X: the task running in its lane); `stage`: with the stage text; without
    `figures`, 'running' alone (a panel beside the one that shows the progress)."""
    if state == "running" and not figures:
        return "running (its progress: the budget panel and the work queue)"
    if state == "running":
        parts = ["running"]
        if task.progress_text():
            parts[0] += f" {task.progress_text()}"
        if stage and task.message and task.message != task.name:
            parts.append(task.message)
        if fmt_eta(task.eta_s()):
            parts.append(fmt_eta(task.eta_s()))
        return " · ".join(parts)
    who = f" {ahead.name}" if ahead is not None else " other work"
    if state == "paused":
        return f"paused for{who}"
    return f"queued behind{who}"


def find(runner, prefix: str):
    """(task, state, the task ahead of it) of the first unfinished task whose name starts with
    `prefix`, or None."""
    rows = runner.snapshot()
    ahead = {}
    for t, st in rows:
        if st == "running":
            ahead[t.lane] = t
    for t, st in rows:
        if t.name.startswith(prefix) and not t.finished:
            return t, st, ahead.get(t.lane) if st != "running" else None
    return None


def state_of(runner, task) -> tuple[str, object]:
    """(state, the task ahead of it) of one task: 'running', 'paused', 'queued' or, when it is
    in no queue any more, 'finished'."""
    rows = runner.snapshot()
    ahead = next((t for t, st in rows if st == "running" and t.lane == task.lane), None)
    for t, st in rows:
        if t is task:
            return st, None if st == "running" else ahead
    return "finished", None


def waiting_text(runner, prefix: str, what: str | None = None) -> str | None:
    """'waiting for the end-to-end check: running 5/16 · …' for a panel that waits on the
    task named `prefix…` (None when no such task is queued or running)."""
    if runner is None:
        return None
    hit = find(runner, prefix)
    if hit is None:
        return None
    task, state, ahead = hit
    return f"waiting for {what or task.name}: {task_line(task, state, ahead)}"


class _Row(QWidget):
    cancelled = Signal(object)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.task = None
        self.state = QLabel("")
        self.state.setObjectName("QueueState")
        self.state.setFixedWidth(58)
        self.state.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.name = QLabel("")
        self.name.setObjectName("QueueName")
        self.name.setStyleSheet("font-weight: bold;")
        self.name.setFixedWidth(260)
        self.bar = thin_bar("QueueBar", fixed=140)
        self.count = QLabel("")
        self.count.setObjectName("QueueProgress")
        self.count.setFixedWidth(80)
        self.count.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.detail = QLabel("")
        self.detail.setObjectName("Muted")
        never_widens(self.detail)
        self.cancel = QPushButton("Cancel")
        self.cancel.setObjectName("QueueCancel")
        self.cancel.clicked.connect(lambda: self.cancelled.emit(self.task))
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(8)
        lay.addWidget(self.state)
        lay.addWidget(self.name)
        lay.addWidget(self.bar)
        lay.addWidget(self.count)
        lay.addWidget(self.detail, 1)
        lay.addWidget(self.cancel)

    def fill(self, task, state: str, ahead) -> None:
        self.task = task
        if self.state.text() != state:
            self.state.setText(state)
            self.state.setProperty("state", state)
            self.state.style().unpolish(self.state)
            self.state.style().polish(self.state)
        fm = self.name.fontMetrics()
        self.name.setText(fm.elidedText(task.name, Qt.TextElideMode.ElideRight,
                                        self.name.width()))
        self.name.setToolTip(task.name)
        self.bar.setValue(int(1000 * task.fraction) if task.started else 0)
        self.count.setText(task.progress_text() if task.started else "")
        line = task_line(task, state, ahead)
        # the count has its own column: the detail says the rest
        if state == "running" and task.progress_text():
            line = line.replace(f"running {task.progress_text()}", "running", 1)
        self.detail.setText(line)
        self.detail.setToolTip(line)
        self.cancel.setToolTip(f"Cancel {task.name}")


class WorkQueuePanel(QFrame):
    """Every running and waiting job, with its progress and a Cancel button. Placed over its
    parent's bottom-right corner (:meth:`anchor`), not in a layout: showing and hiding it never
    moves the plots or the table."""

    MARGIN = 8          # from the parent's edges
    MAX_WIDTH = 620

    def __init__(self, runner, parent=None):
        super().__init__(parent)
        self.runner = runner
        self.setObjectName("WorkQueue")
        self.setStyleSheet(STYLE)
        self.header = QLabel("")
        self.header.setProperty("role", "caption")
        self.more = QLabel("")
        self.more.setObjectName("Muted")
        never_widens(self.more)
        self.cancel_all = QPushButton("Cancel all")
        self.cancel_all.setObjectName("QueueCancel")
        self.cancel_all.setToolTip("Cancel every job listed here (Esc)")
        self.cancel_all.clicked.connect(runner.cancel_all)
        head = QHBoxLayout()
        head.setContentsMargins(0, 0, 0, 0)
        head.addWidget(self.header, 1)
        head.addWidget(self.cancel_all)
        self.rows: list[_Row] = []
        self._lay = QVBoxLayout(self)
        self._lay.setContentsMargins(10, 4, 6, 4)
        self._lay.setSpacing(2)
        self._lay.addLayout(head)
        for _ in range(MAX_ROWS):
            r = _Row(self)
            r.cancelled.connect(self._cancel)
            r.hide()
            self.rows.append(r)
            self._lay.addWidget(r)
        self._lay.addWidget(self.more)
        self.more.hide()
        self.shown: list = []        # the tasks listed now (tests)
        self._timer = QTimer(self, interval=REFRESH_MS)
        self._timer.timeout.connect(self.refresh)
        runner.taskSubmitted.connect(self._wake)
        runner.taskStarted.connect(self._wake)
        runner.taskFinished.connect(self._finished)
        self.setVisible(False)

    def anchor(self) -> None:
        """Float over the parent's bottom-right corner, following its size."""
        self.parentWidget().installEventFilter(self)
        self.place()

    def eventFilter(self, obj, event) -> bool:
        from PySide6.QtCore import QEvent
        if obj is self.parentWidget() and event.type() == QEvent.Type.Resize:
            self.place()
        return super().eventFilter(obj, event)

    def place(self) -> None:
        parent = self.parentWidget()
        if parent is None:
            return
        m = self.MARGIN
        w = max(1, min(self.MAX_WIDTH, parent.width() - 2 * m))
        self.setFixedWidth(w)
        h = min(self.sizeHint().height(), max(1, parent.height() - 2 * m))
        self.setGeometry(parent.width() - w - m, parent.height() - h - m, w, h)
        self.raise_()

    def _wake(self, _task=None) -> None:
        if not self._timer.isActive():
            self._timer.start()

    def _finished(self, task) -> None:
        if task in self.shown:       # a finished task leaves the list at once
            self.refresh()

    def _cancel(self, task) -> None:
        if task is not None:
            task.cancel()
            self.refresh()

    def listed(self) -> list[tuple]:
        """(task, state, the task ahead) of what the list shows (older than SHOW_AFTER_MS)."""
        now = time.monotonic()
        rows = self.runner.snapshot()
        ahead = {t.lane: t for t, st in rows if st == "running"}
        out = []
        for t, st in rows:
            if t.finished or t.cancelled:
                continue
            since = t.started_at if st == "running" and t.started_at else t.submitted_at
            if (now - min(since, t.submitted_at)) * 1000 < SHOW_AFTER_MS:
                continue
            out.append((t, st, None if st == "running" else ahead.get(t.lane)))
        return out

    def refresh(self) -> None:
        items = self.listed()
        self.shown = [t for t, _, _ in items]
        if not items:
            if self.isVisible():
                self.setVisible(False)
            if self.runner.idle():
                self._timer.stop()
            return
        running = sum(1 for _, st, _ in items if st == "running")
        waiting = len(items) - running
        self.header.setText(f"WORK QUEUE · {running} running · {waiting} waiting")
        for i, row in enumerate(self.rows):
            if i < len(items):
                row.fill(*items[i])
                row.show()
            else:
                row.task = None
                row.hide()
        extra = len(items) - len(self.rows)
        # named, so every pending job is listed (the end-to-end check and the compilation
        # were "+ 2 more waiting" on SmolLM2)
        rest = ", ".join(t.name for t, _, _ in items[len(self.rows):])
        self.more.setText(f"+ {extra} more waiting: {rest}" if extra > 0 else "")
        self.more.setToolTip(rest)
        self.more.setVisible(extra > 0)
        if not self.isVisible():
            self.setVisible(True)
        self.place()                 # its rows changed: as tall as they need

"""Status-bar progress: the running task's message, a progress bar and Cancel.

A task shows here once it has run for SHOW_AFTER_MS (then with every progress event): the
evaluation after an edit takes tens of milliseconds, and flashing a bar for it cost the GUI
thread a synchronous repaint (QProgressBar.setValue repaints at once) per event while the
compute thread was finishing the figure the totals wait for."""

from __future__ import annotations

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QWidget

from .fit_label import thin_bar


SHOW_AFTER_MS = 250


class ProgressPanel(QWidget):
    def __init__(self, runner, parent=None, hidden_by=None):
        super().__init__(parent)
        self.runner = runner
        self.task = None
        #: a panel that lists the same work (the work queue): while it shows, this one hides
        self.hidden_by = hidden_by
        self._delay = QTimer(self, singleShot=True, interval=SHOW_AFTER_MS)
        self._delay.timeout.connect(self._delayed)
        self.label = QLabel("")
        self.label.setObjectName("Muted")
        self.bar = thin_bar(fixed=180)
        self.cancel = QPushButton("Cancel")
        self.cancel.setObjectName("CancelButton")
        self.cancel.clicked.connect(self._cancel)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.label)
        lay.addWidget(self.bar)
        lay.addWidget(self.cancel)
        runner.taskStarted.connect(self._started)
        runner.taskProgress.connect(self._progress)
        runner.taskFinished.connect(self._finished)
        self.setVisible(False)

    def _started(self, task) -> None:
        if task.visible:
            self.task = task
            self._show(task)

    def _progress(self, task) -> None:
        if task.visible:
            self.task = task
            self._show(task)

    def _show(self, task) -> None:
        if not self.isVisible():
            if not self._delay.isActive():
                self._delay.start()
            return
        self._fill(task)

    def _delayed(self) -> None:
        task = self.task
        if task is not None and not task.finished:
            self._fill(task)

    def _fill(self, task) -> None:
        if self.hidden_by is not None and (self.hidden_by.isVisible()
                                           or self.hidden_by.listed()):
            # the overview shows it (or will at its next redraw: what it lists is what has
            # run as long as this panel's own delay): never the same progress twice
            self.setVisible(False)
            return
        text = task.message or task.name
        self.label.setText(text if len(text) < 70 else text[:67] + "…")
        self.bar.setValue(int(1000 * task.fraction))
        self.setVisible(True)

    def _finished(self, task) -> None:
        if task is self.task:
            others = [t for t in self.runner.tasks() if t.visible and not t.finished]
            self.task = others[0] if others else None
            if self.task is None:
                self._delay.stop()
                self.setVisible(False)
            else:
                self._show(self.task)

    def _cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()

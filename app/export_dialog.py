"""The Export dialog: every format in the exporter registry, run as the CLI runs it."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import (QComboBox, QDialog, QFileDialog, QFormLayout, QHBoxLayout,
                               QLabel, QLineEdit, QProgressBar, QPushButton, QVBoxLayout)

from workbench.export import export, list_exporters

from .workers import FOREGROUND


class ExportDialog(QDialog):
    def __init__(self, doc, runner, last_dir: str = "", parent=None, messages=None,
                 settings=None):
        super().__init__(parent)
        self.messages = messages
        self.settings = settings
        self.setWindowTitle("Export")
        self.setMinimumWidth(560)
        self.doc = doc
        self.runner = runner
        self.task = None
        self.result_info = None
        self.error = None
        self.exporters = list_exporters()
        self.format = QComboBox()
        for e in self.exporters:
            self.format.addItem(f"{e.name}  ({e.suffix})", e.name)
        self.description = QLabel()
        self.description.setWordWrap(True)
        self.description.setObjectName("Muted")
        stem = Path(doc.model.path).stem if doc.model is not None else "model"
        self._dir = Path(last_dir) if last_dir else Path.cwd()
        self._stem = stem
        self.path = QLineEdit()
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        row = QHBoxLayout()
        row.addWidget(self.path, 1)
        row.addWidget(browse)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.status = QLabel("")
        self.export_button = QPushButton("Export")
        self.export_button.setDefault(True)
        self.cancel_button = QPushButton("Close")
        self.export_button.clicked.connect(lambda: self.start())
        self.cancel_button.clicked.connect(self._cancel_or_close)
        form = QFormLayout()
        form.addRow("Format", self.format)
        form.addRow("", self.description)
        form.addRow("Output", row)
        buttons = QHBoxLayout()
        buttons.addWidget(self.status, 1)
        buttons.addWidget(self.export_button)
        buttons.addWidget(self.cancel_button)
        lay = QVBoxLayout(self)
        lay.addLayout(form)
        lay.addWidget(self.progress)
        lay.addLayout(buttons)
        self.format.currentIndexChanged.connect(self._format_changed)
        self._format_changed()

    def exporter(self):
        return self.exporters[self.format.currentIndex()]

    def _format_changed(self) -> None:
        e = self.exporter()
        self.description.setText(e.description)
        current = self.path.text().strip()
        base = Path(current).parent if current else self._dir
        self.path.setText(str(base / f"{self._stem}-{e.name}{e.suffix}"))

    def _browse(self) -> None:
        e = self.exporter()
        path, _ = QFileDialog.getSaveFileName(self, "Export to", self.path.text(), f"*{e.suffix}")
        if path:
            self.path.setText(path)

    def start(self, fmt: str | None = None, out_path: str | None = None):
        """Run the export (on the compute thread). Returns the task."""
        if fmt is not None:
            self.format.setCurrentIndex([e.name for e in self.exporters].index(fmt))
        if out_path is not None:
            self.path.setText(str(out_path))
        model, plan, name = self.doc.model, self.doc.plan, self.exporter().name
        target = self.path.text().strip()
        self.result_info = self.error = None
        if not target:
            self.status.setText("choose an output file")
            return None
        tp = Path(target).expanduser()
        if tp.exists():
            from workbench.atomic import refuse_overwriting_inputs
            from workbench.errors import WorkbenchError
            try:
                refuse_overwriting_inputs(model, tp)
            except WorkbenchError as exc:
                self._failed(str(exc))
                return None
            if self.messages is not None and not self.messages.ask(
                    "Replace file?", f"{tp.name} already exists in {tp.parent}.\nReplace it?"):
                self.status.setText("not exported: the existing file is kept")
                return None
        self.export_button.setEnabled(False)
        self.cancel_button.setText("Cancel")
        self.status.setText(f"exporting {name}…")
        self.task = self.runner.submit(lambda: export(model, plan, name, target),
                                       f"Exporting {name}", FOREGROUND, visible=True,
                                       on_done=self._done, on_error=self._failed,
                                       on_cancel=self._cancelled, on_progress=self._progress)
        return self.task

    def _progress(self, ev) -> None:
        self.progress.setValue(int(1000 * ev.fraction))
        self.status.setText(ev.message[:60])

    def _done(self, info) -> None:
        self.result_info = info or {}
        if self.settings is not None:
            self.settings.setValue("export_dir", str(Path(self.path.text()).expanduser().parent))
        self.progress.setValue(1000)
        self.status.setText(f"wrote {self.path.text()}")
        self._idle()

    def _failed(self, message: str) -> None:
        self.error = message
        self.status.setText(message.split("\n")[0][:120])
        self._idle()

    def _cancelled(self) -> None:
        self.status.setText("cancelled; nothing written")
        self._idle()

    def _idle(self) -> None:
        self.export_button.setEnabled(True)
        self.cancel_button.setText("Close")

    def _cancel_or_close(self) -> None:
        if self.task is not None and not self.task.finished:
            self.task.cancel()
        else:
            self.accept()

"""The Export dialog: every format in the exporter registry, run as the CLI runs it.

Before anything is exported, each format is checked against the current plan
(workbench.export.preflight, as `export --check`) on the runner's user lane, so the check
answers in seconds even while a sensitivity table or the end-to-end check holds the compute
thread (issue 33). Until it is done Export is disabled and the dialog says how far the check
is; then the formats the plan cannot be written to are disabled in the list (the reason as
their tooltip), the format offered first is one that can write it (the user's last format
when it can), and Export stays disabled for a format that cannot.

The onnx check asks transformers whether it knows the model's type: its first import (with
torch) takes 10 s quiet and 40 s on a busy machine. Until transformers is loaded, that format
is checked in a second task behind the others: the dialog answers for the rest first, and
lists onnx as still being checked (not offered until it is)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor, QStandardItemModel
from PySide6.QtWidgets import (QComboBox, QDialog, QFileDialog, QFormLayout, QHBoxLayout,
                               QLabel, QLineEdit, QProgressBar, QPushButton, QVBoxLayout)

from workbench.api.plans import list_exporters

from .workers import FOREGROUND, INTERACTIVE, USER

#: formats whose check imports transformers (and torch): checked behind the others until
#: transformers is loaded
SLOW = ("onnx",)
#: a format check's level (workbench.export.preflight.Preflight.level): colour and mark
VERDICT = {"ok": ("#3fb950", "✓"), "warning": ("#d29922", "⚠"), "no": ("#f85149", "✗")}
from .fit_label import never_widens


class ExportDialog(QDialog):
    def __init__(self, doc, runner, last_dir: str = "", parent=None, messages=None,
                 settings=None):
        super().__init__(parent)
        self.messages = messages
        self.settings = settings
        self.setWindowTitle("Export")
        self.setMinimumWidth(640)
        self.doc = doc
        self.runner = runner
        self.task = None
        self.result_info = None
        self.error = None
        self.exporters = list_exporters()
        self.checks: dict | None = None       # format -> workbench.export.preflight.Preflight
        self.pending: set[str] = set()        # formats checked behind the others (SLOW)
        self.slow_task = None
        self._user_chose = False
        self.format = QComboBox()
        for e in self.exporters:
            self.format.addItem(self._item_text(e, None), e.name)
        self.format.activated.connect(lambda _i: setattr(self, "_user_chose", True))
        self.verdicts = QLabel("")
        self.verdicts.setObjectName("ExportVerdicts")
        self.verdicts.setWordWrap(True)
        self.verdicts.setTextFormat(Qt.TextFormat.RichText)
        self.verdicts.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
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
        never_widens(self.status)
        self.status.setWordWrap(True)      # a long result wraps: never cut at the dialog's edge
        # an export's error, whole (word-wrapped, selectable); cleared when the format changes
        self.error_label = QLabel("")
        self.error_label.setObjectName("ExportError")
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet("color: #f85149;")
        self.error_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.error_label.hide()
        self.export_button = QPushButton("Export")
        self.export_button.setDefault(True)
        self.cancel_button = QPushButton("Close")
        self.export_button.clicked.connect(lambda: self.start())
        self.cancel_button.clicked.connect(self._cancel_or_close)
        form = QFormLayout()
        form.addRow("Format", self.format)
        form.addRow("", self.description)
        form.addRow("Output", row)
        form.addRow("Formats", self.verdicts)
        buttons = QHBoxLayout()
        buttons.addWidget(self.status, 1)
        buttons.addWidget(self.export_button)
        buttons.addWidget(self.cancel_button)
        lay = QVBoxLayout(self)
        lay.addLayout(form)
        lay.addWidget(self.progress)
        lay.addWidget(self.error_label)
        lay.addStretch(1)
        lay.addLayout(buttons)
        self.format.currentIndexChanged.connect(self._format_changed)
        self.check_task = None
        self._check_error = None
        self._format_changed()
        if doc.model is not None:
            model, plan = doc.model, doc.plan
            names = [e.name for e in self.exporters]
            from .method_compare import transformers_ready
            slow = [] if transformers_ready() else [n for n in names if n in SLOW]
            fast = [n for n in names if n not in slow]
            # metadata only (no kernel, no network): the user lane, never behind other jobs
            self.check_task = runner.submit(lambda: check_job(model, plan, fast),
                                            "Checking export formats", INTERACTIVE, lane=USER,
                                            visible=True, on_done=self._checked,
                                            on_error=self._check_failed,
                                            on_progress=self._check_progress,
                                            on_cancel=lambda: self._check_failed("cancelled"))
            if slow:
                self.pending = set(slow)
                self.slow_task = runner.submit(
                    lambda: check_job(model, plan, slow),
                    f"Checking export formats: {', '.join(slow)} (loads transformers)",
                    INTERACTIVE, lane=USER, visible=True, on_done=self._checked_slow,
                    on_error=lambda m: self._slow_failed(slow, m.split("\n")[0]),
                    on_cancel=lambda: self._slow_failed(slow, "cancelled"))
        self._checking_text(0, len(self.exporters), "")

    # ---- what each format can write ---------------------------------------------------------
    @staticmethod
    def _item_text(e, check, pending: bool = False) -> str:
        mark = "  … still checking" if pending else "" if check is None else {
            "ok": "  ✓", "warning": "  ⚠ not all the plan asks",
            "no": "  ✗ cannot write this plan"}[check.level]
        return f"{e.name}  ({e.suffix or 'folder'}){mark}"

    def checking(self) -> bool:
        """The format check has not answered yet."""
        return self.checks is None and self._check_error is None and self.doc.model is not None

    def _checking_text(self, done: int, total: int, message: str) -> None:
        if not self.checking():
            return
        self.progress.setVisible(True)
        self.verdicts.setText(f"checking which formats can write this plan: {done}/{total}"
                              + (f" · {_esc(message)}" if message else ""))
        self.status.setText("Export is enabled when the check is done")
        self.progress.setValue(int(1000 * done / max(total, 1)))

    def _check_progress(self, ev) -> None:
        self._checking_text(int(ev.done), int(ev.total), ev.message)

    def _checked(self, checks, choose: bool = True) -> None:
        from workbench.api.plans import best_format
        if self.checks is None:
            checks = {**checks, **getattr(self, "_slow_results", {})}
        self.checks = dict(checks) if self.checks is None else {**self.checks, **checks}
        checks = self.checks
        self.progress.setValue(0)
        self.progress.setVisible(False)      # shown again while exporting (a format still
        #                                      checked says so in its own line)
        model = self.format.model()
        for i, e in enumerate(self.exporters):
            c = checks.get(e.name)
            pending = e.name in self.pending
            self.format.setItemText(i, self._item_text(e, c, pending))
            if pending and isinstance(model, QStandardItemModel):
                model.item(i).setEnabled(False)   # offered once its check says it can write
                self.format.setItemData(i, "still being checked (transformers loading)",
                                        Qt.ItemDataRole.ToolTipRole)
            if c is not None:
                self.format.setItemData(i, c.text(), Qt.ItemDataRole.ToolTipRole)
                if isinstance(model, QStandardItemModel):
                    model.item(i).setEnabled(c.ok)
                if not c.ok:
                    self.format.setItemData(i, QBrush(QColor("#8a92a3")),
                                            Qt.ItemDataRole.ForegroundRole)
        rows = []
        for e in self.exporters:
            c = checks.get(e.name)
            if e.name in self.pending:
                task = self.slow_task
                how = f" {task.progress_text()}" if task is not None and task.started else ""
                rows.append(f"<tr><td style='color:#8a92a3; padding-right:6px'>…</td>"
                            f"<td style='padding-right:8px'><b>{e.name}</b></td>"
                            f"<td>still checking{how} (transformers loads: seconds)</td></tr>")
                continue
            if c is None:
                continue
            colour, mark = VERDICT[c.level]
            rows.append(f"<tr><td style='color:{colour}; padding-right:6px'>{mark}</td>"
                        f"<td style='padding-right:8px'><b>{e.name}</b></td>"
                        f"<td>{_esc(_short(c.text()))}</td></tr>")
        self.verdicts.setText("<table cellspacing='2'>" + "".join(rows) + "</table>")
        self.verdicts.setToolTip("\n\n".join(f"{f}: {c.text()}" for f, c in checks.items()))
        chosen = checks.get(self.exporter().name)
        if (choose and not self._user_chose) or (chosen is not None and not chosen.ok) or \
                self.exporter().name in self.pending:
            preferred = self.settings.value("export_format", "") if self.settings is not None \
                else ""
            best = best_format(checks, str(preferred or "") or None)
            names = [e.name for e in self.exporters]
            if best in names and checks[best].ok:
                self.format.setCurrentIndex(names.index(best))
        self._format_changed()
        self._fit()

    def _checked_slow(self, checks) -> None:
        """The formats checked behind the others: their verdicts join the list (the format
        offered is kept unless it cannot write the plan)."""
        self.pending -= set(checks)
        if self.checks is None:          # the first check failed or is still out: keep them
            self._slow_results = {**getattr(self, "_slow_results", {}), **checks}
            return
        self._checked(checks, choose=False)

    def _slow_failed(self, names, message: str) -> None:
        from workbench.api.plans import Preflight
        self._checked_slow({n: Preflight(n, False, f"could not check: {message}", None)
                            for n in names})

    def _fit(self) -> None:
        """Grow to show every line (labels wrap; nothing clipped)."""
        self.layout().activate()
        self.resize(self.width(), max(self.height(), self.sizeHint().height(),
                                      self.layout().totalHeightForWidth(self.width())))

    def _check_failed(self, message: str) -> None:
        """The check failed (or was cancelled): Export is offered; the exporter refuses a plan
        it cannot write with its own message."""
        self._check_error = message.split("\n")[0]
        self.progress.setValue(0)
        self.progress.setVisible(False)
        self.verdicts.setText(f"could not check the formats: {_esc(self._check_error)}")
        self._format_changed()

    def check(self, name: str | None = None):
        """The preflight of a format (default: the selected one); None while checking."""
        if self.checks is None:
            return None
        return self.checks.get(name or self.exporter().name)

    def exporter(self):
        return self.exporters[self.format.currentIndex()]

    def _format_changed(self) -> None:
        e = self.exporter()
        self.description.setText(e.description)
        self._show_error(None)
        c = self.check(e.name)
        busy = self.task is not None and not self.task.finished
        pending = e.name in self.pending
        self.export_button.setEnabled(not busy and not self.checking() and not pending
                                      and (c is None or c.ok))
        if pending:
            self.status.setText(f"{e.name} is still being checked")
        elif c is not None and not c.ok:
            self.status.setText(f"{e.name} cannot write this plan (see Formats)")
        elif self.checking():
            self.status.setText("Export is enabled when the check is done")
        elif not busy:
            self.status.setText("")
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
            self._user_chose = True
            self.format.setCurrentIndex([e.name for e in self.exporters].index(fmt))
        if out_path is not None:
            self.path.setText(str(out_path))
        model, plan, name = self.doc.model, self.doc.plan, self.exporter().name
        target = self.path.text().strip()
        self.result_info = self.error = None
        self._show_error(None)
        if self.checking() or name in self.pending:
            self.status.setText("Export is enabled when the check is done")
            return None
        c = self.check(name)
        if c is not None and not c.ok:
            self._failed(f"{name} cannot write this plan: {c.reason}")
            return None
        if not target:
            self.status.setText("choose an output file")
            return None
        tp = Path(target).expanduser()
        overwrite = False
        if tp.exists():
            from workbench.core.errors import WorkbenchError
            from workbench.core.outputs import check_output
            folder = self.exporter().kind == "folder"
            try:    # the export door's checks (an input, a folder that cannot be written)
                check_output(tp, kind=self.exporter().kind, model=model, overwrite=True,
                             inputs={"the session file": getattr(self.parent(), "session_path",
                                                                 None)})
            except WorkbenchError as exc:
                self._failed(str(exc))
                return None
            what = "folder" if folder else "file"
            if self.messages is not None and not self.messages.ask(
                    f"Replace {what}?", f"{tp.name} already exists in {tp.parent}.\n"
                    + ("Everything in it will be replaced by the export.\n" if folder else "")
                    + "Replace it?"):
                self.status.setText(f"not exported: the existing {what} is kept")
                return None
            overwrite = True
        self.export_button.setEnabled(False)
        self.progress.setValue(0)
        self.progress.setVisible(True)
        self.cancel_button.setText("Cancel")
        self.status.setText(f"exporting {name}…")
        def job():
            # the API's export, as `quant-workbench export` runs it: the plan's methods
            # (imatrix, GPTQ, AWQ) fitted and applied, the format's runtime rules
            from workbench import api

            from .api_jobs import api_job
            from .cluster_setting import executor_of
            ex = executor_of(self.runner)
            return api_job(lambda drive: api.export_plan(
                model, plan, name, target, overwrite=overwrite, executor=ex, driver=drive))

        self.task = self.runner.submit(job,
                                       f"Exporting {name}", FOREGROUND, visible=True,
                                       on_done=self._done, on_error=self._failed,
                                       on_cancel=self._cancelled, on_progress=self._progress)
        return self.task

    def _progress(self, ev) -> None:
        self.progress.setValue(int(1000 * ev.fraction))
        self.status.setText(ev.message)      # whole: the label wraps

    def _done(self, info) -> None:
        self.result_info = info or {}
        if self.settings is not None:
            self.settings.setValue("export_dir", str(Path(self.path.text()).expanduser().parent))
            self.settings.setValue("export_format", self.exporter().name)
        self.progress.setValue(1000)
        c = self.check()
        if c is not None and c.warning:    # written, but not what the plan asked: say so
            colour, mark = VERDICT["warning"]
            self.status.setText(f"<span style='color:{colour}'>{mark}</span> wrote "
                                f"{_esc(self.path.text())}, but {_esc(c.warning)}")
        else:
            self.status.setText(f"wrote {self.path.text()}")
        self._idle()

    def _failed(self, message: str) -> None:
        self.error = message
        self.status.setText("export failed")
        self._show_error(message)
        self._idle()

    def _show_error(self, message: str | None) -> None:
        self.error_label.setText(message or "")
        self.error_label.setVisible(bool(message))
        if message:
            self._fit()

    def _cancelled(self) -> None:
        self.status.setText("cancelled; nothing written")
        self._idle()

    def _idle(self) -> None:
        c = self.check()
        self.export_button.setEnabled(not self.checking() and self.exporter().name not in
                                      self.pending and (c is None or c.ok))
        self.cancel_button.setText("Close")

    def _cancel_or_close(self) -> None:
        if self.task is not None and not self.task.finished:
            self.task.cancel()
        else:
            self.accept()

    def done(self, result: int) -> None:
        """Closing the dialog drops its check if it still runs."""
        for t in (self.check_task, self.slow_task):
            if t is not None and not t.finished:
                t.cancel()
        super().done(result)


def check_job(model, plan, names):
    """Job: {format: Preflight} (workbench.export.preflight.check per format), with progress."""
    from workbench.api.plans import check
    from workbench.core.progress import Progress
    out = {}
    for i, f in enumerate(names):
        yield Progress(i, len(names), f"checking {f}")
        out[f] = check(model, plan, f)
    yield Progress(len(names), len(names), "checked")
    return out


def _short(text: str, limit: int = 170) -> str:
    """One verdict for the list: the long tails (type lists, further tensor names) cut; the
    whole text is the tooltip."""
    for cut in (" (and ", " (types:", " (llama.cpp types:"):
        i = text.find(cut)
        if 0 < i:
            text = text[:i] + " …"
    if len(text) <= limit:
        return text
    head = text[:limit - 1]
    return (head.rsplit(" ", 1)[0] if " " in head else head).rstrip(" ,;(") + " …"   # at a word


def _esc(text: str) -> str:
    import html
    return html.escape(text)

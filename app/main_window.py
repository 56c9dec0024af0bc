"""The main window: composition of the views, menus, undo stack, settings and sessions (its
plan, session and autosave actions are in :mod:`app.window_sessions`)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QByteArray, QSettings, Qt, QTimer
from PySide6.QtGui import QAction, QKeySequence, QUndoStack
from PySide6.QtWidgets import (QFileDialog, QLabel, QMainWindow, QSplitter, QTabWidget,
                               QVBoxLayout, QWidget)

from workbench.core.errors import WorkbenchError
from workbench.api.plans import Plan

from . import commands
from .analyzer import Analyzer
from .comparison import ComparisonView
from .document import Document
from .layer_browser import LayerBrowser
from .messages import Messages
from .plots.panel import PlotsPanel
from .progress_panel import ProgressPanel
from .scheme_table import SchemeTable
from .session import is_session_file
from .tier_board import TierBoard
from .totals_bar import TotalsBar
from .undo import push
from .work_queue import WorkQueuePanel
from .window_sessions import WindowSessions
from .workers import FOREGROUND, Runner

MAX_RECENT = 8
TAB_TABLE, TAB_TIERS, TAB_COMPARE = range(3)


def _inside_installation(path: Path) -> bool:
    root = Path(__file__).resolve().parents[1]
    try:
        return Path(path).resolve().is_relative_to(root / "resources")
    except OSError:
        return True


class MainWindow(WindowSessions, QMainWindow):
    def __init__(self, messages=None, settings: QSettings | None = None, autosave: bool = True,
                 parent=None):
        super().__init__(parent)
        self.setObjectName("MainWindow")
        self.setWindowTitle("Quant Workbench")
        self.setAcceptDrops(True)
        self.messages = messages or Messages(self)
        self.settings = settings or QSettings()
        self.autosave_enabled = autosave
        # a previous run that did not end cleanly: move its autosave aside *now*, before
        # opening a model can schedule an autosave over it (start_session_guard offers it)
        self.crashed_autosave: Path | None = self._set_aside_crashed_autosave()
        self.session_path: str | None = None
        self.runner = Runner(self)
        from .cluster_setting import ClusterSetting
        self.runner.cluster = ClusterSetting(self.settings)   # the sweeps' executor (Tools menu)
        self.doc = Document(self)
        self.analyzer = Analyzer(self.doc, self.runner, self)
        self.analyzer.on_error = lambda what, msg: self.messages.error(what, msg)
        self.undo_stack = QUndoStack(self)
        self._pending_ui: dict | None = None
        self._retype_ok = False  # "don't ask again" for the never-re-typed warning (session)
        self._load_task = None

        self.browser = LayerBrowser(self.doc)
        self.plots = PlotsPanel(self.doc)
        self.table = SchemeTable(self.doc, self.push)
        self.table.predict = self.analyzer.predict
        self.tiers = TierBoard(self.doc, self.push, self.select, messages=self.messages)
        self.comparison = ComparisonView(self.doc, self.analyzer, self.push)
        self.totals = TotalsBar(self.doc)
        self.totals.runner = self.runner
        self.tabs = QTabWidget()
        self.tabs.setObjectName("MainTabs")
        self.tabs.addTab(self.table, "Scheme table")
        self.tabs.addTab(self.tiers, "Precision tiers")
        self.tabs.addTab(self.comparison, "Scheme comparison")

        self.right = QSplitter(Qt.Orientation.Vertical)
        self.right.addWidget(self.plots)
        self.right.addWidget(self.tabs)
        self.right.setStretchFactor(0, 5)
        self.right.setStretchFactor(1, 6)
        self.main_split = QSplitter(Qt.Orientation.Horizontal)
        self.main_split.addWidget(self.browser)
        self.main_split.addWidget(self.right)
        self.main_split.setStretchFactor(0, 2)
        self.main_split.setStretchFactor(1, 7)
        self.main_split.setSizes([400, 1200])
        self.right.setSizes([430, 470])
        central = QWidget()
        lay = QVBoxLayout(central)
        lay.setContentsMargins(8, 6, 8, 4)
        lay.setSpacing(6)
        lay.addWidget(self.totals)
        lay.addWidget(self.main_split, 1)
        self.setCentralWidget(central)
        # issue 33: every job running or waiting, with its progress and a Cancel button; over
        # the bottom-right corner, so the plots never jump when it comes and goes
        self.work_queue = WorkQueuePanel(self.runner, central)
        self.work_queue.anchor()

        # the running task with its Cancel button, in the status bar only while the work queue
        # (the overview of every job) is closed: progress is never shown twice
        self.progress = ProgressPanel(self.runner, hidden_by=self.work_queue)
        self.status_label = QLabel("")
        self.statusBar().addWidget(self.status_label, 1)
        self.statusBar().addPermanentWidget(self.progress)

        self.browser.activated.connect(self.select)
        self.browser.groupActivated.connect(self.select_expert_group)
        self.plots.runner = self.runner
        self.table.activated.connect(self.select)
        # a scheme typed that cannot take the tensor: why, where the user looks next
        self.table.delegate.refused.connect(lambda why: self.statusBar().showMessage(why, 15000))
        self.undo_stack.indexChanged.connect(lambda _i: self._schedule_autosave())
        self.doc.modelChanged.connect(self._model_changed)
        self._status_timer = QTimer(self, singleShot=True, interval=10000)
        self._status_timer.timeout.connect(self._clear_transient_status)
        self.doc.stateChanged.connect(lambda _c: self._clear_transient_status())
        self.doc.currentChanged.connect(lambda _n: self._clear_transient_status())
        self._autosave_timer = QTimer(self, singleShot=True, interval=1500)
        self._autosave_timer.timeout.connect(self.autosave)
        self._build_menus()
        from . import effects_ui
        effects_ui.install(self)   # issue 11: check figures, sensitivity, budget, frontier
        from . import map_ui
        map_ui.install(self)       # issue 23: the model map tab
        # the comparison view's methods calibrate with the check's file (issue 12)
        self.comparison.set_calib_source(lambda: getattr(getattr(self, "effects", None),
                                                         "calib", None))
        self.resize(1600, 1000)
        self._restore_settings()

    def fit_layout(self) -> None:
        """Proportional splitter sizes for the current window size."""
        w, h = max(self.width(), 800), max(self.height(), 600)
        left = 0.25 if w >= 1500 else 0.30
        self.main_split.setSizes([int(w * left), int(w * (1 - left))])
        self.right.setSizes([int(h * 0.44), int(h * 0.56)])

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if not getattr(self, "_layout_fitted", False):
            self._layout_fitted = True
            if not self.settings.value("split_main"):
                self.fit_layout()

    # ---- menus -------------------------------------------------------------------------------
    def _action(self, menu, text, slot, shortcut=None, tip=None) -> QAction:
        act = QAction(text, self)
        if shortcut:
            act.setShortcut(QKeySequence(shortcut))
        if tip:
            act.setStatusTip(tip)
        act.triggered.connect(lambda _c=False: slot())
        menu.addAction(act)
        return act

    def _build_menus(self) -> None:
        mb = self.menuBar()
        f = mb.addMenu("&File")
        self._action(f, "&Open Model…", self.open_dialog, QKeySequence.StandardKey.Open)
        self.recent_menu = f.addMenu("Open &Recent")
        f.addSeparator()
        self._action(f, "Open &Session…", self.open_session_dialog, "Ctrl+Shift+O")
        self._action(f, "&Save Session", self.save_session, QKeySequence.StandardKey.Save)
        self._action(f, "Save Session &As…", lambda: self.save_session(ask=True), "Ctrl+Shift+S")
        f.addSeparator()
        self._action(f, "&Load Plan…", self.load_plan_dialog, "Ctrl+L")
        self._action(f, "&Export…", self.export_dialog, "Ctrl+E")
        self._action(f, "Save Scree&nshot…", self.screenshot_dialog, "Ctrl+Shift+P")
        self._action(f, "Save &Report…", self.report_dialog, "Ctrl+R")
        f.addSeparator()
        self._action(f, "&Quit", self.close, QKeySequence.StandardKey.Quit)

        e = mb.addMenu("&Edit")
        self.undo_action = self.undo_stack.createUndoAction(self, "&Undo")
        self.undo_action.setShortcuts([QKeySequence("Ctrl+Z")])
        self.redo_action = self.undo_stack.createRedoAction(self, "&Redo")
        self.redo_action.setShortcuts([QKeySequence("Ctrl+Shift+Z"), QKeySequence("Ctrl+Y")])
        e.addAction(self.undo_action)
        e.addAction(self.redo_action)
        e.addSeparator()
        self._action(e, "&Assign Scheme to Selection", self.assign_selection, "Ctrl+Return")
        self._action(e, "Add &Rule…", self.table.add_rule_dialog, "Ctrl+Shift+R")
        self._action(e, "&Find Tensor", lambda: self.browser.filter_edit.setFocus(), "Ctrl+F")
        e.addSeparator()
        self._action(e, "Add &Tier…", self.tiers.add_tier,
                     tip="Add a precision tier after the current tensor's tier")
        self._action(e, "Rena&me Tier…", self.tiers.rename_tier,
                     tip="Rename the current tensor's precision tier")
        self._action(e, "Remo&ve Tier", self.tiers.remove_tier,
                     tip="Remove the current tensor's precision tier (its tensors keep their schemes)")

        v = mb.addMenu("&View")
        for i, label in enumerate(("Scheme &Table", "Precision &Tiers", "Scheme &Comparison")):
            self._action(v, label, lambda i=i: self.tabs.setCurrentIndex(i), f"Ctrl+{i + 1}")
        v.addSeparator()
        self._action(v, "&Log Histogram", lambda: self.plots.log_box.toggle(), "Ctrl+G")
        self._action(v, "&Sort Channels by Range", lambda: self.plots.sort_box.toggle())

        t = mb.addMenu("&Tools")
        self._action(t, "Measure Dequant &Throughput (whole plan)", self.analyzer.measure_all)
        self._action(t, "&Cancel Running Work", self.runner.cancel_all, "Esc")
        t.addSeparator()
        self._action(t, "Compute on C&luster…", self.cluster_dialog,
                     tip="Run the sensitivity tables and exports on Dask workers: local, "
                         "local:N or tcp://HOST:PORT (empty: in this process)")

        h = mb.addMenu("&Help")
        self._action(h, "&Keyboard Shortcuts", self.show_shortcuts, "F1")
        self._action(h, "&About", lambda: self.messages.info(
            "About Quant Workbench", "Quant Workbench: choose how each layer of a network is "
            "quantized.\nEvery number comes from the workbench library; see README.md and docs/."))
        self._refresh_recent()

    def show_shortcuts(self) -> None:
        lines = []
        for act in self.findChildren(QAction):
            if act.shortcut().toString():
                lines.append(f"{act.shortcut().toString():<16} {act.text().replace('&', '')}")
        self.messages.info("Keyboard shortcuts", "\n".join(sorted(set(lines))))

    # ---- edits -------------------------------------------------------------------------------
    def push(self, command) -> bool:
        if command is not None and not self.confirm_retype(getattr(command, "targets", None)):
            return False
        return push(self.undo_stack, self.doc, command)

    def confirm_retype(self, targets) -> bool:
        """Before quantizing tensors llama.cpp never re-types (norms, biases, position and
        token-type embeddings: app.commands.never_retyped), list them and ask; the answer can
        be remembered for the session."""
        if not targets or self.doc.model is None or self._retype_ok:
            return True
        risky = commands.never_retyped(self.doc.model, targets)
        if not risky:
            return True
        shown = "\n".join(f"  {n}  ({why})" for n, why in risky[:12])
        more = f"\n  … and {len(risky) - 12} more" if len(risky) > 12 else ""
        scheme = next(iter(targets.values()))
        yes, again = self.messages.confirm(
            "Quantize tensors a runtime keeps?",
            f"This edit quantizes {len(risky)} tensor{'s' if len(risky) != 1 else ''} that "
            f"llama.cpp never re-types (norms, biases, position / token-type embeddings); "
            f"a GGUF export keeps them and other runtimes may fail on them.\n\n{shown}{more}"
            f"\n\nAssign {scheme} anyway?",
            "\n".join(f"{n}: {why}" for n, why in risky))
        if yes and again:
            self._retype_ok = True
        return yes

    def select(self, name: str) -> None:
        self.doc.set_current(name)

    def select_expert_group(self, key: str) -> None:
        """Show the spread across the experts of `key` ('layer 5 experts down')."""
        self.plots.show_expert_group(key)

    def assign_selection(self) -> None:
        if self.tabs.currentIndex() == TAB_TABLE and self.table.selected_names():
            self.table.assign_selection()
            return
        names = self.browser.selected_names()
        if names:
            self.push(commands.assign(self.doc, names, self.table.assign_combo.currentText()))

    # ---- opening -----------------------------------------------------------------------------
    def open_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Open model", self._last_dir(),
            "Models (*.safetensors *.gguf *.bin *.pt *.pth *.json);;All files (*)")
        if path:
            self.open_path(path)

    def open_path(self, path: str) -> None:
        """Open a model, or a session / plan JSON file, by path."""
        if path.endswith(".json") and is_session_file(path):
            self.open_session(path)
        elif path.endswith(".json") and not path.endswith(".safetensors.index.json"):
            self.load_plan(path)
        else:
            self.open_model(path)

    def confirm_discard(self) -> bool:
        """Before something replaces the open model: with unsaved edits, ask (save / discard /
        cancel). True when it may go ahead."""
        if self.doc.model is None or self.undo_stack.isClean():
            return True
        answer = self.messages.ask_save(
            "Save changes?", "The plan has unsaved edits. Save the session before opening "
                             "another model?")
        if answer == "cancel":
            return False
        return answer == "discard" or self.save_session() is not None

    def open_model(self, path: str, plan: Plan | None = None, tiers=None, ui=None,
                   confirm: bool = True):
        """Open a checkpoint on the compute thread; a failure shows a message. Over unsaved
        edits, asks first (None: the user cancelled; `confirm=False`: already asked)."""
        from workbench.api import open_model
        if confirm and not self.confirm_discard():
            return None
        self._status_timer.stop()
        self.status_label.setText(f"opening {path}…")

        def done(model):
            self.undo_stack.clear()
            self._pending_ui = ui
            self.doc.set_model(model, plan, tiers)
            self._add_recent(model.path)
            self.settings.setValue("last_dir", str(Path(model.path).parent))

        def failed(message):
            # the message names the file; the status line says so until the next action (or
            # 10 s), then shows the model that is still open again
            self.status_label.setText(f"open failed: {Path(path).name}" + (
                " (the open model stays)" if self.doc.model is not None else ""))
            self._status_timer.start()
            self.messages.error("Cannot open model", message)

        self._load_task = self.runner.submit(lambda: open_model(path), f"Opening {path}",
                                             FOREGROUND, visible=True, on_done=done,
                                             on_error=failed)
        return self._load_task

    def model_status(self) -> str:
        """The status line for the open model ("" when none)."""
        m = self.doc.model
        if m is None:
            return ""
        return f"{m.path}  ·  {len(m.tensors)} tensors  ·  {m.total_params / 1e6:.2f} M params"

    def _clear_transient_status(self) -> None:
        """A passing message ("open failed") gives way to the open model's line."""
        self._status_timer.stop()
        if self.status_label.text().startswith("open failed"):
            self.status_label.setText(self.model_status())

    def _model_changed(self) -> None:
        m = self.doc.model
        self._status_timer.stop()
        if m is None:
            return
        self.setWindowTitle(f"{Path(m.path).name} — Quant Workbench")
        self.status_label.setText(self.model_status())
        ui = self._pending_ui or {}
        self._pending_ui = None
        self.restore_ui(ui)
        if not self.doc.current:
            first = next((n for n, i in m.tensors.items() if i.ndim >= 2 and i.is_float),
                         next(iter(m.tensors), None))
            if first:
                self.select(first)
        self._schedule_autosave()

    # ---- where the sweeps run ---------------------------------------------------------------------
    def cluster_dialog(self, text: str | None = None) -> str | None:
        """Ask for (or, with `text`, set) the cluster the sweeps run on; the stored spec, or None
        when cancelled or refused (the reason shown)."""
        setting = self.runner.cluster
        if text is None:
            from PySide6.QtWidgets import QInputDialog
            text, ok = QInputDialog.getText(
                self, "Compute on cluster",
                "Dask cluster for the sensitivity tables and exports:\n"
                "local, local:N (N worker processes here) or tcp://HOST:PORT\n"
                "(workers open the model by its path: shared storage). Empty: this process.",
                text=setting.spec)
            if not ok:
                return None
        try:
            spec = setting.set_spec(text)
        except WorkbenchError as exc:
            self.messages.error("Compute on cluster", str(exc))
            return None
        self.statusBar().showMessage(f"sweeps run on {spec}" if spec else "sweeps run in this "
                                     "process", 5000)
        return spec

    # ---- export, screenshot, report -------------------------------------------------------------
    def export_dialog(self):
        if self.doc.model is None:
            return None
        from .export_dialog import ExportDialog
        dlg = ExportDialog(self.doc, self.runner, self.export_dir(), self,
                           messages=self.messages, settings=self.settings)
        dlg.open()
        return dlg

    def screenshot_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Save screenshot", self._last_dir(), "PNG (*.png)")
        if path and not self.refuse_input_target(path, "screenshot"):
            from .screenshot import grab_png
            try:
                grab_png(self, path)
            except WorkbenchError as exc:
                self.messages.error("Cannot save screenshot", str(exc))
                return
            self.status_label.setText(f"screenshot saved to {path}")

    def report_dialog(self) -> None:
        if self.doc.model is None:
            return
        path, _ = QFileDialog.getSaveFileName(self, "Save report", self._last_dir(), "HTML (*.html)")
        if path and not self.refuse_input_target(path, "report"):
            from .report import write_report_from_window
            try:
                write_report_from_window(self, path)
            except WorkbenchError as exc:
                self.messages.error("Cannot save report", str(exc))
                return
            self.status_label.setText(f"report saved to {path}")

    # ---- settings, recent files, drag and drop -----------------------------------------------------
    def export_dir(self) -> str:
        """The user's last export folder; never the installation (the bundled demo model)."""
        d = Path(str(self.settings.value("export_dir", "") or ""))
        if not str(d) or str(d) == "." or not d.is_dir() or _inside_installation(d):
            d = Path.home()
        return str(d)

    def _last_dir(self) -> str:
        return str(self.settings.value("last_dir", str(Path.home())))

    def _add_recent(self, path: str) -> None:
        path = str(Path(path).resolve())
        recent = [p for p in self.recent_files() if p != path]
        self.settings.setValue("recent_files", [path] + recent[:MAX_RECENT - 1])
        self._refresh_recent()

    def recent_files(self) -> list[str]:
        v = self.settings.value("recent_files", [])
        if isinstance(v, str):
            v = [v]
        return [str(p) for p in (v or [])]

    def _refresh_recent(self) -> None:
        self.recent_menu.clear()
        files = self.recent_files()
        for p in files:
            act = self.recent_menu.addAction(p)
            act.triggered.connect(lambda _c=False, p=p: self.open_path(p))
        self.recent_menu.setEnabled(bool(files))

    def _restore_settings(self) -> None:
        geo = self.settings.value("geometry")
        if isinstance(geo, QByteArray) and not geo.isEmpty():
            self.restoreGeometry(geo)
        for key, split in (("split_main", self.main_split), ("split_right", self.right)):
            st = self.settings.value(key)
            if isinstance(st, QByteArray) and not st.isEmpty():
                split.restoreState(st)

    def save_settings(self) -> None:
        self.settings.setValue("geometry", self.saveGeometry())
        self.settings.setValue("split_main", self.main_split.saveState())
        self.settings.setValue("split_right", self.right.saveState())
        self.settings.sync()

    def dragEnterEvent(self, event) -> None:
        if event.mimeData().hasUrls() and any(u.isLocalFile() for u in event.mimeData().urls()):
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:
        files = [u.toLocalFile() for u in event.mimeData().urls() if u.isLocalFile()]
        if files:
            event.acceptProposedAction()
            self.open_path(files[0])

    def closeEvent(self, event) -> None:
        if self.doc.model is not None and not self.undo_stack.isClean():
            answer = self.messages.ask_save(
                "Save changes?", "The plan has unsaved edits. Save the session before closing?")
            if answer == "cancel" or (answer == "save" and self.save_session() is None):
                event.ignore()
                return
        self.save_settings()
        self.autosave()
        self.runner.shutdown(timeout=2.0)
        self.runner.cluster.close()
        try:
            self.marker_path().unlink()
        except OSError:
            pass
        super().closeEvent(event)

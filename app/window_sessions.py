"""The main window's plans, sessions and autosave: loading a plan, saving and opening a
session (the model's path, plan, tiers and the view state), the autosave and the crash
recovery that offers it. :class:`WindowSessions` is a mixin of
:class:`app.main_window.MainWindow` and works on its document, undo stack, views and messages."""

from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import QByteArray, QStandardPaths
from PySide6.QtWidgets import QFileDialog

from workbench.core.atomic import pid_alive
from workbench.core.errors import WorkbenchError
from workbench.api.plans import Plan

from . import commands
from .session import Session


def app_data_dir() -> Path:
    p = Path(QStandardPaths.writableLocation(QStandardPaths.StandardLocation.AppDataLocation))
    p.mkdir(parents=True, exist_ok=True)
    return p


class WindowSessions:
    """MainWindow's plan, session and autosave actions (File menu, start-up and close)."""

    # ---- plans and sessions --------------------------------------------------------------------
    def load_plan_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Load plan", self._last_dir(), "Plan (*.json)")
        if path:
            self.load_plan(path)

    def load_plan(self, path: str) -> None:
        try:
            plan = Plan.load(path)
        except WorkbenchError as exc:
            self.messages.error("Cannot load plan", str(exc))
            return
        if self.doc.model is None:
            self.messages.error("Cannot load plan", "open a model first")
            return
        self.push(commands.replace_plan(self.doc, plan, f"Load plan {Path(path).name}"))

    def current_session(self) -> Session:
        return Session(self.doc.model.path if self.doc.model else "", self.doc.plan,
                       self.doc.tiers, self.ui_state())

    def ui_state(self) -> dict:
        return {"current": self.doc.current, "tab": self.tabs.currentIndex(),
                **self.browser.state(), **self.plots.state(),
                "splitters": [bytes(self.main_split.saveState().toBase64()).decode(),
                              bytes(self.right.saveState().toBase64()).decode()]}

    def restore_ui(self, ui: dict) -> None:
        if not ui:
            return
        self.browser.restore(ui)
        self.plots.restore(ui)
        if isinstance(ui.get("tab"), int):
            self.tabs.setCurrentIndex(ui["tab"])
        sp = ui.get("splitters")
        if isinstance(sp, list) and len(sp) == 2:
            self.main_split.restoreState(QByteArray.fromBase64(sp[0].encode()))
            self.right.restoreState(QByteArray.fromBase64(sp[1].encode()))
        if ui.get("current"):
            self.select(ui["current"])

    def refuse_input_target(self, path, what: str, session_ok: bool = False) -> bool:
        """True (after showing why) when `path` is a file this window read: the model's
        files (any link to them) or, unless `session_ok`, the session file it came from."""
        from workbench.core.outputs import refuse_inputs_as_outputs
        inputs = {"the model": self.doc.model.path if self.doc.model is not None else None}
        if not session_ok:
            inputs["the session file"] = self.session_path
        try:
            refuse_inputs_as_outputs({"the target": str(path)}, inputs)
        except WorkbenchError as exc:
            self.messages.error(f"Cannot save {what}", str(exc))
            return True
        return False

    def save_session(self, ask: bool = False, path: str | None = None) -> str | None:
        if self.doc.model is None:
            return None
        if path is None:
            path = self.session_path
        if ask or path is None:
            path, _ = QFileDialog.getSaveFileName(self, "Save session", self._last_dir(),
                                                  "Session (*.json)")
            if not path:
                return None
        if self.refuse_input_target(path, "session", session_ok=True):
            return None
        try:
            self.current_session().save(path)
        except WorkbenchError as exc:
            self.messages.error("Cannot save session", str(exc))
            return None
        self.session_path = path
        self.undo_stack.setClean()
        self._add_recent(path)
        self.status_label.setText(f"session saved to {path}")
        return path

    def open_session_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open session", self._last_dir(),
                                              "Session (*.json)")
        if path:
            self.open_session(path)

    def open_session(self, path: str):
        try:
            s = Session.load(path)
        except WorkbenchError as exc:
            self.messages.error("Cannot open session", str(exc))
            return None
        if not self.confirm_discard():
            return None
        self.session_path = path
        self._add_recent(path)
        return self.open_model(s.model, s.plan, s.tiers, s.ui, confirm=False)

    # ---- autosave and crash recovery ---------------------------------------------------------------
    def autosave_path(self) -> Path:
        return app_data_dir() / "autosave.json"

    def marker_path(self) -> Path:
        return app_data_dir() / "running.lock"

    def _schedule_autosave(self) -> None:
        if self.autosave_enabled and self.doc.model is not None:
            self._autosave_timer.start()

    def autosave(self) -> None:
        if not self.autosave_enabled or self.doc.model is None:
            return
        try:
            self.current_session().save(self.autosave_path())
        except WorkbenchError:
            pass

    def recovered_path(self) -> Path:
        return app_data_dir() / "autosave-recovered.json"

    def _set_aside_crashed_autosave(self) -> Path | None:
        marker, auto = self.marker_path(), self.autosave_path()
        if not (marker.exists() and auto.exists()):
            return None
        pid = marker.read_text(errors="replace").strip()
        if pid.isdigit() and int(pid) != os.getpid() and pid_alive(int(pid)):
            return None  # another window of the app is running: not a crash
        try:
            os.replace(auto, self.recovered_path())
        except OSError:
            return None
        return self.recovered_path()

    def start_session_guard(self) -> bool:
        """Mark the app as running; if the last run did not end cleanly, offer its autosave
        (set aside at start-up, so nothing this run does can overwrite it).

        Returns True when the autosaved session is being restored.
        """
        self.marker_path().write_text(str(os.getpid()))
        crashed = self.crashed_autosave
        if crashed is not None and crashed.exists() and self.messages.ask(
                "Restore session?",
                "Quant Workbench did not close normally last time.\n"
                "Restore the automatically saved session?"):
            restored = self.open_session(str(crashed)) is not None
            if restored:
                self.session_path = None       # not the user's file: Save asks where
            return restored
        return False

"""Application start-up: `quant-workbench [MODEL]` lands in :func:`run_gui`."""

from __future__ import annotations

import os
import sys
from pathlib import Path
import time

START = time.perf_counter()


_NOISE = ("This plugin does not support propagateSizeHints()",)


def quiet_qt_messages() -> None:
    """Drop Qt's harmless platform-plugin chatter (the offscreen plugin prints
    'This plugin does not support propagateSizeHints()' for every top-level resize);
    every other Qt message goes to stderr as before."""
    from PySide6.QtCore import qInstallMessageHandler

    def handler(_kind, _context, message):
        if message in _NOISE:
            return
        sys.stderr.write(message + "\n")
    qInstallMessageHandler(handler)


def create_app(argv=None, offscreen: bool = False):
    """The QApplication (created once), with organisation names, fonts and the theme."""
    if offscreen:
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    if os.environ.get("QT_QPA_PLATFORM") == "offscreen":
        os.environ.setdefault("QT_LOGGING_RULES", "qt.qpa.*=false")
    from PySide6.QtWidgets import QApplication
    quiet_qt_messages()
    app = QApplication.instance()
    if app is None:
        app = QApplication(list(argv or sys.argv[:1]))
        app.setOrganizationName("QuantWorkbench")
        app.setApplicationName("Quant Workbench")
        from . import theme
        theme.apply(app)
    return app


def build_window(model_path=None, plan_path=None, session_path=None, messages=None,
                 autosave: bool = True):
    """A MainWindow opening a session, or a model (default: the bundled demo) with a plan."""
    from workbench.api import demo_model_path as default_model_path
    from workbench.api.plans import Plan
    from .main_window import MainWindow
    win = MainWindow(messages=messages, autosave=autosave)
    if session_path:
        win.open_session(session_path)
        return win
    plan = None
    if plan_path:
        from workbench.core.errors import WorkbenchError
        try:
            plan = Plan.load(plan_path)
        except WorkbenchError as exc:
            win.messages.error("Cannot load plan", str(exc))
    win.open_model(str(model_path or default_model_path()), plan)
    return win


def log_dir() -> Path:
    d = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "quant-workbench" / "logs"
    d.mkdir(parents=True, exist_ok=True)
    return d


def install_crash_handler(win) -> None:
    """An exception escaping a Qt slot is logged with its traceback and shown with the log's
    path, instead of aborting the app and losing the session (which autosave keeps)."""
    import time
    import traceback

    def hook(etype, value, tb):
        text = "".join(traceback.format_exception(etype, value, tb))
        try:
            path = log_dir() / time.strftime("crash-%Y%m%d-%H%M%S.log")
            path.write_text(text, encoding="utf-8")
            where = str(path)
        except OSError:
            where = "(the log could not be written)"
        sys.stderr.write(text)
        try:
            win.autosave()
            win.messages.error("Unexpected error",
                               f"{etype.__name__}: {value}\n\nThe details are in {where}. "
                               "Your session was saved automatically.\n\n" + text)
        except Exception:  # noqa: BLE001 - the handler itself must never raise
            pass

    sys.excepthook = hook


def install_interrupt(win) -> None:
    """Ctrl-C in the terminal that started the app closes the window as its close button does
    (unsaved edits asked about, the session autosaved, the workers stopped). Without it the
    KeyboardInterrupt is raised inside whichever Qt slot runs next, reported as a crash, and
    the app goes on. The handler runs at the next Python bytecode, the GUI thread's gc timer
    (app/gc_guard.py) at the latest; the close is queued so that it runs from the event loop."""
    import signal
    from PySide6.QtCore import QTimer
    signal.signal(signal.SIGINT, lambda signum, frame: QTimer.singleShot(0, win.close))


def run_gui(args) -> int:
    app = create_app()
    from .gc_guard import install
    install(app)        # cyclic garbage collected in the GUI thread only (app/gc_guard.py)
    win = build_window(getattr(args, "model", None), getattr(args, "plan", None),
                       getattr(args, "session", None))
    install_crash_handler(win)
    install_interrupt(win)
    win.show()
    win.analyzer.warmup()
    from PySide6.QtCore import QTimer
    QTimer.singleShot(0, win.start_session_guard)
    return app.exec()


if __name__ == "__main__":  # python -m app.main [MODEL]
    import argparse
    p = argparse.ArgumentParser()
    p.add_argument("model", nargs="?")
    p.add_argument("--plan")
    p.add_argument("--session")
    sys.exit(run_gui(p.parse_args()))

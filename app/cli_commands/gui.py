"""`quant-workbench [gui] [MODEL]`: open the desktop app (the bundled demo model by default)."""

from __future__ import annotations

import os
import sys


def register(sub) -> None:
    p = sub.add_parser("gui", help="open the desktop app (default command)")
    p.add_argument("model", nargs="?", default=None, help="checkpoint to open")
    p.add_argument("--plan", help="plan JSON to apply")
    p.add_argument("--session", help="session JSON to restore")
    p.set_defaults(func=run)


def _no_display() -> bool:
    """Linux/BSD without X11/Wayland and no explicit Qt platform: Qt would abort."""
    if not sys.platform.startswith(("linux", "freebsd")) or os.environ.get("QT_QPA_PLATFORM"):
        return False
    return not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def run(args) -> int:
    from workbench.core.errors import WorkbenchError
    if _no_display():
        raise WorkbenchError("no display to open the window on (DISPLAY and WAYLAND_DISPLAY are "
                             "unset); run it in a desktop session or under xvfb-run, or use the "
                             "headless commands (inspect, evaluate, export, screenshot, report)")
    try:
        from app.main import run_gui
    except ImportError as exc:
        raise WorkbenchError(f"the desktop app is not available ({exc})") from None
    return run_gui(args)

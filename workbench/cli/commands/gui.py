"""`quant-workbench [gui] [MODEL]`: open the desktop app (the bundled demo model by default)."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("gui", help="open the desktop app (default command)")
    p.add_argument("model", nargs="?", default=None, help="checkpoint to open")
    p.add_argument("--plan", help="plan JSON to apply")
    p.add_argument("--session", help="session JSON to restore")
    p.set_defaults(func=run)


def run(args) -> int:
    from ...errors import WorkbenchError
    try:
        from app.main import run_gui
    except ImportError as exc:
        raise WorkbenchError(f"the desktop app is not available ({exc})") from None
    return run_gui(args)

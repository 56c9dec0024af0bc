"""The `quant-workbench` command.

Sub-commands live one per module in `workbench/cli/commands/`; each module defines
``register(subparsers)`` which adds its parser and sets ``func=run(args) -> int``.
With no sub-command (or a model path as first argument) the GUI opens.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from ..errors import Cancelled, WorkbenchError


def build_parser() -> argparse.ArgumentParser:
    from . import commands
    parser = argparse.ArgumentParser(
        prog="quant-workbench",
        description="Decide how each layer of a neural network is quantized. "
                    "With no command, opens the desktop app (on MODEL or the bundled demo model).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{mod.name}")
        module.register(sub)
    return parser


def _command_names(parser: argparse.ArgumentParser) -> set[str]:
    for action in parser._subparsers._group_actions:  # noqa: SLF001 (argparse has no API)
        if isinstance(action, argparse._SubParsersAction):
            return set(action.choices)
    return set()


def _log_internal_error(exc: BaseException) -> str:
    """Write the traceback of an unexpected error to a log file; returns its path."""
    import os
    import time
    import traceback
    from pathlib import Path
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        d = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "quant-workbench" / "logs"
        d.mkdir(parents=True, exist_ok=True)
        path = d / time.strftime(f"error-%Y%m%d-%H%M%S-{os.getpid()}.log")
        path.write_text(text, encoding="utf-8")
        return str(path)
    except OSError:
        return "(no log: the cache folder is not writable)"


def main(argv: list[str] | None = None) -> int:
    # names from files may hold lone surrogates or control characters: never fail to print
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(errors="backslashreplace")
            except (ValueError, OSError):
                pass
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    names = _command_names(parser)
    if not argv or (argv[0] not in names and argv[0] not in ("-h", "--help")):
        argv = ["gui", *argv]
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except WorkbenchError as exc:
        print(f"quant-workbench: error: {exc}", file=sys.stderr)
        return 2
    except Cancelled:
        print("quant-workbench: cancelled", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("quant-workbench: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except (MemoryError, RecursionError, Exception) as exc:  # noqa: BLE001 - the last resort
        where = _log_internal_error(exc)
        msg = str(exc).splitlines()[0][:200] if str(exc) else ""
        print(f"quant-workbench: internal error: {type(exc).__name__}: {msg} (details in {where})",
              file=sys.stderr)
        return 3

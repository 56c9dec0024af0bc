"""The `quant-workbench` command.

Sub-commands live one per module in `workbench/cli/commands/` (the domain's) and
`app/cli_commands/` (those that open windows: gui, screenshot, report, bench-gui); each module
defines ``register(subparsers)`` which adds its parser and sets ``func=run(args) -> int``. A new
command is a new module in one of those folders, nothing else. The console script and main.py
enter through app/entry.py, which passes both packages; workbench/ itself never imports app/.
With no sub-command (or a model path as first argument) the GUI opens.

Exit status: 0 ok, 2 a user-facing error (one line ``<file>: <tensor>: <problem>``), 130
cancelled. Anything unexpected (a bug) prints one line with the path of a crash log holding
the traceback (``~/.cache/quant-workbench/logs/`` under $XDG_CACHE_HOME, or
$QUANT_WORKBENCH_LOG_DIR) and exits 3; with QUANT_WORKBENCH_TRACEBACK=1 it re-raises instead
(for debugging). Tests see a bug as exit status 3 plus "internal error".
Output streams escape what they cannot encode (a lone surrogate in a tensor name).
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from pathlib import Path

from workbench.core.errors import Cancelled, WorkbenchError, one_line


#: where the domain's commands live (one module per command, "_" for "-")
DOMAIN_COMMANDS = ("workbench.cli.commands",)


def build_parser(only: str | None = None,
                 packages: tuple[str, ...] = DOMAIN_COMMANDS) -> argparse.ArgumentParser:
    """The whole command line from the command modules of `packages` (the domain's; the
    `quant-workbench` entry point in app/entry.py adds app's window-opening commands); with
    `only` (a command name), a parser holding just that command, whose module is the only one
    imported (`export` does not load what `gui`, `bench` or `sensitivity` import). None when
    `only` names no command module."""
    parser = argparse.ArgumentParser(
        prog="quant-workbench",
        description="Decide how each layer of a neural network is quantized. "
                    "With no command, opens the desktop app (on MODEL or the bundled demo model).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = []   # (command module name, package)
    for pkg_name in packages:
        pkg = importlib.import_module(pkg_name)
        modules += [(m.name, pkg_name) for m in pkgutil.iter_modules(pkg.__path__)]
    modules.sort()
    if only is not None:
        mod = only.replace("-", "_")
        if only.startswith(("_", "-")) or mod not in {m for m, _ in modules}:
            return None
        modules = [(m, p) for m, p in modules if m == mod]
    for name, pkg_name in modules:
        module = importlib.import_module(f"{pkg_name}.{name}")
        module.register(sub)
    if only is not None and only not in _command_names(parser):
        return None
    return parser


def _command_names(parser: argparse.ArgumentParser) -> set[str]:
    return set(_commands(parser))


def _commands(parser: argparse.ArgumentParser) -> dict:
    """{command name: its parser}."""
    for action in parser._subparsers._group_actions:  # noqa: SLF001 (argparse has no API)
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def main(argv: list[str] | None = None, packages: tuple[str, ...] = DOMAIN_COMMANDS) -> int:
    """Run one command. `packages`: the command packages (app/entry.py passes the domain's and
    app's; this module alone knows only the domain's, so it never imports app/)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # a command named first: build only its parser (module names are command names, "_" for
    # "-"); anything else (help, a model path for the GUI, a typo) gets the whole parser
    parser = build_parser(only=argv[0], packages=packages) if argv else None
    if parser is None:
        parser = build_parser(packages=packages)
        names = _command_names(parser)
        if "gui" in names and (not argv or (argv[0] not in names
                                            and argv[0] not in ("-h", "--help"))):
            argv = ["gui", *argv]
    _tolerant_streams()
    args = None
    try:
        args = parser.parse_args(argv)
        if not hasattr(args, "func"):
            parser.print_help()
            return 2
        import time

        from workbench.cli.common import PROGRESS_STATE, check_file_args
        PROGRESS_STATE.update(label=args.command or "", last=time.monotonic())
        check_file_args(args, parser)
        return int(args.func(args) or 0)
    except WorkbenchError as exc:
        from workbench.export.convert.live import public_error
        _say(f"quant-workbench: error: {public_error(flag_named(exc, parser, args))}")
        return 2
    except Cancelled:
        _say("quant-workbench: cancelled")
        return 130
    except KeyboardInterrupt:
        _say("quant-workbench: interrupted")
        return 130
    except BrokenPipeError:
        return 0
    except SystemExit:
        raise
    except RecursionError as exc:
        return _crash(exc, "input nested too deeply")
    except ImportError as exc:   # an optional package missing deep inside a library
        from workbench.core.optional import missing_from
        msg = missing_from(exc)
        if msg is None:
            if os.environ.get("QUANT_WORKBENCH_TRACEBACK"):
                raise
            return _crash(exc, "internal error")
        _say(f"quant-workbench: error: {msg}")
        return 2
    except MemoryError as exc:
        return _crash(exc, "out of memory")
    except Exception as exc:  # noqa: BLE001 - the catch-all: one line + a log with the traceback
        if os.environ.get("QUANT_WORKBENCH_TRACEBACK"):
            raise
        return _crash(exc, "internal error")
    finally:
        from workbench.cli.common import PROGRESS_STATE
        PROGRESS_STATE.update(label="", last=None)
        ex = getattr(args, "_executor", None)
        if ex is not None:   # a --cluster the command opened (a local cluster is stopped)
            ex.close()


def flag_named(exc: WorkbenchError, parser, args) -> WorkbenchError:
    """A library error told under the command's flags: an API argument's refusal
    (workbench.core.checks.ArgumentError, naming the parameter) under the flag for it, and the
    parameters another error names (``calib=``, ``ctx=3``: its ``params``) as flags
    (``--calib``, ``--ctx 3``). A parameter's flag is the option whose destination is the
    parameter (``samples`` -> ``--samples``, ``from_bpw`` -> ``--from-bpw``); a command whose
    flag feeds a parameter of another name says so in ``set_defaults(flags={param: flag})``."""
    from workbench.core.checks import ArgumentError
    if args is None:
        return exc

    def flag_of(param: str) -> str | None:
        flag = (getattr(args, "flags", None) or {}).get(param)
        if flag is None:
            sub = _commands(parser).get(getattr(args, "command", None))
            for action in getattr(sub, "_actions", ()):   # noqa: SLF001 (argparse has no API)
                if action.dest == param and action.option_strings:
                    return max(action.option_strings, key=len)
        return flag
    if isinstance(exc, ArgumentError):
        flag = flag_of(exc.param)
        return exc.named(flag) if flag else exc
    return exc.flagged(flag_of)


def log_dir() -> Path:
    """Where crash logs go: $QUANT_WORKBENCH_LOG_DIR or ~/.cache/quant-workbench/logs."""
    env = os.environ.get("QUANT_WORKBENCH_LOG_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "quant-workbench" / "logs"


def write_crash_log(exc: BaseException) -> Path | None:
    """Write the traceback of `exc` to a new file in :func:`log_dir`; its path (None if it
    could not be written)."""
    import time
    import traceback
    try:
        d = log_dir()
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        path.write_text(f"quant-workbench {' '.join(sys.argv)}\n{text}", encoding="utf-8",
                        errors="backslashreplace")
        return path
    except OSError:
        return None


def _crash(exc: BaseException, what: str) -> int:
    """One line for an unexpected exception (a bug, or a limit the loaders do not catch yet),
    with the log holding the traceback. Exit status 3 (a user error is 2)."""
    log = write_crash_log(exc)
    detail = str(exc).splitlines()[0][:200] if str(exc) else ""
    where = log if log else "no log: the cache folder is not writable"
    _say(f"quant-workbench: {what}: {type(exc).__name__}: {one_line(detail)} (details in {where})")
    return 3


def _tolerant_streams() -> None:
    """stdout/stderr never fail on a character they cannot encode (a lone surrogate in a
    tensor name, a non-UTF-8 terminal): it is written backslash-escaped."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):
            pass


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr)
    except UnicodeEncodeError:
        print(line.encode("ascii", "backslashreplace").decode("ascii"), file=sys.stderr)

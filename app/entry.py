"""The `quant-workbench` command (console script and main.py): the domain's commands
(workbench/cli/commands) plus app's window-opening ones (app/cli_commands: gui, screenshot,
report, bench-gui). Dispatch lives here, at the top, so that workbench/ never imports app/."""

from __future__ import annotations

#: command packages, one module per command
COMMAND_PACKAGES = ("workbench.cli.commands", "app.cli_commands")


def main(argv: list[str] | None = None) -> int:
    from workbench.cli import main as cli_main
    return cli_main(argv, packages=COMMAND_PACKAGES)


if __name__ == "__main__":      # python -m app.entry ... (the same as quant-workbench ...)
    import sys
    sys.exit(main())

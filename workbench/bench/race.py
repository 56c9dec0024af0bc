"""The frame the two races share (``bench-allocate --vs-llama``, workbench.bench.vs_llama, and
``bench-mlx``, workbench.bench.mlx): the output folder, the installed command, numbered steps run
as timed child processes with a log each, results.json rewritten after each step, the judge's
loop over the rows and the closing line."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

from workbench.core.errors import WorkbenchError
from workbench.core.progress import Progress


def workbench_command() -> list[str]:
    """The installed ``quant-workbench`` (beside this Python, else on PATH), else this Python
    running the domain CLI."""
    import shutil
    here = Path(sys.executable).parent / "quant-workbench"
    if here.is_file():
        return [str(here)]
    found = shutil.which("quant-workbench")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from workbench.cli import main; sys.exit(main())"]


def prepare_out_dir(path) -> Path:
    """The output folder: created, or an existing empty one; an existing non-empty folder (or a
    file) is refused, nothing written."""
    out = Path(path)
    if out.exists():
        if not out.is_dir():
            raise WorkbenchError("exists and is not a folder: choose a new output folder",
                                 path=str(out))
        if any(out.iterdir()):
            raise WorkbenchError("the output folder is not empty: choose a new or empty one "
                                 "(nothing was written)", path=str(out))
    else:
        try:
            out.mkdir(parents=True)
        except OSError as exc:
            raise WorkbenchError(f"cannot create the output folder ({exc.strerror})",
                                 path=str(out)) from None
    (out / "logs").mkdir(exist_ok=True)
    return out


def split_args(text: str | None) -> list[str]:
    try:
        return shlex.split(text or "")
    except ValueError as exc:
        raise WorkbenchError(f"--workbench-args {text!r}: {exc}") from None


def load_average() -> list[float] | None:
    """The 1-, 5- and 15-minute load averages (wall times depend on them)."""
    try:
        return [round(x, 1) for x in os.getloadavg()]
    except OSError:
        return None


def fmt_load(v) -> str:
    return " / ".join(f"{x:.1f}" for x in v) if v else "?"


def fmt(v, spec: str) -> str:
    """A table cell: '—' for a missing value."""
    return "—" if v is None else format(v, spec)


class Race:
    """One race's bookkeeping: `res` (with its "rows") saved to OUT/results.json, the step
    counter out of `n_steps`, each step's CPU seconds by log name."""

    def __init__(self, out: Path, n_steps: int, timeout: float, res: dict):
        self.out, self.logs, self.n_steps, self.timeout = out, out / "logs", n_steps, timeout
        self.res = res
        res.setdefault("rows", [])
        res["load_before"] = load_average()
        self.n = 0
        self.cpu: dict[str, float] = {}

    def begin(self, label: str) -> tuple[str, Progress]:
        """The next step: its '[i/N] label' tag and the Progress announcing it."""
        self.n += 1
        tag = f"[{self.n}/{self.n_steps}] {label}"
        return tag, Progress(self.n - 1, self.n_steps, tag)

    def step(self, cmd, log_name: str, label: str, env=None, status=None):
        """Run `cmd` as a timed child process logging to logs/`log_name`; returns its wall
        seconds; a failure (exit status, timeout) is a WorkbenchError naming the step."""
        from workbench.export.llama_tools import log_tail, run_child
        tag, ev = self.begin(label)
        yield ev
        usage: dict = {}
        try:
            rc, dt = yield from run_child(cmd, self.logs / log_name, tag, self.timeout, env,
                                          status=status, usage=usage)
        except WorkbenchError as exc:       # (a timeout) named without the [i/N] tag
            raise WorkbenchError(exc.problem.replace(tag, label)) from None
        self.cpu[log_name] = usage["cpu_s"]
        if rc != 0:
            raise WorkbenchError(f"{label} failed (exit status {rc}): "
                                 f"{log_tail(self.logs / log_name)} "
                                 f"(log: {self.logs / log_name})")
        return dt

    def allocate_export(self, row: dict, key: str, allocate: list, export: list):
        """The workbench's two steps for `row`, as child processes (`allocate`, then `export`;
        logs allocate-KEY.log and export-KEY.log): their seconds in the row; a step that fails
        is the row's error ("allocate: ..." or "export: ...", the step it leaves counted).
        Returns whether both ran."""
        try:
            row["allocate_s"] = yield from self.step(allocate, f"allocate-{key}.log",
                                                     f"allocate at {key}'s bytes")
        except WorkbenchError as exc:
            row["error"] = f"allocate: {exc.problem}"
            self.n += 1                              # no export
            self.save()
            return False
        try:
            row["export_s"] = yield from self.step(export, f"export-{key}.log",
                                                   f"export the {key}-sized plan")
        except WorkbenchError as exc:
            row["error"] = f"export: {exc.problem}"
            self.save()
            return False
        return True

    def save(self) -> None:
        from workbench.core.atomic import write_text_atomic
        write_text_atomic(self.out / "results.json", json.dumps(self.res, indent=1) + "\n")

    def judge(self, label, score):
        """Every row not in error, in turn: announced as '[i/N] label(row)', then `score(row,
        tag)` (a generator) fills it in; results saved after each."""
        for row in self.res["rows"]:
            if "error" in row:
                self.n += 1
                continue
            tag, ev = self.begin(label(row))
            yield ev
            yield from score(row, tag)
            self.save()

    def finish(self):
        """The closing: tokens and chunks of the first judged row, the load after; saved;
        returns the results."""
        first = next((r["kld"] for r in self.res["rows"] if "kld" in r), {})
        self.res.update({"tokens": first.get("tokens"), "chunks": first.get("chunks"),
                         "load_after": load_average()})
        self.save()
        yield Progress(self.n_steps, self.n_steps, "done")
        return self.res

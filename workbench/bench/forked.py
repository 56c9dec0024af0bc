"""Commands of this checkout run as forks of one process that has imported the libraries once.

README.md's tour (workbench/bench/tour.py) runs about twenty `quant-workbench` commands on
MiniLM in order; a fresh interpreter spends 3-10 s of each importing torch, transformers and
the model code before the command's work starts (on the project's 2-core machine). Here one
server process imports them once (`PRELOAD`) and forks a child per command: the child is a
new process as a fresh one would be (its own memory, environment, folder and exit code,
nothing kept from an earlier command: every command's state is made after the fork), running
a script (the checkout's `main.py`) as `python SCRIPT ARGS` would, its stdin empty, its stdout
and stderr going to one file as a terminal's would to one screen.

The server is single-threaded and has run nothing but imports when it forks (no OpenMP, numba
or tokenizer thread pool started), which is what makes the fork safe. Its environment is the
commands' own at start-up (the thread counts that torch and numba read on import among it);
each child then takes the environment its request gives.

Protocol (the server's stdin and a dedicated reply pipe, one JSON object a line): a request
``{"script": FILE, "argv": [...], "cwd": DIR, "env": {...}, "out": FILE}``; replies
``{"ready": true}`` once the imports are done (the first request is sent only then, and the
wait is not the command's time: on a loaded machine the imports alone can take minutes),
``{"pid": N}`` once the child is forked and ``{"rc": N}`` when it has ended (a negative N: the
signal that killed it, as subprocess reports it). POSIX only: `available()` says whether it can
run here.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time

#: what the server imports before it forks: the command line, the runner, the model classes of
#: the tour's models (MiniLM's BERT, the demo model's Qwen2) and the exporters' libraries; a
#: module that is not installed is skipped (the child imports what it needs, as a fresh process)
PRELOAD = ("numpy", "torch", "numba", "transformers", "transformers.modeling_utils",
           "transformers.models.bert.modeling_bert", "transformers.models.qwen2.modeling_qwen2",
           "tokenizers", "safetensors", "gguf", "onnx", "onnxruntime", "compressed_tensors",
           "workbench.cli", "workbench.api", "workbench.running.runner", "workbench.export")


#: the longest wait for the server's imports (a loaded machine: minutes), whatever a command's
#: own timeout
READY_S = 600.0


def available() -> bool:
    return hasattr(os, "fork") and sys.platform != "win32"


class Server:
    """A server process; `run(script, argv, cwd, env, out, timeout)` -> the exit code of
    `python script argv...` run in `cwd` with `env`, its output in the file `out`."""

    def __init__(self, env: dict, root: str, preload: tuple[str, ...] = PRELOAD):
        r, w = os.pipe()
        self._reply = os.fdopen(r, "r")
        self._proc = subprocess.Popen([sys.executable, "-m", "workbench.bench.forked", str(w),
                                       *preload],
                                      cwd=root, env=env, stdin=subprocess.PIPE, text=True,
                                      pass_fds=(w,), stdout=subprocess.DEVNULL)
        os.close(w)
        self._ready = False

    def _read(self, timeout: float | None) -> dict:
        if timeout is not None:
            ready, _, _ = select.select([self._reply], [], [], max(0.0, timeout))
            if not ready:
                raise subprocess.TimeoutExpired("forked command", timeout)
        line = self._reply.readline()
        if not line:
            raise OSError(f"the command server ended (exit {self._proc.wait()})")
        return json.loads(line)

    def run(self, script: str, argv: list[str], cwd: str, env: dict, out: str,
            timeout: float) -> int:
        if not self._ready:              # the imports: not the command's time, no request sent yet
            try:
                self._ready = self._read(max(timeout, READY_S))["ready"]
            except subprocess.TimeoutExpired:
                raise OSError(f"the command server's imports took over "
                              f"{max(timeout, READY_S):.0f} s") from None
        self._proc.stdin.write(json.dumps({"script": script, "argv": argv, "cwd": cwd,
                                           "env": env, "out": out}) + "\n")
        self._proc.stdin.flush()
        end = time.monotonic() + timeout
        pid = self._read(60)["pid"]
        try:
            return self._read(end - time.monotonic())["rc"]
        except subprocess.TimeoutExpired:
            os.kill(pid, signal.SIGKILL)
            self._read(60)
            raise

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.close()
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._reply.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _child(req: dict) -> None:
    """In the fork: become the command and never return."""
    code = 1
    try:
        fd = os.open(req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        sys.stdin = open(0, closefd=False)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        sys.argv = [req["script"], *req["argv"]]
        sys.path[0] = os.path.dirname(os.path.abspath(req["script"]))
        import runpy
        try:
            runpy.run_path(req["script"], run_name="__main__")
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)
    except BaseException:                  # a fresh interpreter prints it and exits 1
        import traceback
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code if isinstance(code, int) else 1)


def serve(reply_fd: int, preload: list[str]) -> None:
    import importlib
    for name in preload:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    reply = os.fdopen(reply_fd, "w")
    reply.write(json.dumps({"ready": True}) + "\n")
    reply.flush()
    for line in sys.stdin:
        req = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            reply.close()
            _child(req)
        reply.write(json.dumps({"pid": pid}) + "\n")
        reply.flush()
        _, status = os.waitpid(pid, 0)
        rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        reply.write(json.dumps({"rc": rc}) + "\n")
        reply.flush()


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2:])

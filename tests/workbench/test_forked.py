"""workbench/bench/forked.py: a command run as a fork of the server is the process a fresh
`python SCRIPT ARGS` would be: its arguments, folder, environment, empty stdin, one output
file for stdout and stderr, its exit code (a signal's as subprocess gives it), nothing kept
from the command before it, and a timeout that kills it."""

from __future__ import annotations

import os
import subprocess

import pytest

from workbench.bench import forked

pytestmark = pytest.mark.skipif(not forked.available(), reason="no os.fork here")

SCRIPT = r'''
import os, sys, json
print("argv", json.dumps(sys.argv[1:]))
print("cwd", os.getcwd())
print("env", os.environ.get("QW_T"), "PATH" in os.environ)
print("stdin", repr(sys.stdin.read()))
print("to stderr", file=sys.stderr)
import csv
print("kept", getattr(csv, "qw_mark", None))
csv.qw_mark = sys.argv[1]
if sys.argv[1] == "exit":
    sys.exit(int(sys.argv[2]))
if sys.argv[1] == "raise":
    raise ValueError("boom")
if sys.argv[1] == "kill":
    os.kill(os.getpid(), 9)
if sys.argv[1] == "sleep":
    import time; time.sleep(60)
'''


@pytest.fixture
def server(tmp_path):
    with forked.Server(dict(os.environ), os.getcwd(), preload=("csv", "json")) as s:
        yield s


def _run(server, tmp_path, *argv, env=None, timeout=60):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out.txt"
    rc = server.run(str(script), list(argv), str(tmp_path), env or {"QW_T": "x"}, str(out),
                    timeout)
    return rc, out.read_text()


def test_a_fork_is_the_command_a_fresh_process_runs(server, tmp_path):
    rc, text = _run(server, tmp_path, "a b", "$HOME")
    assert rc == 0, text
    lines = text.splitlines()
    assert lines[:4] == ['argv ["a b", "$HOME"]', f"cwd {tmp_path}", "env x False", "stdin ''"]
    assert "to stderr" in lines and "kept None" in lines
    rc, text = _run(server, tmp_path, "again")          # the first fork's module state is gone
    assert rc == 0 and "kept None" in text.splitlines()


def test_exit_codes_exceptions_and_signals(server, tmp_path):
    assert _run(server, tmp_path, "exit", "2")[0] == 2
    rc, text = _run(server, tmp_path, "raise")
    assert rc == 1 and "ValueError: boom" in text and "Traceback" in text
    assert _run(server, tmp_path, "kill")[0] == -9
    assert _run(server, tmp_path, "exit", "0")[0] == 0       # the server still serves


def test_a_timeout_kills_the_command_and_the_server_goes_on(server, tmp_path):
    with pytest.raises(subprocess.TimeoutExpired):
        _run(server, tmp_path, "sleep", timeout=1)
    assert _run(server, tmp_path, "exit", "3")[0] == 3


def test_slow_imports_are_not_a_commands_time(tmp_path):
    """The server's imports may take longer than a command's timeout (a loaded machine): the
    first command still gets its whole timeout."""
    (tmp_path / "qw_slow_import.py").write_text("import time\ntime.sleep(2)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.getcwd()]))
    with forked.Server(env, os.getcwd(), preload=("qw_slow_import",)) as s:
        assert _run(s, tmp_path, "exit", "4", timeout=1)[0] == 4


def test_the_server_ends_with_its_stdin():
    s = forked.Server(dict(os.environ), os.getcwd(), preload=())
    s.close()
    assert s._proc.returncode == 0

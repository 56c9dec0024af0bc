"""Never lose a user's file: exports refuse to write over the model's inputs, temporary files
are recognisable and cleaned after killed runs, unwritable folders give one-line errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from workbench.atomic import clean_stale_temps
from workbench.errors import WorkbenchError
from workbench.export import export
from workbench.loaders import open_model
from workbench.plan import Plan
from workbench.progress import run

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("fmt", ["safetensors", "gguf", "plan", "llama-tensor-types"])
def test_export_over_the_source_is_refused(tiny_llama, tmp_path, fmt):
    path = Path(tiny_llama[0])
    before = path.read_bytes()
    model = open_model(path)
    for target in (path, tmp_path / "link.safetensors"):
        if target != path:
            os.link(path, target)          # a hard link is the same file under another name
        with pytest.raises(WorkbenchError, match="input of the open model"):
            run(export(model, Plan(default="q8_0"), fmt, target))
    assert path.read_bytes() == before


def test_cli_export_over_source_exits_2(tiny_llama):
    path = Path(tiny_llama[0])
    before = path.read_bytes()
    r = subprocess.run([sys.executable, str(ROOT / "main.py"), "export", str(path), "--scheme",
                        "q8_0", "--format", "safetensors", "-o", str(path)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "input of the open model" in r.stderr
    assert "Traceback" not in r.stderr
    assert path.read_bytes() == before


def test_stale_temps_of_dead_processes_are_cleaned(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".out.gguf.quant-workbench-{dead.pid}-abc123.tmp"
    live = tmp_path / f".out.gguf.quant-workbench-{os.getpid() + 0}-zzz.tmp"
    other = tmp_path / ".unrelated.tmp"
    for p in (stale, live, other):
        p.write_bytes(b"x")
    assert clean_stale_temps(tmp_path) == [stale.name]
    assert not stale.exists() and live.exists() and other.exists()


def test_kill_9_during_export_then_next_export_cleans_up(tiny_llama, tmp_path):
    """A killed export leaves its named temp file; the next export into the folder removes it."""
    out = tmp_path / "big.safetensors"
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
            "import time, numpy as np\n"
            "from workbench.export.st_writer import StreamingSafetensorsWriter\n"
            f"w = StreamingSafetensorsWriter({str(out)!r})\n"
            "w.add('a', np.zeros(1000, np.float32))\n"
            "print('ready', flush=True); time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    temps = [p for p in tmp_path.iterdir() if "quant-workbench" in p.name]
    assert temps, list(tmp_path.iterdir())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    run(export(open_model(tiny_llama[0]), Plan(default="q8_0"), "safetensors", out))
    assert out.is_file()
    assert not [p for p in tmp_path.iterdir() if "quant-workbench" in p.name]


def test_unwritable_folder_one_line_error(tiny_llama):
    # /proc/self is a folder no one (root included) can create files in
    with pytest.raises(WorkbenchError, match="cannot write here"):
        run(export(open_model(tiny_llama[0]), Plan(default="q8_0"), "gguf", "/proc/self/x.gguf"))

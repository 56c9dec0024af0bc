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

from workbench.core.atomic import clean_stale_temps
from workbench.core.errors import WorkbenchError
from workbench.export import export
from workbench.formats.loaders import open_model
from workbench.quant.plan import Plan
from workbench.core.progress import run

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "resources" / "demo_model"


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
    probe = tmp_path / f".out.gguf.quant-workbench-{dead.pid}-m2uaqvk6.probe.tmp"  # output door
    live = tmp_path / f".out.gguf.quant-workbench-{os.getpid() + 0}-zzz.tmp"
    other = tmp_path / ".unrelated.tmp"
    for p in (stale, probe, live, other):
        p.write_bytes(b"x")
    assert sorted(clean_stale_temps(tmp_path)) == sorted([stale.name, probe.name])
    assert not stale.exists() and not probe.exists() and live.exists() and other.exists()


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


# ---- issue 9 (numerics helper): folders, links, cancel, disk full, kill -9 of the real CLI ----

def _cli(*args, **kw):
    return subprocess.run([sys.executable, str(ROOT / "main.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=120, **kw)


def _folder_model(tmp_path):
    from safetensors.numpy import save_file
    d = tmp_path / "hf"
    d.mkdir()
    rng = np.random.default_rng(0)
    save_file({"model.layers.0.mlp.up_proj.weight": rng.standard_normal((64, 64), np.float32)},
              str(d / "model-00001-of-00002.safetensors"))
    save_file({"model.layers.0.mlp.down_proj.weight": rng.standard_normal((64, 64), np.float32)},
              str(d / "model-00002-of-00002.safetensors"))
    (d / "model.safetensors.index.json").write_text(
        '{"metadata": {}, "weight_map": {'
        '"model.layers.0.mlp.up_proj.weight": "model-00001-of-00002.safetensors", '
        '"model.layers.0.mlp.down_proj.weight": "model-00002-of-00002.safetensors"}}')
    (d / "config.json").write_text('{"model_type": "llama"}')
    return d


def _snapshot(folder):
    return {p.name: p.read_bytes() for p in Path(folder).iterdir() if p.is_file()}


def test_every_input_of_a_folder_model_is_protected(tmp_path):
    d = _folder_model(tmp_path)
    before = _snapshot(d)
    link = tmp_path / "link.safetensors"
    link.symlink_to(d / "model-00002-of-00002.safetensors")
    for model in (d, d / "model.safetensors.index.json"):
        m = open_model(model)
        for target in [d / n for n in before] + [link]:
            with pytest.raises(WorkbenchError, match="input of the open model"):
                run(export(m, Plan(default="int8-channel"), "safetensors", target))
        with pytest.raises(WorkbenchError, match="holds an input of the open model"):
            run(export(m, Plan(default="int8-channel"), "compressed-tensors", tmp_path))
    assert _snapshot(d) == before
    assert not [p for p in d.iterdir() if "quant-workbench" in p.name]


def test_compressed_tensors_never_replaces_a_folder_with_other_files(tiny_llama, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("precious")
    m = open_model(tiny_llama[0])
    with pytest.raises(WorkbenchError, match=r"holds other files \(notes.txt\)"):
        run(export(m, Plan(default="int8-channel"), "compressed-tensors", out))
    assert (out / "notes.txt").read_text() == "precious"
    # a previous export is replaced as a whole when asked; a killed run's temp folder is cleaned
    new = tmp_path / "q"
    run(export(m, Plan(default="int8-channel"), "compressed-tensors", new))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".q.quant-workbench-{dead.pid}.tmp"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"x" * 100)
    run(export(m, Plan(default="int4-g32"), "compressed-tensors", new, overwrite=True))
    assert sorted(p.name for p in new.iterdir()) == ["config.json", "model.safetensors"]
    assert not stale.exists()


@pytest.mark.parametrize("fmt", ["safetensors", "gguf", "compressed-tensors"])
def test_cancel_mid_export_leaves_no_temp_and_the_old_file(tiny_llama, tmp_path, fmt):
    out = tmp_path / "out"
    m = open_model(tiny_llama[0])
    run(export(m, Plan(default="q8_0"), fmt, out))
    before = {p.name for p in tmp_path.iterdir()}
    calls = {"n": 0}

    def cancel():
        calls["n"] += 1
        return calls["n"] > 3
    from workbench.core.errors import Cancelled
    with pytest.raises(Cancelled):
        run(export(m, Plan(default="int8-channel" if fmt != "gguf" else "q4_0"), fmt, out,
                   overwrite=True), should_cancel=cancel)
    assert {p.name for p in tmp_path.iterdir()} == before


def test_disk_full_is_one_line_and_leaves_nothing(tiny_llama, tmp_path):
    """A file size limit (EFBIG, like a full disk) hit mid-write: one line, exit 2, no temp file,
    the existing output untouched."""
    out = tmp_path / "sub" / "o.safetensors"
    out.parent.mkdir()
    out.write_bytes(b"old")
    code = ("import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
            "resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000)); "
            f"sys.path.insert(0, {str(ROOT)!r}); from workbench.cli import main; "
            f"sys.exit(main(['export', {str(tiny_llama[0])!r}, '--scheme', 'fp32', "
            f"'--format', '{{fmt}}', '-o', {str(out)!r}]))")
    for fmt in ("safetensors", "gguf"):
        r = subprocess.run([sys.executable, "-c", code.replace("{fmt}", fmt)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, r.stderr
        assert "Traceback" not in r.stderr and "write failed" in r.stderr, r.stderr
        assert out.read_bytes() == b"old"
        assert sorted(p.name for p in out.parent.iterdir()) == ["o.safetensors"]


def test_kill_9_of_the_cli_mid_export_then_next_export_cleans(make_safetensors, tmp_path):
    rng = np.random.default_rng(0)
    src = make_safetensors({f"l{i}.weight": rng.standard_normal((1024, 1024), np.float32)
                            for i in range(24)}, name="big.safetensors")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "big.gguf"
    proc = subprocess.Popen([sys.executable, str(ROOT / "main.py"), "export", str(src),
                             "--scheme", "fp32", "--format", "gguf", "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    temps = []
    for _ in range(3000):                       # wait for its temporary file, then kill -9
        # (the output door's writability probe, ".probe.tmp", comes and goes first)
        temps = [p for p in out_dir.iterdir()
                 if "quant-workbench" in p.name and not p.name.endswith(".probe.tmp")]
        try:
            if temps and temps[0].stat().st_size > 0 or proc.poll() is not None:
                break
        except FileNotFoundError:
            pass
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if not temps:
        pytest.skip("the export finished before it could be killed")
    assert temps[0].name.startswith(".big.gguf.quant-workbench-") and temps[0].exists()
    r = _cli("export", src, "--scheme", "q8_0", "--format", "gguf", "-o", out)
    assert r.returncode == 0, r.stderr
    assert [p.name for p in out_dir.iterdir()] == ["big.gguf"]


def test_onnx_export_to_a_full_disk_says_so(tmp_path, monkeypatch, cli_main):
    """The traced file written to /dev/full (ENOSPC): the message names the disk, not the
    network (before: "torch.onnx could not trace the ... network")."""
    pytest.importorskip("onnx")
    import workbench.core.atomic as atomic
    real = atomic.make_temp_dir

    def full(directory, label):
        d = real(directory, label)
        os.symlink("/dev/full", d / "traced.onnx")
        return d
    monkeypatch.setattr(atomic, "make_temp_dir", full)
    out = tmp_path / "o.onnx"
    rc, err = cli_main("export", DEMO, "--scheme", "q4_0", "--format", "onnx", "-o", out)
    assert rc == 2
    line = err.strip().splitlines()[-1]
    assert f"{out}: cannot write the traced network in {tmp_path} (disk full (ENOSPC))" in line
    assert "trace" not in line.split("(disk full")[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == []       # nothing left


def test_write_problem_reads_wrapped_errors():
    import errno

    from workbench.core.atomic import write_problem
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("serialization failed") from inner
    except RuntimeError as exc:
        assert write_problem(exc) == "disk full (ENOSPC)"
    assert write_problem(RuntimeError("[enforce fail] write: No space left on device")) == \
        "disk full (ENOSPC)"
    assert write_problem(OSError(errno.EROFS, "ro")) == "read-only file system (EROFS)"
    assert write_problem(ValueError("bad graph")) is None


def test_onnx_temp_folders_of_killed_runs_are_removed(tmp_path):
    import subprocess
    import sys
    import time

    from workbench.core.atomic import LEGACY_STALE_SECONDS, clean_stale_temps, make_temp_dir
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".o.onnx.quant-workbench-{dead.pid}-abc123.tmp"
    stale.mkdir()
    (stale / "traced.onnx").write_bytes(b"x" * 100)
    legacy = tmp_path / ".qwb-onnx-ab12cd34"           # an earlier version's, no process id
    legacy.mkdir()
    os.utime(legacy, (time.time() - LEGACY_STALE_SECONDS - 60,) * 2)
    fresh_legacy = tmp_path / ".qwb-onnx-zz99yy88"      # maybe a run of an earlier version
    fresh_legacy.mkdir()
    live = make_temp_dir(tmp_path, "o.onnx")           # this process's: kept
    assert not stale.exists() and not legacy.exists()
    assert fresh_legacy.exists() and live.exists()
    assert live.name.startswith(f".o.onnx.quant-workbench-{os.getpid()}-")
    assert clean_stale_temps(tmp_path) == []


def test_onnx_export_killed_leaves_a_folder_the_next_export_removes(tmp_path, cli_main):
    """kill -9 of a real export while it traces: its temp folder is named with its pid, and
    the next export into the same folder removes it."""
    pytest.importorskip("onnx")
    import signal
    import subprocess
    import sys
    import time
    out = tmp_path / "o.onnx"
    p = subprocess.Popen([sys.executable, str(ROOT / "main.py"), "export", str(DEMO),
                          "--scheme", "q4_0", "--format", "onnx", "-o", str(out)],
                         cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    deadline = time.time() + 240
    left = []
    while time.time() < deadline and p.poll() is None:
        left = [q for q in tmp_path.iterdir() if q.is_dir()]
        if left:
            break
        time.sleep(0.02)
    if not left:
        p.kill()
        p.wait()
        pytest.skip("the export finished before its temp folder was seen")
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert left[0].exists() and f"quant-workbench-{p.pid}-" in left[0].name
    rc, err = cli_main("export", DEMO, "--scheme", "q4_0", "--format", "onnx", "-o", out)
    assert rc == 0, err
    assert sorted(q.name for q in tmp_path.iterdir()) == ["o.onnx"]

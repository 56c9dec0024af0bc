"""Issue 32 (hardening round 4), classes 1, 4, 5, 7 and 8: one test group per class. The fuzz
suite (tests/fuzz, kinds r4-outputs ... r4-leftovers) repeats each with generated inputs.
(Classes 2, 3 and 6, config.json against the tensors: tests/workbench/test_config_check.py.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from workbench.core.errors import WorkbenchError

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "resources" / "demo_model"


def _main(*argv) -> tuple[int, str]:
    import contextlib
    import io

    from workbench.cli import main
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main([str(a) for a in argv])
    return rc, err.getvalue()


def _model(folder: Path, tensors=None) -> Path:
    from workbench.export.st_writer import StreamingSafetensorsWriter
    folder.mkdir(parents=True, exist_ok=True)
    w = StreamingSafetensorsWriter(str(folder / "model.safetensors"))
    rng = np.random.default_rng(0)
    for name, shape in (tensors or [("blk.0.attn_q.weight", (8, 64)),
                                    ("blk.0.ffn_up.weight", (16, 64))]):
        w.add(name, rng.standard_normal(shape).astype(np.float32))
    w.finish()
    return folder / "model.safetensors"


# ---- 1: every output against every input ---------------------------------------------------
@pytest.mark.parametrize("flag,inp", [("--save-onnx", "--calib"), ("--save-onnx", "--held-out"),
                                      ("--save-onnx", "--plan"), ("--save-onnx", "--imatrix")])
@pytest.mark.parametrize("how", ["same", "symlink", "hardlink"])
def test_check_save_onnx_never_replaces_an_input(tmp_path, flag, inp, how):
    src = tmp_path / "input.txt"
    if inp == "--plan":
        src.write_text(json.dumps({"format": "quant-workbench-plan", "version": 1,
                                   "default": "q8_0", "rules": []}))
    else:
        src.write_text("hello world\n")
    before = src.read_bytes()
    out = {"same": src, "symlink": tmp_path / "l.onnx", "hardlink": tmp_path / "h.onnx"}[how]
    if how == "symlink":
        out.symlink_to(src)
    elif how == "hardlink":
        os.link(src, out)
    args = ["check", DEMO, "--runtime", "onnxruntime", flag, out, inp, src]
    if inp != "--plan":
        args += ["--scheme", "q8_0"]
    if inp == "--imatrix":
        args += ["--method", "imatrix"]
    rc, err = _main(*args)
    assert rc == 2
    line = err.strip()
    assert "\n" not in line
    assert f"{flag} is the same file as the input {inp}" in line
    assert str(out) in line and (how == "same" or str(src) in line)   # names both
    assert src.read_bytes() == before


def test_save_gguf_and_keep_are_outputs(tmp_path):
    calib = tmp_path / "c.txt"
    calib.write_text("hello\n")
    rc, err = _main("check", DEMO, "--scheme", "q8_0", "--runtime", "llama.cpp",
                    "--save-gguf", calib, "--calib", calib)
    assert rc == 2 and "--save-gguf is the same file as the input --calib" in err
    rc, err = _main("bench-onnx", DEMO, "--scheme", "q8_0", "--keep", DEMO)
    assert rc == 2 and "--keep is a folder holding the input MODEL" in err


def test_option_values_are_not_input_paths(tmp_path, monkeypatch):
    """`--format gguf` with a ./gguf folder present is the format, not that folder: a
    re-export into ./gguf/ is no longer refused as replacing an input."""
    model = _model(tmp_path / "m")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gguf").mkdir()
    (tmp_path / "q8_0").mkdir()
    for _ in range(2):
        rc, err = _main("export", model, "--scheme", "q8_0", "--format", "gguf",
                        "-o", "gguf/out.gguf")
        assert rc == 0, err
    rc, err = _main("export", model, "--scheme", "q8_0", "--format", "plan", "-o", "q8_0/p.json")
    assert rc == 0, err
    rc, err = _main("export", model, "--scheme", "q8_0", "--format", "plan", "-o", "q8_0/p.json")
    assert rc == 0, err


def test_choice_arguments_are_never_paths():
    from workbench.cli import build_parser
    from workbench.cli.common import _choice_dests
    p = build_parser(only="export")
    dests = _choice_dests(p, "export")
    assert {"format", "target", "act_method"} <= dests
    assert "plan" not in dests and "calib" not in dests


# ---- 4: sidecar files are size-limited before they are read --------------------------------
def _demo_copy(tmp_path) -> Path:
    import shutil
    folder = tmp_path / "m"
    shutil.copytree(DEMO, folder)
    return folder


@pytest.mark.parametrize("name,limit", [("config.json", "16 MiB"),
                                        ("tokenizer.json", "64 MiB"),
                                        ("tokenizer_config.json", "64 MiB")])
@pytest.mark.parametrize("cmd", ["export-ct", "export-gguf", "calibrate"])
def test_sparse_sidecar_over_its_limit_is_refused_by_name(tmp_path, name, limit, cmd):
    folder = _demo_copy(tmp_path)
    side = folder / name
    os.truncate(side, 8 << 30)            # 8 GB, sparse: read whole it would blow memory
    argv = {"export-ct": ["export", folder, "--scheme", "int4-g32", "--format",
                          "compressed-tensors", "-o", tmp_path / "ct"],
            "export-gguf": ["export", folder, "--scheme", "q8_0", "--format", "gguf",
                            "-o", tmp_path / "o.gguf"],
            "calibrate": ["calibrate", folder, "-o", tmp_path / "im.gguf"]}[cmd]
    if name == "tokenizer_config.json" and cmd != "export-ct":
        # only read by check's BOS lookup and copied by the compressed-tensors export
        argv = ["check", folder, "--scheme", "q8_0", "--chunks", "1", "--ctx", "16"]
    rc, err = _main(*argv)
    assert rc == 2, err
    assert f"{name}: {name} is 8,589,934,592 bytes, over the {limit} limit for this file" in err
    assert not (tmp_path / "ct").exists() and not (tmp_path / "o.gguf").exists()


def test_config_over_the_limit_is_not_treated_as_absent(tmp_path):
    """Before: a config.json over 4 MiB read as "no config", and the compressed-tensors export
    wrote a new config.json without model_type."""
    from workbench.core.limits import MAX_SIDECAR
    folder = _demo_copy(tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["padding"] = "x" * (MAX_SIDECAR + 1)
    (folder / "config.json").write_text(json.dumps(cfg))
    rc, err = _main("export", folder, "--scheme", "int4-g32", "--format", "compressed-tensors",
                    "-o", tmp_path / "ct")
    assert rc == 2 and "over the 16 MiB limit" in err and "config.json" in err
    assert not (tmp_path / "ct").exists()
    from workbench.formats.llama_names import read_config
    from workbench.formats.loaders import open_model
    with pytest.raises(WorkbenchError, match="over the 16 MiB limit"):
        read_config(open_model(folder))


def test_sparse_index_is_refused_without_reading(tmp_path):
    import time
    model = _model(tmp_path / "m")
    idx = tmp_path / "m" / "model.safetensors.index.json"
    idx.write_text(json.dumps({"weight_map": {"blk.0.attn_q.weight": model.name}}))
    os.truncate(idx, 8 << 30)
    t0 = time.perf_counter()
    rc, err = _main("inspect", tmp_path / "m")
    assert rc == 2 and "over the 64 MiB limit" in err and "index.json" in err
    assert time.perf_counter() - t0 < 5


def test_sidecar_limits_table():
    from workbench.core.limits import check_sidecar, sidecar_limit
    assert sidecar_limit("a/config.json") == 16 << 20
    assert sidecar_limit("a/model.safetensors.index.json") == 64 << 20
    assert sidecar_limit("a/tokenizer.json") == 64 << 20
    with pytest.raises(WorkbenchError, match="not a regular file"):
        check_sidecar("/dev/null", "config.json")


# ---- 5: untrusted regular expressions and nesting ------------------------------------------
def test_compressed_tensors_target_regex_runs_on_re2():
    import time

    from workbench.formats.loaders.compressed_tensors_format import _args_for
    groups = [(["re:(.*.*)*X"], {"num_bits": 4}), (["re:.*mlp.*"], {"num_bits": 8})]
    name = "model.layers.0." + "a" * 5000 + ".mlp.up_proj"
    t0 = time.perf_counter()
    assert _args_for(name, groups) == {"num_bits": 8}       # Python's re: minutes (backtracking)
    assert time.perf_counter() - t0 < 10.0                  # re2: milliseconds
    assert _args_for("yX", groups) == {"num_bits": 4}       # re.match semantics kept
    with pytest.raises(WorkbenchError, match=r"config.json.*target re:\(a\)\\1"):
        _args_for("aa", [(["re:(a)\\1"], {})], path="m/config.json")


def test_diff_of_a_hostile_compressed_tensors_target_ends(tmp_path):
    import time
    folder = _demo_copy(tmp_path)
    rc, err = _main("export", folder, "--scheme", "int4-g32", "--format", "compressed-tensors",
                    "-o", tmp_path / "ct")
    assert rc == 0, err
    cfg = json.loads((tmp_path / "ct" / "config.json").read_text())
    for g in cfg["quantization_config"]["config_groups"].values():
        g["targets"] = ["re:(.*.*)*X"] + g["targets"]
    (tmp_path / "ct" / "config.json").write_text(json.dumps(cfg))
    t0 = time.perf_counter()
    rc, err = _main("diff", tmp_path / "ct", tmp_path / "ct")
    assert rc == 0, err
    assert time.perf_counter() - t0 < 60


@pytest.mark.parametrize("what", ["config", "ct-config", "index", "tokenizer_config",
                                  "tokenizer_config-gguf"])
def test_deep_json_sidecar_is_exit_2_naming_it(tmp_path, what):
    folder = _demo_copy(tmp_path)
    deep = '{"a": ' + "[" * 200_000 + "]" * 200_000 + "}"
    if what == "config":
        (folder / "config.json").write_text(deep)
        argv = ["allocate", folder, "--budget-bpw", "6", "-o", tmp_path / "p.json"]
        name = "config.json"
    elif what == "ct-config":
        (folder / "config.json").write_text(deep)
        argv = ["diff", folder / "model.safetensors", folder / "model.safetensors"]
        name = "config.json"
    elif what == "index":
        (folder / "model.safetensors.index.json").write_text(deep)
        argv = ["inspect", folder]
        name = "model.safetensors.index.json"
    elif what == "tokenizer_config":
        (folder / "tokenizer_config.json").write_text(deep)
        argv = ["check", folder, "--scheme", "q8_0", "--chunks", "1", "--ctx", "16"]
        name = "tokenizer_config.json"
    else:   # read by the gguf package's SpecialVocab (plain json.load: was exit 3)
        (folder / "tokenizer_config.json").write_text('{"a":' * 1000 + "1" + "}" * 1000)
        argv = ["export", folder, "--scheme", "q8_0", "--format", "gguf", "-o", tmp_path / "o.gguf"]
        name = "tokenizer_config.json"
    rc, err = _main(*argv)
    assert rc == 2, err
    line = err.strip().splitlines()[-1]          # (a progress line may come before it)
    assert line.startswith("quant-workbench: error:") and name in line and "nested" in line


# ---- 7: the right message ------------------------------------------------------------------
@pytest.fixture(scope="module")
def demo_gguf(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("g") / "demo.gguf"
    rc, err = _main("export", DEMO, "--scheme", "q8_0", "--format", "gguf", "-o", out)
    assert rc == 0, err
    return out


@pytest.mark.parametrize("cut", [4, 3000, -100])
def test_budget_of_a_truncated_gguf_gets_inspects_refusal(tmp_path, demo_gguf, cut):
    data = demo_gguf.read_bytes()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[:cut])
    rc_i, err_i = _main("inspect", bad)
    rc, err = _main("allocate", DEMO, "--budget-of", bad, "-o", tmp_path / "p.json")
    assert rc_i == 2 and rc == 2
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"quant-workbench: error: {bad}: ") and "--budget-of: " in line
    assert line.replace("--budget-of: ", "") == err_i.strip().splitlines()[-1]
    assert not (tmp_path / "p.json").exists()


def test_budget_of_a_tensorless_gguf_is_no_budget(tmp_path):
    import struct
    empty = tmp_path / "e.gguf"
    empty.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 0))
    rc, err = _main("allocate", DEMO, "--budget-of", empty, "-o", tmp_path / "p.json")
    assert rc == 2 and f"{empty}: --budget-of: a GGUF file with no tensors" in err


def test_gguf_with_sparse_padding_is_read(tmp_path, demo_gguf):
    """A valid GGUF followed by 100 GB of sparse padding: the header is read as far as it
    goes (before: the whole file memory-mapped, which a 2 GiB address-space limit refuses,
    and the file was called corrupt)."""
    import subprocess
    import sys
    pad = tmp_path / "pad.gguf"
    pad.write_bytes(demo_gguf.read_bytes())
    os.truncate(pad, 100 << 30)
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30));"
            "from workbench.formats.loaders import open_model; m = open_model(sys.argv[1]);"
            "n = 'blk.0.attn_q.weight'; print(len(m.tensors), m.raw(n).shape)")
    r = subprocess.run([sys.executable, "-c", code, str(pad)], capture_output=True, text=True,
                       cwd=ROOT, timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr[-800:]
    from workbench.formats.loaders import open_model
    assert r.stdout.split()[0] == str(len(open_model(demo_gguf).tensors))


def test_gguf_header_read_in_steps_is_the_same(tmp_path, demo_gguf, monkeypatch):
    from workbench.formats.loaders.gguf_reader import GGUFFile
    whole = GGUFFile(demo_gguf)
    monkeypatch.setattr(GGUFFile, "HEADER_STEP", 7)      # every read a short one
    steps = GGUFFile(demo_gguf)
    assert [(t.name, t.shape, t.data_offset) for t in whole.tensors] == \
        [(t.name, t.shape, t.data_offset) for t in steps.tensors]
    assert {k: f.contents() for k, f in whole.fields.items()} == \
        {k: f.contents() for k, f in steps.fields.items()}


def test_onnx_export_to_a_full_disk_says_so(tmp_path, monkeypatch):
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
    rc, err = _main("export", DEMO, "--scheme", "q4_0", "--format", "onnx", "-o", out)
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


# ---- 8: leftovers and limits ---------------------------------------------------------------
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


def test_onnx_export_killed_leaves_a_folder_the_next_export_removes(tmp_path):
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
    rc, err = _main("export", DEMO, "--scheme", "q4_0", "--format", "onnx", "-o", out)
    assert rc == 0, err
    assert sorted(q.name for q in tmp_path.iterdir()) == ["o.onnx"]


def test_cluster_local_n_is_capped_by_the_cores(monkeypatch):
    from workbench.jobs import cluster
    monkeypatch.setattr(cluster, "cores", lambda: 4)
    assert cluster.local_workers(2) == (2, None)
    n, note = cluster.local_workers(10 ** 6)
    assert n == 4 and note == ("--cluster local:1,000,000: this machine has 4 cores for this "
                               "process; starting 4 workers")
    assert cluster.local_workers(None) == (4, None)
    assert cluster.parse_spec("local:" + "9" * 5000) == ("local", 10 ** 12)
    for bad in ("local:0", "local:\u00b2", "local:-3", "local:1e3"):
        with pytest.raises(WorkbenchError, match="whole number of at least 1"):
            cluster.parse_spec(bad)


@pytest.mark.parametrize("kind", ["plan", "session"])
def test_plan_and_session_sizes_are_checked_before_reading(tmp_path, kind):
    big = tmp_path / f"big.{kind}.json"
    big.write_text("{}")
    os.truncate(big, 8 << 30)
    fifo = tmp_path / f"fifo.{kind}.json"
    os.mkfifo(fifo)
    if kind == "plan":
        from workbench.quant.plan import Plan as load_from
    else:
        from app.session import Session as load_from
    with pytest.raises(WorkbenchError, match=r"is 8,589,934,592 bytes, over the 64 MiB limit"):
        load_from.load(big)
    with pytest.raises(WorkbenchError, match="not a regular file"):   # (it would block)
        load_from.load(fifo)
    with pytest.raises(WorkbenchError, match="file not found"):
        load_from.load(tmp_path / "none.json")


def test_a_small_sidecar_is_read_without_allocating_its_limit(tmp_path):
    """read_sidecar sizes its read by the file: under an address-space limit a 20-byte file
    with a 1 GiB limit reads (read(limit + 1) allocated the whole limit: MemoryError)."""
    import subprocess
    import sys
    small = tmp_path / "config.json"
    small.write_text('{"model_type": "x"}')
    code = (
        "import resource, sys\n"
        "from workbench.core.limits import read_sidecar\n"
        "import numpy, json\n"
        "with open('/proc/self/statm') as f: vm = int(f.read().split()[0]) * 4096\n"
        "resource.setrlimit(resource.RLIMIT_AS, (vm + (256 << 20), resource.RLIM_INFINITY))\n"
        f"print(len(read_sidecar({str(small)!r}, limit=1 << 30)))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "19", r.stderr

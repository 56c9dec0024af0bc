"""The one door every output goes through (workbench.core.outputs.check_output): the API, the
CLI and the app refuse, before any work starts and with nothing written, an output that is an
input or lies inside one, that has no folder to go into or cannot be written there, or that is an
existing non-empty folder the user did not ask to replace."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import workbench as qw
from workbench.core.errors import WorkbenchError
from workbench.core.outputs import check_output

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "resources" / "demo_model"


def _digest(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture
def demo(tmp_path):
    """A copy of the demo model's folder (config, weights, tokenizer), opened."""
    folder = tmp_path / "demo"
    shutil.copytree(DEMO, folder)
    return folder, qw.open_model(folder / "model.safetensors")


class _Events:
    """A progress callback that records every event: none may come before a refusal."""

    def __init__(self):
        self.events = []

    def __call__(self, ev):
        self.events.append(ev)


def _cli(*argv, cwd=None):
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    r = subprocess.run([sys.executable, str(ROOT / "main.py"), *map(str, argv)],
                       capture_output=True, text=True, cwd=cwd, env=env, timeout=600)
    return r.returncode, r.stdout, r.stderr


# ---- the API ----------------------------------------------------------------------------------
@pytest.mark.parametrize("victim", ["model.safetensors", "config.json", "tokenizer.json"])
def test_allocate_plan_never_writes_over_the_model(demo, victim):
    folder, model = demo
    before = _digest(folder)
    ev = _Events()
    with pytest.raises(WorkbenchError, match="input of the open model"):
        qw.allocate_plan(model, qw.Budget.bits_per_weight(4.5), output=folder / victim,
                         progress=ev)
    assert ev.events == [] and _digest(folder) == before


def test_allocate_plan_refuses_an_unwritable_output_before_measuring(demo, tmp_path):
    _folder, model = demo
    (tmp_path / "a-file").write_text("x")
    cases = {tmp_path / "missing" / "parent" / "plan.json": "does not exist",
             tmp_path / "a-file" / "plan.json": "it is a file",
             tmp_path: "is a folder",
             Path("/proc/plan.json"): "cannot write here"}
    for out, why in cases.items():
        ev = _Events()
        with pytest.raises(WorkbenchError, match=why) as exc:
            qw.allocate_plan(model, qw.Budget.bits_per_weight(4.5), output=out, progress=ev)
        assert str(out) in str(exc.value) and "\n" not in str(exc.value)
        assert ev.events == [], f"{out}: work started before the refusal"
    with pytest.raises(WorkbenchError, match="output .*path"):      # (the argument checks')
        qw.allocate_plan(model, qw.Budget.bits_per_weight(4.5), output=123)


def test_allocate_plan_never_writes_over_its_calibration_text(demo, tmp_path):
    _folder, model = demo
    calib = tmp_path / "calib.txt"
    calib.write_text("some text\n" * 8)
    with pytest.raises(WorkbenchError, match="calib"):
        qw.allocate_plan(model, qw.Budget.bits_per_weight(4.5), calib=calib, output=calib)
    assert calib.read_text() == "some text\n" * 8


def test_export_never_replaces_a_model_folder_unless_asked(demo, tmp_path):
    """The data-loss case: a compressed-tensors export into an existing float model folder
    (what `convert --to hf` writes) replaced its config.json and model.safetensors."""
    _folder, model = demo
    other = tmp_path / "other-model"
    shutil.copytree(DEMO, other)
    (other / "notes.txt").write_text("mine")
    before = _digest(other)
    with pytest.raises(WorkbenchError, match="holds a model.*overwrite"):
        qw.export_plan(model, "int8-channel", "compressed-tensors", other)
    assert _digest(other) == before
    info = qw.export_plan(model, "int8-channel", "compressed-tensors", other, overwrite=True)
    assert info["quantized"] > 0
    assert not (other / "notes.txt").exists()          # replaced as a whole, as asked
    assert "quantization_config" in (other / "config.json").read_text()


def test_a_folder_holding_an_input_is_never_replaced_even_with_overwrite(demo):
    folder, model = demo
    before = _digest(folder)
    for out in (folder, folder.parent):
        with pytest.raises(WorkbenchError, match="input"):
            qw.export_plan(model, "int8-channel", "compressed-tensors", out, overwrite=True)
    assert _digest(folder) == before


def test_an_empty_or_new_folder_needs_no_overwrite(demo, tmp_path):
    _folder, model = demo
    (tmp_path / "empty").mkdir()
    for out in (tmp_path / "empty", tmp_path / "new"):
        qw.export_plan(model, "int8-channel", "compressed-tensors", out)
        assert (out / "model.safetensors").is_file()


def test_check_plan_refuses_its_save_path_before_running(demo):
    folder, model = demo
    ev = _Events()
    with pytest.raises(WorkbenchError, match="save_onnx"):
        qw.check_plan(model, "int8-channel", runtime="onnxruntime",
                      save_onnx=folder / "config.json", progress=ev)
    assert ev.events == []


def test_calibrate_checks_its_output_first(demo, tmp_path):
    _folder, model = demo
    for out, why in ((tmp_path, "is a folder"), (tmp_path / "no" / "x.gguf", "does not exist")):
        ev = _Events()
        with pytest.raises(WorkbenchError, match=why):
            qw.calibrate(model, out, progress=ev)
        assert ev.events == []
    info = qw.calibrate(model, tmp_path / "imatrix.gguf", samples=2)
    assert info["tensors"] > 0 and (tmp_path / "imatrix.gguf").stat().st_size > 0
    assert not [p for p in tmp_path.iterdir() if ".quant-workbench-" in p.name]


def test_check_output_rules(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    (tmp_path / "f").write_text("x")
    assert check_output(tmp_path / "new.json") == tmp_path / "new.json"
    assert check_output(tmp_path / "f") == tmp_path / "f"           # a file is replaced atomically
    with pytest.raises(WorkbenchError, match="choose a new file name"):
        check_output(tmp_path / "f", replace_file=False)
    with pytest.raises(WorkbenchError, match="is a file, not a folder"):
        check_output(tmp_path / "f", kind="folder")
    with pytest.raises(WorkbenchError, match="holds other files") as exc:
        check_output(tmp_path / "full", kind="folder", overwrite=None)
    assert "overwrite" not in str(exc.value)                  # convert offers no way to replace
    assert check_output(tmp_path / "full", kind="folder", overwrite=True)
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    with pytest.raises(WorkbenchError, match="symbolic link"):
        check_output(tmp_path / "dangling")
    with pytest.raises(WorkbenchError, match="output: expected a file path"):
        check_output(None)
    assert not [p for p in tmp_path.iterdir() if ".quant-workbench-" in p.name]


# ---- the CLI ----------------------------------------------------------------------------------
def test_cli_allocate_to_an_unwritable_place_fails_at_once(demo, tmp_path):
    folder, _model = demo
    for out, why in ((Path("/proc/plan.json"), "cannot write here"),
                     (tmp_path / "missing" / "plan.json", "does not exist")):
        rc, out_text, err = _cli("allocate", folder / "model.safetensors", "--budget-bpw", "4.5",
                                 "-o", out)
        assert rc == 2 and "Traceback" not in err, err
        assert why in err and str(out) in err and len(err.strip().splitlines()) == 1, err
        assert "allocate:" not in err       # no cost lines: the work never started


def test_cli_export_refuses_a_model_folder_and_overwrite_allows_it(demo, tmp_path):
    folder, _model = demo
    other = tmp_path / "float-folder"
    shutil.copytree(DEMO, other)
    before = _digest(other)
    args = ["export", folder / "model.safetensors", "--scheme", "int8-channel", "--format",
            "compressed-tensors", "-o", other]
    rc, _out, err = _cli(*args)
    assert rc == 2 and "holds a model" in err and "--overwrite" in err, err
    assert _digest(other) == before
    rc, out, err = _cli(*args, "--overwrite")
    assert rc == 0, err
    assert _digest(other) != before


def test_cli_calibrate_output_errors_are_one_line(demo, tmp_path):
    folder, _model = demo
    for out, why in ((tmp_path, "is a folder"), (tmp_path / "a" / "b" / "x.gguf",
                                                 "does not exist")):
        rc, _o, err = _cli("calibrate", folder / "model.safetensors", "-o", out)
        assert rc == 2 and why in err and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1, err


def _plan(path: Path) -> Path:
    path.write_text(json.dumps({"format": "quant-workbench-plan", "version": 1,
                                "default": "q8_0", "rules": []}))
    return path


@pytest.mark.parametrize("how", ["same", "symlink", "hardlink"])
def test_output_naming_the_plan_is_refused_before_writing(tmp_path, how, small_model):
    from workbench.cli import main
    model = small_model(tmp_path / "m")
    plan = _plan(tmp_path / "plan.json")
    before = plan.read_bytes()
    out = {"same": plan, "symlink": tmp_path / "l.json", "hardlink": tmp_path / "h.json"}[how]
    if how == "symlink":
        out.symlink_to(plan)
    elif how == "hardlink":
        os.link(plan, out)
    rc = main(["export", str(model), "--plan", str(plan), "--format", "gguf", "-o", str(out)])
    assert rc == 2
    assert plan.read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if "quant-workbench" in p.name]


def test_every_file_argument_is_checked(tmp_path, capsys, small_model):
    """imatrix, calibration file, a model's companion file, a folder holding an input."""
    from workbench.cli import main
    model = small_model(tmp_path / "m")
    (tmp_path / "m" / "config.json").write_text("{}")
    imx = tmp_path / "x.dat"
    imx.write_bytes(struct.pack("<i", 0))
    calib = tmp_path / "c.txt"
    calib.write_text("hello\n")
    cases = [
        ["export", model, "--scheme", "q4_0", "--format", "gguf", "--method", "imatrix",
         "--imatrix", imx, "-o", imx],
        ["calibrate", model, "--calib", calib, "-o", calib],
        ["export", model, "--scheme", "q8_0", "--format", "plan", "-o",
         tmp_path / "m" / "config.json"],
        ["export", model, "--scheme", "q8_0", "--format", "compressed-tensors", "-o",
         tmp_path / "m"],
        ["allocate", model, "--budget-bpw", "6", "-o", model],
    ]
    for argv in cases:
        snapshot = {p: p.read_bytes() for p in (imx, calib, model, tmp_path / "m" / "config.json")}
        assert main([str(a) for a in argv]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "nothing was written" in err, err
        assert all(p.read_bytes() == b for p, b in snapshot.items())


def test_a_fresh_output_still_works(tmp_path, small_model):
    from workbench.cli import main
    model = small_model(tmp_path / "m")
    plan = _plan(tmp_path / "plan.json")
    assert main(["export", str(model), "--plan", str(plan), "--format", "plan",
                 "-o", str(tmp_path / "out.json")]) == 0


def test_refuse_inputs_as_outputs_names_both(tmp_path):
    from workbench.core.outputs import refuse_inputs_as_outputs
    a = tmp_path / "a.json"
    a.write_text("{}")
    (tmp_path / "b.json").symlink_to(a)
    with pytest.raises(WorkbenchError, match=r"--output is the same file as the input --plan"):
        refuse_inputs_as_outputs({"--output": str(tmp_path / "b.json")}, {"--plan": str(a)})
    refuse_inputs_as_outputs({"--output": str(tmp_path / "new.json")}, {"--plan": str(a)})


@pytest.mark.parametrize("flag,inp", [("--save-onnx", "--calib"), ("--save-onnx", "--held-out"),
                                      ("--save-onnx", "--plan"), ("--save-onnx", "--imatrix")])
@pytest.mark.parametrize("how", ["same", "symlink", "hardlink"])
def test_check_save_onnx_never_replaces_an_input(tmp_path, flag, inp, how, cli_main):
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
    rc, err = cli_main(*args)
    assert rc == 2
    line = err.strip()
    assert "\n" not in line
    assert f"{flag} is the same file as the input {inp}" in line
    assert str(out) in line and (how == "same" or str(src) in line)   # names both
    assert src.read_bytes() == before


def test_save_gguf_and_keep_are_outputs(tmp_path, cli_main):
    calib = tmp_path / "c.txt"
    calib.write_text("hello\n")
    rc, err = cli_main("check", DEMO, "--scheme", "q8_0", "--runtime", "llama.cpp",
                    "--save-gguf", calib, "--calib", calib)
    assert rc == 2 and "--save-gguf is the same file as the input --calib" in err
    rc, err = cli_main("bench-onnx", DEMO, "--scheme", "q8_0", "--keep", DEMO)
    assert rc == 2 and "--keep is a folder holding the input MODEL" in err


def test_option_values_are_not_input_paths(tmp_path, monkeypatch, cli_main, small_model):
    """`--format gguf` with a ./gguf folder present is the format, not that folder: a
    re-export into ./gguf/ is no longer refused as replacing an input."""
    model = small_model(tmp_path / "m")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gguf").mkdir()
    (tmp_path / "q8_0").mkdir()
    for _ in range(2):
        rc, err = cli_main("export", model, "--scheme", "q8_0", "--format", "gguf",
                        "-o", "gguf/out.gguf")
        assert rc == 0, err
    rc, err = cli_main("export", model, "--scheme", "q8_0", "--format", "plan", "-o", "q8_0/p.json")
    assert rc == 0, err
    rc, err = cli_main("export", model, "--scheme", "q8_0", "--format", "plan", "-o", "q8_0/p.json")
    assert rc == 0, err


def test_choice_arguments_are_never_paths():
    from workbench.cli import build_parser
    from workbench.cli.common import _choice_dests
    p = build_parser(only="export")
    dests = _choice_dests(p, "export")
    assert {"format", "target", "act_method"} <= dests
    assert "plan" not in dests and "calib" not in dests

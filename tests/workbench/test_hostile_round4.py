"""Issue 32 (hardening round 4), classes 1, 4, 5, 7 and 8: one test group per class. The fuzz
suite (tests/fuzz, kinds r4-outputs ... r4-leftovers) repeats each with generated inputs.
(Classes 2, 3 and 6, config.json against the tensors: tests/workbench/test_config_check.py.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from workbench.errors import WorkbenchError

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

"""Issue 9, one error path: every refusal names the file and the tensor; names that cannot be
encoded still print; anything unexpected is one line pointing at a crash log (exit 3)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from workbench.core.errors import WorkbenchError, context

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args, env=None):
    e = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, str(ROOT / "main.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=120, env=e)


def test_context_fills_in_only_what_is_missing():
    with pytest.raises(WorkbenchError) as exc:
        with context("m.gguf", "t"):
            raise WorkbenchError("bad")
    assert str(exc.value) == "m.gguf: tensor 't': bad" and exc.value.problem == "bad"
    with pytest.raises(WorkbenchError) as exc:
        with context("m.gguf", "t"):
            raise WorkbenchError("bad", path="other.gguf", tensor="u")
    assert str(exc.value) == "other.gguf: tensor 'u': bad"


def test_refusals_name_file_and_tensor(make_safetensors, tmp_path):
    w = np.full((2, 64), 0.1, np.float32)
    w[0, 3] = 1e30
    bad = np.ones((2, 64), np.float32)
    bad[1, 1] = np.nan
    path = make_safetensors({"big.weight": w, "nan.weight": bad}, name="m.safetensors")
    cases = [
        (["evaluate", path, "--scheme", "int4-g32"],
         f"{path}: tensor 'big.weight': int4-g32's float16 scale cannot represent value 1e+30"),
        (["export", path, "--scheme", "int4-g32", "--format", "safetensors", "-o",
          tmp_path / "o.safetensors"],
         f"{path}: tensor 'big.weight': int4-g32's float16 scale cannot represent value 1e+30"),
        (["evaluate", path, "--scheme", "fp16"],
         f"{path}: tensor 'big.weight': fp16 cannot represent value 1e+30"),
    ]
    for args, line in cases:
        r = _cli(*args)
        assert r.returncode == 2, r.stderr
        assert r.stderr.strip().splitlines()[-1].startswith(f"quant-workbench: error: {line}")
    nan_only = make_safetensors({"nan.weight": bad}, name="n.safetensors")
    for fmt, out in (("safetensors", "o2.safetensors"), ("gguf", "o2.gguf")):
        r = _cli("export", nan_only, "--scheme", "q8_0", "--format", fmt, "-o", tmp_path / out)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert f"{nan_only}: tensor 'nan.weight': " in r.stderr and "NaN/Inf" in r.stderr
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())   # no temp files left


def test_undecodable_ggml_type_names_file_and_tensor(tmp_path):
    import gguf
    path = tmp_path / "q81.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("blk.0.ffn_up.weight", np.zeros((2, 80), np.uint8), raw_shape=(2, 80),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    want = f"{path}: tensor 'blk.0.ffn_up.weight': GGML type Q8_1 cannot be dequantized"
    for args in (["inspect", path], ["evaluate", path, "--scheme", "q8_0"],
                 ["export", path, "--scheme", "q8_0", "--format", "gguf", "-o", tmp_path / "o.gguf"]):
        r = _cli(*args)
        assert r.returncode == 2 and want in r.stderr, (args, r.stderr)


def test_lone_surrogate_in_a_tensor_name_prints(tmp_path):
    from tests.conftest import write_safetensors_raw
    path = write_safetensors_raw(tmp_path / "s.safetensors",
                                 {"a\udc80b": {"dtype": "F32", "shape": [2, 32],
                                               "data_offsets": [0, 256]}},
                                 np.ones(64, np.float32).tobytes())
    for enc in ("utf-8", "ascii"):
        for args in (["inspect", path, "--no-stats"], ["evaluate", path, "--scheme", "int8-g32"]):
            r = _cli(*args, env={"PYTHONIOENCODING": enc})
            assert r.returncode == 0 and "Traceback" not in r.stderr, (enc, r.stderr)
            assert "a\\udc80b" in r.stdout or "a\ufffdb" in r.stdout, r.stdout


def test_unexpected_exception_is_one_line_with_a_crash_log(monkeypatch, tmp_path, capsys):
    """The catch-all (a bug somewhere): one line naming the log that holds the traceback."""
    from workbench import cli
    from workbench.cli.commands import schemes

    def boom(args):
        raise ValueError("cannot reshape array of size 0 into shape (0,newaxis)")
    monkeypatch.setattr(schemes, "run", boom)
    monkeypatch.delenv("QUANT_WORKBENCH_TRACEBACK", raising=False)
    monkeypatch.setenv("QUANT_WORKBENCH_LOG_DIR", str(tmp_path / "logs"))
    assert cli.main(["schemes"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("quant-workbench: internal error: ValueError: ")
    log = Path(err[0].rsplit("details in ", 1)[1].rstrip(")"))
    assert log.parent == tmp_path / "logs" and "Traceback" in log.read_text()
    assert "in boom" in log.read_text()
    # QUANT_WORKBENCH_TRACEBACK=1 (debugging) shows the traceback instead
    monkeypatch.setenv("QUANT_WORKBENCH_TRACEBACK", "1")
    with pytest.raises(ValueError):
        cli.main(["schemes"])


def test_huge_integers_and_regex_repeats_in_cli_args(tmp_path):
    plan = tmp_path / "p.json"
    plan.write_text('{"format": "quant-workbench-plan", "version": 1, "default": "int8-channel",'
                    ' "rules": [{"match": "re:a{4294967296}", "scheme": "q8_0"}], "n": '
                    + "9" * 5000 + "}")
    for args in (["evaluate", "--plan", plan], ["evaluate", "--scheme", "9" * 5000],
                 ["export", "--scheme", "int8-channel", "--format", "plan", "-o", tmp_path / ("9" * 300)]):
        r = _cli(*args)
        assert r.returncode in (0, 2) and "Traceback" not in r.stderr, (args[:2], r.stderr)
        assert len(r.stderr.strip().splitlines()) <= 2, r.stderr

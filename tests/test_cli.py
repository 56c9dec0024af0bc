"""The headless CLI: JSON contracts, errors (one line, exit 2, no traceback)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from workbench.cli import main

ROOT = Path(__file__).resolve().parents[1]
STAT_KEYS = {"min", "max", "mean", "std", "absmax", "kurtosis", "nan", "inf", "outlier_frac"}
EVAL_KEYS = {"name", "scheme", "bits_per_weight", "bytes", "mse", "rel_rmse", "sqnr_db",
             "max_abs_err", "cosine"}


def cli(capsys, *args):
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def sh(*args, **kw):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.update(kw.pop("env", {}))
    return subprocess.run([sys.executable, str(ROOT / "main.py"), *args], capture_output=True,
                          text=True, env=env, timeout=120, **kw)


def test_schemes_json(capsys):
    rc, out, _ = cli(capsys, "schemes", "--json")
    assert rc == 0
    rows = json.loads(out)["schemes"]
    by = {r["name"]: r for r in rows}
    assert by["int4-g128"]["bits_per_weight"] == 4.125
    assert by["nf4-g64"]["bits_per_weight"] == 4.5 and by["nf4-g64"]["block_size"] == 64
    assert by["fp32"]["bits_per_weight"] == 32.0
    rc, out, _ = cli(capsys, "schemes", "--json", "--variants")
    assert "int4-g128@mse@pot" in {r["name"] for r in json.loads(out)["schemes"]}
    rc, out, _ = cli(capsys, "schemes")
    assert rc == 0 and "int8-channel" in out


def _check_inspect(doc, n_tensors):
    assert len(doc["tensors"]) == n_tensors == doc["totals"]["tensors"]
    for t in doc["tensors"]:
        assert {"name", "shape", "dtype", "params", "bytes", "role", "block", "stats"} <= set(t)
        assert STAT_KEYS <= set(t["stats"])
        assert t["params"] == math.prod(t["shape"])
    assert doc["totals"]["params"] == sum(t["params"] for t in doc["tensors"])


def test_inspect_demo_json(capsys, demo_model_path):
    rc, out, _ = cli(capsys, "inspect", "--json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["model"] == str(demo_model_path)
    _check_inspect(doc, 39)
    q = next(t for t in doc["tensors"] if t["name"] == "model.layers.0.self_attn.q_proj.weight")
    assert (q["role"], q["block"], q["dtype"], q["shape"]) == ("attn_q", 0, "BF16", [256, 256])
    assert q["bytes"] == 256 * 256 * 2 and q["stats"]["nan"] == 0 and q["stats"]["absmax"] > 0


def test_inspect_minilm_json_matches_library(capsys, minilm_path, minilm):
    rc, out, _ = cli(capsys, "inspect", str(minilm_path), "--json")
    assert rc == 0
    doc = json.loads(out)
    _check_inspect(doc, 104)
    by = {t["name"]: t for t in doc["tensors"]}
    t = by["encoder.layer.0.attention.self.query.weight"]
    w = minilm.read("encoder.layer.0.attention.self.query.weight")
    assert t["stats"]["max"] == float(w.max()) and t["stats"]["min"] == float(w.min())
    assert t["role"] == "attn_q" and t["block"] == 0
    pid = by["embeddings.position_ids"]
    assert pid["dtype"] == "I64" and pid["stats"]["max"] == 511.0


def test_inspect_arrays_and_no_stats(capsys, tiny_llama):
    path, _ = tiny_llama
    rc, out, _ = cli(capsys, "inspect", str(path), "--json", "--arrays")
    t = json.loads(out)["tensors"][0]
    assert len(t["stats"]["histogram"]["counts"]) == 256 and len(t["stats"]["channels"]["min"]) == 64
    rc, out, _ = cli(capsys, "inspect", str(path), "--json", "--no-stats")
    assert all("stats" not in t for t in json.loads(out)["tensors"])
    # the text table: no statistics columns, not empty ones (headers nor trailing blanks)
    rc, out, _ = cli(capsys, "inspect", str(path), "--no-stats")
    lines = out.splitlines()
    assert rc == 0 and lines[1].split() == ["name", "shape", "dtype", "role"]
    rows = lines[2:]
    assert rows and all(line == line.rstrip() and len(line.split()) == 4 for line in rows)
    rc, out, _ = cli(capsys, "inspect", str(path))
    assert out.splitlines()[1].split()[4:] == ["absmax", "std", "kurt", "outl%", "nan/inf"]


def test_evaluate_json_subprocess_stdout_is_pure_json(tiny_llama):
    path, tensors = tiny_llama
    r = sh("evaluate", str(path), "--scheme", "int8-channel", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)  # nothing else on stdout
    assert len(doc["tensors"]) == len(tensors)
    for t in doc["tensors"]:
        assert EVAL_KEYS <= set(t)
        if t["scheme"] == "int8-channel":
            assert t["rel_rmse"] < 0.01 and t["cosine"] > 0.9999 and t["sqnr_db"] > 40
        else:
            assert t["scheme"] == "keep" and t["sqnr_db"] is None  # exact: inf -> null
    assert {"bytes", "bits_per_weight", "sqnr_db"} <= set(doc["totals"])
    assert 8.0 < doc["totals"]["bits_per_weight"] < 8.2
    assert doc["totals"]["bytes"] == sum(t["bytes"] for t in doc["tensors"])


def test_evaluate_json_with_progress_forced(capsys, tiny_llama, monkeypatch):
    """Even with the progress bar drawing, stdout stays pure JSON (the bar goes to stderr)."""
    import workbench.core.progress as progress
    path, _ = tiny_llama
    real_init = progress.TextProgress.__init__

    def forced(self, stream=None, enabled=None, width=30):
        real_init(self, stream, True, width)

    monkeypatch.setattr(progress.TextProgress, "__init__", forced)
    monkeypatch.setattr(progress.time, "monotonic", lambda c=[0.0]: c.__setitem__(0, c[0] + 1) or c[0])
    rc, out, err = cli(capsys, "evaluate", str(path), "--scheme", "int4-g64", "--json")
    assert rc == 0
    json.loads(out)
    assert "%" in err  # the bar was drawn, on stderr


def test_evaluate_text_and_plan(capsys, tiny_llama, tmp_path):
    path, _ = tiny_llama
    rc, out, _ = cli(capsys, "evaluate", str(path), "--scheme", "nf4-g64")
    assert rc == 0 and "model SQNR" in out and "nf4-g64" in out
    plan = tmp_path / "plan.json"
    rc, out, _ = cli(capsys, "export", str(path), "--scheme", "int4-g128", "--format", "plan",
                     "-o", str(plan))
    assert rc == 0 and plan.exists()
    doc = json.loads(plan.read_text())
    doc["rules"] = [{"match": "re:mlp", "scheme": "int8-channel"},
                    {"match": "lm_head.weight", "scheme": "fp16"}]
    plan.write_text(json.dumps(doc))
    rc, out, _ = cli(capsys, "evaluate", str(path), "--plan", str(plan), "--json")
    by = {t["name"]: t for t in json.loads(out)["tensors"]}
    assert by["model.layers.0.mlp.up_proj.weight"]["scheme"] == "int8-channel"
    assert by["model.layers.0.self_attn.q_proj.weight"]["scheme"] == "int4-g128"
    assert by["lm_head.weight"]["scheme"] == "fp16" and by["lm_head.weight"]["bits_per_weight"] == 16
    assert by["model.norm.weight"]["scheme"] == "keep"


def test_export_safetensors_cli(capsys, tiny_llama, tmp_path):
    from workbench.formats.loaders import open_model
    from workbench.schemes import get_scheme
    path, tensors = tiny_llama
    out = tmp_path / "q.safetensors"
    rc, stdout, _ = cli(capsys, "export", str(path), "--scheme", "int4-g64", "--format",
                        "safetensors", "-o", str(out), "--json")
    assert rc == 0 and json.loads(stdout)["quantized"] == 16
    q = open_model(out)
    s = get_scheme("int4-g64")
    w = tensors["model.layers.1.mlp.down_proj.weight"]
    np.testing.assert_array_equal(q.read("model.layers.1.mlp.down_proj.weight"),
                                  s.dequantize(s.quantize(w)))
    # the exported file can be inspected / evaluated by the CLI again
    rc, stdout, _ = cli(capsys, "inspect", str(out), "--json")
    doc = json.loads(stdout)
    by = {t["name"]: t for t in doc["tensors"]}
    assert by["model.layers.1.mlp.down_proj.weight"]["dtype"] == "int4-g64"


@pytest.mark.parametrize("args, needle", [
    (["inspect", "/nonexistent/model.safetensors"], "file not found"),
    (["evaluate", "--scheme", "int11-channel"], "unknown scheme 'int11-channel'"),
    (["evaluate", "--plan", "/nonexistent/plan.json"], "plan file not found"),
    (["export", "--scheme", "int8-channel", "--format", "plan", "-o", "/nonexistent/dir/p.json"],
     "output folder does not exist"),
])
def test_errors_one_line_exit_2(capsys, args, needle):
    rc, out, err = cli(capsys, *args)
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("quant-workbench: error:"), err
    assert needle in lines[0]
    assert out == ""


def test_errors_subprocess_no_traceback(tmp_path):
    png = tmp_path / "x.safetensors"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)
    bad_plan = tmp_path / "p.json"
    bad_plan.write_text('{"version": 1, "rules": [{"match": "re:(", "scheme": "fp16"}]}')
    nan = tmp_path / "nan.safetensors"
    from safetensors.numpy import save_file
    save_file({"w": np.array([[np.nan] * 64], np.float32)}, str(nan))
    for args, needle in [(["inspect", str(png), "--json"], "not a safetensors file"),
                         (["evaluate", "--plan", str(bad_plan)], "bad regular expression"),
                         (["evaluate", str(nan), "--scheme", "int8-g64"], "NaN/Inf"),
                         (["export", str(nan), "--scheme", "int4-g32", "--format", "safetensors",
                           "-o", str(tmp_path / "o.safetensors")], "NaN/Inf")]:
        r = sh(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert "Traceback" not in r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("quant-workbench: error:") and needle in lines[0]
        assert r.stdout == ""
    assert not (tmp_path / "o.safetensors").exists()
    assert sorted(os.listdir(tmp_path)) == ["nan.safetensors", "p.json", "x.safetensors"]


def test_usage_errors_exit_2():
    r = sh("evaluate", "--scheme", "int8-channel", "--plan", "x.json")
    assert r.returncode == 2 and "not allowed with" in r.stderr
    r = sh("export", "--scheme", "int8-channel", "--format", "tflite", "-o", "x")
    assert r.returncode == 2 and "invalid choice" in r.stderr


NO_QT = r"""
import importlib, pkgutil, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("PySide6", "PyQt5", "PyQt6", "PySide2", "pyqtgraph", "shiboken6"):
            raise ImportError("Qt is blocked in this test: " + name)
        return None
sys.meta_path.insert(0, Block())
import workbench, kernels
for pkg in (workbench, kernels):
    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        importlib.import_module(m.name)
from workbench.cli import main
rc = main(["evaluate", "--scheme", "int4-g64", "--json"])
assert rc == 0, rc
rc = main(["inspect", "--no-stats"])
assert rc == 0, rc
bad = [m for m in sys.modules if m.split(".")[0] in ("PySide6", "pyqtgraph", "app")]
assert not bad, bad
print("NO-QT-OK", file=sys.stderr)
"""


def test_domain_never_imports_qt():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    r = subprocess.run([sys.executable, "-c", NO_QT], capture_output=True, text=True, env=env,
                       cwd=str(ROOT), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "NO-QT-OK" in r.stderr
    assert '"totals"' in r.stdout  # the evaluate ran and printed its JSON


def test_lone_surrogate_names_print_and_internal_errors_are_one_line(tmp_path, monkeypatch,
                                                                     capsys):
    import json as _json
    blob = _json.dumps({"a\udc80b": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}},
                       ensure_ascii=True).encode()
    blob += b" " * ((-len(blob)) % 8)
    p = tmp_path / "sur.safetensors"
    p.write_bytes(len(blob).to_bytes(8, "little") + blob + np.ones(4, np.float32).tobytes())
    r = subprocess.run([sys.executable, str(ROOT / "main.py"), "inspect", str(p)],
                       capture_output=True, text=True, errors="replace")
    assert r.returncode == 0 and "a\\udc80b" in r.stdout, r.stderr
    # an unexpected exception inside a command: one line naming the log, traceback in the log
    import workbench.cli.commands.schemes as schemes_cmd
    from workbench import cli as wcli
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(schemes_cmd, "run", lambda args: 1 / 0)
    assert wcli.main(["schemes"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "internal error: ZeroDivisionError" in err[0]
    log = err[0].split("details in ")[1].rstrip(")")
    assert "Traceback" in open(log).read()


def test_a_named_command_builds_only_its_own_parser():
    """`export ...` imports the export command's module only (not gui, bench, sensitivity);
    help, an unknown word and a model path still get the whole command line."""
    from app.entry import COMMAND_PACKAGES
    from workbench.cli import _command_names, build_parser
    full = _command_names(build_parser(packages=COMMAND_PACKAGES))
    assert {"export", "bench-load", "gui", "evaluate", "screenshot", "report", "bench-gui"} <= full
    for name in ("export", "bench-load", "gui", "screenshot"):
        assert _command_names(build_parser(only=name, packages=COMMAND_PACKAGES)) == {name}
    for word in ("exprt", "bench_load", "-h", "_x", "resources/demo_model", "commands"):
        assert build_parser(only=word, packages=COMMAND_PACKAGES) is None
    # the domain alone knows no window-opening command (workbench/ never imports app/)
    domain = _command_names(build_parser())
    assert "export" in domain and not {"gui", "screenshot", "report", "bench-gui"} & domain
    code = ("import sys\nfrom workbench.cli import main\n"
            "rc = main(['export', '--scheme', 'q8_0', '--format', 'plan', '--check'])\n"
            "mods = sorted(m for m in sys.modules if m.startswith('workbench.cli.commands.'))\n"
            "print(rc, mods)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "0 ['workbench.cli.commands.export']"

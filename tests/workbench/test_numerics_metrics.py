"""Issue 9, metrics: defined values at the edges (exact, all-zero, empty, near float limits),
strict JSON, and empty tensors through evaluate and every exporter."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from workbench.quant.metrics import ErrorSums, ModelTotals, from_sums, sqnr_db, tensor_error

ROOT = Path(__file__).resolve().parents[2]


def test_sqnr_edges_are_defined():
    assert sqnr_db(1.0, 0.0) == math.inf            # exact
    assert sqnr_db(0.0, 0.0) == math.inf            # all-zero tensor, reconstructed exactly
    assert sqnr_db(0.0, 1.0) == -math.inf           # zero signal, non-zero error
    assert sqnr_db(1e300, 1e-300) == pytest.approx(6000.0)   # the ratio overflows a float
    assert sqnr_db(1e-300, 1e300) == pytest.approx(-6000.0)  # ... or underflows: no domain error
    assert sqnr_db(math.inf, 1.0) == math.inf and sqnr_db(1.0, math.inf) == -math.inf


@pytest.mark.parametrize("shape", [(3, 0), (0, 4), (0,), (4, 64)])
def test_exact_and_empty_tensors(shape):
    from workbench.schemes import matrix_shape
    w = np.zeros(shape, np.float32)
    m = w.reshape(matrix_shape(shape))
    for sums in (ErrorSums.zero(w), ErrorSums.from_arrays(m, m)):
        e = from_sums(sums)
        assert (e.sqnr_db, e.rel_rmse, e.cosine, e.mse, e.max_abs_err) == (math.inf, 0.0, 1.0,
                                                                           0.0, 0.0)
        assert e.to_dict()["exact"] is True


def test_huge_finite_sums_give_finite_metrics():
    w = np.full((2, 64), 3e38, np.float32)
    wq = w.copy()
    wq[0, 0] = -3e38
    e = tensor_error(w, wq)
    assert all(math.isfinite(v) for v in (e.mse, e.rel_rmse, e.sqnr_db, e.cosine))
    assert -1.0 <= e.cosine <= 1.0


def test_model_totals_json_strict():
    t = ModelTotals()
    t.add(10, 40, 10, 0.0, 0.0)
    d = t.to_dict()
    assert d["exact"] is True and d["sqnr_db"] == math.inf
    from workbench.cli.common import json_safe
    assert json.loads(json.dumps(json_safe(d), allow_nan=False))["sqnr_db"] is None


def _empty_model(make_safetensors):
    return make_safetensors({
        "a.weight": np.zeros((3, 0), np.float64), "b.weight": np.zeros((3, 0), np.int64),
        "c.weight": np.zeros((0, 4), np.float32), "z.weight": np.zeros((4, 64), np.float32),
        "d.weight": np.ones((4, 64), np.float32)}, name="empty.safetensors")


def _cli(*args):
    return subprocess.run([sys.executable, str(ROOT / "main.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_empty_tensors_evaluate_json(make_safetensors):
    path = _empty_model(make_safetensors)
    for scheme in ("q8_0", "fp16"):
        r = _cli("evaluate", path, "--scheme", scheme, "--json")
        assert r.returncode == 0, r.stderr
        d = json.loads(r.stdout)                   # strict JSON (no NaN / Infinity)
        by = {t["name"]: t for t in d["tensors"]}
        assert by["z.weight"]["exact"] is True and by["z.weight"]["sqnr_db"] is None
        assert by["a.weight"]["params"] == 0 and by["a.weight"]["exact"] is True
        assert by["d.weight"]["exact"] is (scheme in ("fp16", "int8-channel"))


@pytest.mark.parametrize("fmt", ["safetensors", "gguf", "plan", "compressed-tensors"])
def test_empty_tensors_export_and_read_back(make_safetensors, tmp_path, fmt):
    path = _empty_model(make_safetensors)
    out = tmp_path / f"out.{fmt}"
    scheme = "q8_0" if fmt == "gguf" else "int8-channel"
    r = _cli("export", path, "--scheme", scheme, "--format", fmt, "-o", out)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    if fmt in ("safetensors", "gguf"):
        r = _cli("evaluate", out, "--scheme", "fp32", "--json")
        assert r.returncode == 0, r.stderr
        names = {t["name"]: t["shape"] for t in json.loads(r.stdout)["tensors"]}
        assert names["a.weight"] == [3, 0] and names["c.weight"] == [0, 4]
        r = _cli("inspect", out)
        assert r.returncode == 0, r.stderr

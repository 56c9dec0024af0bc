"""`quant-workbench bench-mlx` (workbench.bench.mlx) on a tiny generated llama: mlx-lm's own
uniform 4-bit folder made and timed by mlx_lm convert, the default allocate --target mlx +
export --format mlx at its bytes, both judged by check --runtime mlx on held-out text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("mlx_lm", reason="mlx-lm is not installed (pip install -e .[mlx])")

from tests.mlx_folders import run_cli as _cli, tiny_hf  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
HELD_OUT = ROOT / "workbench" / "bench" / "minilm_heldout.txt"



def test_bench_mlx_on_a_tiny_llama(tmp_path):
    import workbench as qw
    hf = tiny_hf("llama", tmp_path / "hf", tie_word_embeddings=True)
    out = tmp_path / "bench"
    rc, text, err = _cli("bench-mlx", hf, "--held-out", HELD_OUT, "--recipes", "q4-g64",
                         "--ctx", "64", "--chunks", "3", "-o", out, "--json")
    assert rc == 0, err
    res = json.loads(text)
    assert json.loads((out / "results.json").read_text())["rows"] == res["rows"]
    mlx_row, wb = res["rows"]
    assert mlx_row["kind"] == "mlx-lm" and mlx_row["wall_s"] > 0
    assert mlx_row["bytes"] == sum(f.stat().st_size
                                   for f in (out / "mlx-lm-q4-g64").glob("*.safetensors"))
    assert mlx_row["kld"]["chunks"] == 3 and mlx_row["kld"]["mean"] > 0
    assert mlx_row["mlx"]["tokens"] == 31 and mlx_row["mlx"]["agreement"]["float"]["mean"] < 1e-9
    if "mlx" not in qw.export_formats():
        assert "error" in wb                      # no mlx target or export in this build
        pytest.skip("needs allocate --target mlx and export --format mlx")
    assert "error" not in wb, wb
    assert wb["bytes"] <= mlx_row["bytes"]
    assert wb["kld"]["chunks"] == 3 and wb["allocate_s"] > 0 and wb["export_s"] > 0


def test_refusals_before_any_work(tmp_path):
    hf = tmp_path / "none"
    calib = ROOT / "resources" / "calibration.txt"
    for argv, says in (((hf, "--held-out", HELD_OUT), "no such model folder"),
                       ((tmp_path, "--held-out", calib, "--calib", calib), "calibration text"),
                       ((tmp_path, "--held-out", HELD_OUT, "--recipes", "q9"), "--recipes")):
        rc, _, err = _cli("bench-mlx", *argv, "-o", tmp_path / "o")
        assert rc == 2 and says in err, err
    assert not (tmp_path / "o").exists()

"""`bench-model`: the Llama-3-shaped generator and every step on a small generated model.
Memory targets are the benchmark's business (docs/big-models.md), not these tests'."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from workbench.bench import model as bench_model
from workbench.bench.model import STEPS, generate, llama_shape
from workbench.formats.loaders import open_model

ROOT = Path(__file__).resolve().parents[2]


def test_shape_from_params_is_llama3():
    s = llama_shape(8e9)
    assert (s.hidden, s.layers, s.intermediate, s.heads, s.kv_heads, s.vocab) == \
        (4096, 32, 14336, 32, 8, 128256)
    assert s.params == 8_030_261_248                        # Llama-3-8B's count
    big = llama_shape(3e10)
    assert abs(big.params - 3e10) / 3e10 < 0.02 and big.hidden % 512 == 0
    assert big.heads * big.head_dim == big.hidden and big.heads % big.kv_heads == 0
    small = llama_shape(5e6)
    assert small.vocab == 512 and small.layers >= 1


def test_generated_weights_look_like_an_llm(tmp_path):
    info = generate(tmp_path / "m", 1.2e7, seed=3)
    m = open_model(tmp_path / "m")
    shape = llama_shape(1.2e7)
    assert m.total_params == info["params"] == shape.params
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["num_hidden_layers"] == shape.layers
    assert (tmp_path / "m" / "tokenizer.json").is_file()
    assert all(m.info(n).dtype == "BF16" for n in m.tensors)
    w = m.read_matrix("model.layers.0.mlp.down_proj.weight").astype(np.float64)
    z = w / w.std()
    assert ((z - z.mean()) ** 4).mean() > 6.0                 # heavy tails (normal: 3)
    col = np.abs(w).max(axis=0)
    assert col.max() / np.median(col) > 4.0                   # outlier input channels
    row = np.sqrt((w ** 2).mean(axis=1))
    assert np.percentile(row, 90) / np.percentile(row, 10) > 1.5   # per-channel scale spread
    assert abs(w.std() * math.sqrt(w.shape[1]) - 1.0) < 0.3   # std ~ 1/sqrt(fan-in)
    norm = m.read_matrix("model.layers.0.input_layernorm.weight")
    assert abs(float(norm.mean()) - 1.0) < 0.02 and float(norm.std()) < 0.1


def test_generation_is_the_same_in_parallel_and_in_one_process(tmp_path, monkeypatch):
    """Shards are written side by side, each from its own seed: the same bytes whatever the
    number of processes."""
    import hashlib

    from workbench.bench import model as bm
    monkeypatch.setattr(bm, "SHARD_BYTES", 8 << 20)
    par = bm.generate(tmp_path / "par", 1.2e7, seed=5)
    monkeypatch.setattr(bm.os, "cpu_count", lambda: 1)
    one = bm.generate(tmp_path / "one", 1.2e7, seed=5)
    assert par == one and par["shards"] >= 3

    def digest(folder):
        return {f.name: hashlib.sha256(f.read_bytes()).hexdigest()
                for f in sorted(folder.glob("*.safetensors"))}
    assert digest(tmp_path / "par") == digest(tmp_path / "one")
    assert len(set(digest(tmp_path / "par").values())) == par["shards"]   # not one shard again


def _cli(*args, timeout=1800):
    return subprocess.run([sys.executable, str(ROOT / "main.py"), *args], capture_output=True,
                          text=True, cwd=str(ROOT), timeout=timeout)


@pytest.mark.slow
def test_bench_model_runs_every_step(tmp_path):
    folder = tmp_path / "bm"
    out = _cli("bench-model", "--params", "5e6", "--dir", str(folder), "--samples", "2",
               "--steps", "all", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout)
    assert [s["step"] for s in res["steps"]] == list(STEPS)
    for s in res["steps"]:
        assert s["ok"], s
        assert s["wall_s"] > 0 and 10 < s["peak_rss_mb"] < 6000, s
    fwd = res["steps"][-1]
    assert fwd["tokens"] > 0 and fwd["layerwise_tokens_per_s"] > 0
    assert fwd["baseline_tokens_per_s"] > 0
    export = next(s for s in res["steps"] if s["step"] == "export-gguf")
    assert export["output_bytes"] > 0
    alloc = next(s for s in res["steps"] if s["step"] == "allocate")
    assert alloc["command"].startswith("quant-workbench allocate ") and "--budget-bpw 4.5" in \
        alloc["command"]
    assert not folder.exists()                                # removed after (no --keep)


def test_bench_model_refuses_without_disk(tmp_path, monkeypatch, capsys):
    from workbench.cli import main
    monkeypatch.setattr(bench_model, "free_bytes", lambda folder: 10 << 20)
    rc = main(["bench-model", "--params", "3e10", "--dir", str(tmp_path / "x"), "--steps",
               "weight"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "not enough free disk" in err[0], err
    assert str(tmp_path / "x") in err[0] and not (tmp_path / "x").exists()


def test_bench_model_bad_steps(capsys):
    from workbench.cli import main
    assert main(["bench-model", "--params", "5e6", "--steps", "open,nope"]) == 2
    assert "unknown step 'nope'" in capsys.readouterr().err


def test_step_peak_is_the_childs_own(tmp_path):
    """The step's peak is its own address space's (VmHWM), not the parent's size that
    ru_maxrss carries over a fork: a child allocating 300 MB reports about that."""
    code = ("import numpy as np; a = np.ones(300 * 2**20 // 8); print(a.sum())")
    res = bench_model.run_measured([sys.executable, "-c", code], tmp_path / "x.log")
    # plain python -c does not write the peak file: the kernel's ru_maxrss is the fallback
    assert res["ok"] and res["peak_rss_mb"] >= 300
    argv = [sys.executable, "-m", "workbench.bench.model", "--version-never-a-command"]
    res = bench_model.run_measured(argv, tmp_path / "y.log")
    assert not res["ok"] and res["peak_rss_mb"] < 300 and res["error"]


def test_a_running_step_reports_its_childs_latest_line(tmp_path):
    """While a step runs, bench-model's progress carries the child's own latest line (its
    stage, i/N and ETA), read from the step's log about once a second."""
    log = tmp_path / "bench-x.log"
    code = ("import sys, time\n"
            "print('first line', flush=True)\n"
            "sys.stderr.write('allocate:  40.0% block 3/7\\rallocate:  55.0% block 4/7\\n')\n"
            "sys.stderr.flush(); time.sleep(2.5)\n")
    seen = []
    res = bench_model.run_measured([sys.executable, "-c", code], log, timeout=60,
                                   watch=seen.append)
    assert res["ok"] and res["wall_s"] >= 2.5
    assert "allocate:  55.0% block 4/7" in seen and len(seen) >= 2
    assert bench_model.last_line(log) == "allocate:  55.0% block 4/7"
    assert bench_model.last_line(tmp_path / "missing.log") == ""

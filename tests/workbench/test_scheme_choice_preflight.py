"""workbench.planning.scheme_choice (families, per-tensor points, Pareto) and workbench.export.preflight
(can a format write the plan, and why not) — the numbers the GUI's picker, comparison tab and
Export dialog show."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.quant.evaluate import evaluate_tensor
from workbench.export.preflight import best_format, check, check_all
from workbench.formats.loaders import open_model
from workbench.quant.plan import Plan
from workbench.planning.scheme_choice import (FAMILIES, eligible_schemes, family_of, grouped,
                                     pareto_front, tensor_points)

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "resources" / "demo_model" / "model.safetensors"
Q = "model.layers.0.self_attn.q_proj.weight"


def test_families_and_grouping_order():
    assert [family_of(s) for s in ("keep", "fp16", "fp8-e4m3", "int4-g128", "int8-channel-asym",
                                   "q4_0", "q8_0", "q4_k", "q6_k", "nf4-g64", "iq4_nl",
                                   "ternary-g64", "int4-g128@mse", "mlx-q4-g64",
                                   "mlx-nvfp4@bf16")] == [
        "Float", "Float", "Float", "Integer", "Integer", "GGML legacy", "GGML legacy",
        "K-quants", "K-quants", "Codebooks", "Codebooks", "Codebooks", "Integer", "MLX", "MLX"]
    g = grouped(["q4_k", "int4-g128", "fp16", "mlx-q4-g64", "nf4-g64", "q8_0", "int8-channel"])
    assert [f for f, _ in g] == ["Float", "Integer", "GGML legacy", "K-quants", "Codebooks",
                                 "MLX"]
    assert dict(g)["Integer"] == ["int4-g128", "int8-channel"]   # given order kept
    assert list(FAMILIES) == [f for f, _ in g]


def test_pareto_front_known_answer():
    pts = [("a", 2.0, 5.0), ("b", 3.0, 4.0), ("c", 3.0, 9.0), ("d", 4.0, 9.0),
           ("e", 5.0, 12.0), ("f", 4.5, 11.0), ("g", 8.0, float("inf")),
           ("h", 9.0, float("inf")), ("n", 1.0, float("nan"))]
    # b is dominated by c (same bits, better), d by c (more bits, same SQNR), h by g
    assert pareto_front(pts) == {"a", "c", "f", "e", "g"}


def test_tensor_points_are_the_evaluations():
    m = open_model(DEMO)
    info = m.info(Q)
    schemes = ["int4-g128", "int4-g32", "q4_k", "int8-channel", "fp16"]
    pts = {p.scheme: p for p in tensor_points(m, Q, schemes)}
    for s in schemes:
        r = evaluate_tensor(m, Q, s)
        assert pts[s].sqnr_db == pytest.approx(r.error.sqnr_db)
        assert pts[s].bits_per_weight == pytest.approx(8.0 * r.bytes / info.numel)
    assert pts["int4-g128"].bits_per_weight == pytest.approx(4.125)
    front = pareto_front((p.scheme, p.bits_per_weight, p.sqnr_db) for p in pts.values())
    assert {s for s, p in pts.items() if p.pareto} == front
    # q4_k stores 4.5 bits/weight like int4-g32 with a better SQNR: it dominates int4-g32
    assert pts["q4_k"].bits_per_weight == pytest.approx(pts["int4-g32"].bits_per_weight)
    assert pts["q4_k"].sqnr_db > pts["int4-g32"].sqnr_db
    assert pts["q4_k"].pareto and not pts["int4-g32"].pareto
    assert pts["int4-g128"].pareto          # the fewest bits here
    assert "keep" in eligible_schemes(info) and len(eligible_schemes(info)) > 90


def test_schemes_tensor_cli_json():
    res = subprocess.run([sys.executable, str(ROOT / "main.py"), "schemes", "--tensor", Q,
                          "--json"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    rows = {r["scheme"]: r for r in data["schemes"]}
    assert data["tensor"] == Q and len(rows) == len(eligible_schemes(open_model(DEMO).info(Q)))
    r = evaluate_tensor(open_model(DEMO), Q, "q4_k")
    assert rows["q4_k"]["sqnr_db"] == pytest.approx(r.error.sqnr_db)
    assert rows["q4_k"]["family"] == "K-quants"
    assert any(r["pareto"] for r in rows.values()) and not all(r["pareto"] for r in rows.values())


def test_preflight_per_format_and_default():
    m = open_model(DEMO)
    ints = check_all(m, Plan(default="int8-channel"))
    assert not ints["gguf"].ok and "llama.cpp has no tensor type for int8-channel" in \
        ints["gguf"].reason
    assert str(DEMO) not in ints["gguf"].reason          # one line, without the model path
    assert not ints["llama-tensor-types"].ok
    assert ints["safetensors"].ok and ints["plan"].ok and ints["compressed-tensors"].ok
    assert ints["safetensors"].quantized == 23
    assert best_format(ints) == "compressed-tensors"     # runnable by vLLM, nothing unmet
    ggml = check_all(m, Plan(default="q4_k"))
    assert ggml["gguf"].ok and ggml["gguf"].changed == 0
    # vLLM cannot express q4_k: writable, but nothing quantized
    assert ggml["compressed-tensors"].ok and ggml["compressed-tensors"].quantized == 0
    assert best_format(ggml) == "gguf"
    assert best_format(ggml, preferred="safetensors") == "safetensors"   # the user's last
    assert best_format(ints, preferred="gguf") == "compressed-tensors"   # last cannot write
    # a fused q/k/v group with two schemes: vLLM cannot load it, said before writing
    mixed = Plan(default="int8-channel").with_assignments({Q: "int4-g128"})
    c = check(m, mixed, "compressed-tensors")
    assert not c.ok and "fused" in c.reason and Q in c.reason


def test_export_check_cli():
    def run(*a):
        return subprocess.run([sys.executable, str(ROOT / "main.py"), "export", *a],
                              capture_output=True, text=True, timeout=300, cwd=ROOT)
    bad = run("--scheme", "int4-g128", "--format", "gguf", "--check")
    assert bad.returncode == 1 and "cannot write" in bad.stdout and "int4-g128" in bad.stdout
    good = run("--scheme", "q8_0", "--format", "gguf", "--check", "--json")
    assert good.returncode == 0 and json.loads(good.stdout)["ok"] is True
    missing = run("--scheme", "q8_0", "--format", "gguf")
    assert missing.returncode == 2 and "-o/--output" in missing.stderr

"""Sensitivity table (four measures), allocation on it, the frontier, llama.cpp recipes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from workbench.cli import main
from workbench.core.errors import WorkbenchError
from workbench.quant.evaluate import evaluate
from workbench.planning.frontier import (frontier, recipe_assignment, recipe_points, uniform_points,
                                _use_more_bits)
from workbench.formats.loaders import open_model
from workbench.core.progress import run
from workbench.planning.sensitivity import embedding_usage, sensitivity_table
from workbench.planning.output_measure import output_errors, output_measure

SCHEMES = ["q3_k", "q4_0", "q4_k", "q5_k", "q6_k", "q8_0"]


@pytest.fixture(scope="module")
def demo(demo_model_path):
    return open_model(demo_model_path.parent)


@pytest.fixture(scope="module")
def demo_table(demo):
    return sensitivity_table(demo, SCHEMES, "weight")


@pytest.mark.parametrize("target", ["any", "llama.cpp"])
def test_frontier_points_are_counted_as_evaluate_counts_them(demo, target):
    table = sensitivity_table(demo, SCHEMES, "weight", runtime=target)
    budgets = [3.6, 4.5, 5.5, 7.0]
    pts = frontier(demo, None, table, budgets, target=target)
    assert [p.budget_bpw for p in pts] == budgets
    pts += uniform_points(demo, table) + recipe_points(demo, ["Q4_K_M", "Q5_K_M"], table)
    assert {p.label for p in pts} >= {"q4_0", "q8_0", "Q4_K_M", "Q5_K_M"}
    for p in pts:
        ev = run(evaluate(demo, p.plan, runtime=target))
        assert p.bytes == ev.totals.bytes_after, p.label
        assert p.bits_per_weight == pytest.approx(ev.totals.bits_per_weight, rel=1e-12)
        if p.kind == "allocated":
            assert p.bits_per_weight <= p.budget_bpw
            assert p.exact
    # the allocated plan is no worse than any uniform plan that fits its budget
    for a in (p for p in pts if p.kind == "allocated"):
        for u in (p for p in pts if p.kind in ("uniform", "recipe")):
            if u.bits_per_weight <= a.budget_bpw:
                assert a.predicted <= u.predicted + 1e-9


def test_allocation_keeps_pins_and_never_exceeds_budget(demo, demo_table):
    pins = {"model.layers.0.self_attn.q_proj.weight": "q3_k", "lm_head.weight": "q8_0"}
    table = sensitivity_table(demo, SCHEMES, "weight", pins=pins)
    for bpw in (4.0, 5.0, 6.0):
        budget = table.budget_bytes(None, bpw)
        plan, sol = table.solve(budget, pins)
        a = table.assignment_of(plan, demo)
        for n, s in pins.items():
            assert a[n] == s
        ev = run(evaluate(demo, plan))
        assert ev.totals.bytes_after <= budget
        assert sol.cost + table.fixed_bytes == ev.totals.bytes_after
    with pytest.raises(WorkbenchError, match="below the smallest plan the candidates allow"):
        table.solve(table.budget_bytes(None, 1.0), pins)


def test_table_uses_the_fallback_the_runtime_applies(make_safetensors):
    rng = np.random.default_rng(3)
    path = make_safetensors({"a.weight": rng.standard_normal((64, 384)).astype(np.float32),
                             "b.weight": rng.standard_normal((64, 512)).astype(np.float32),
                             "b.bias": np.zeros(64, np.float32)})
    m = open_model(path)
    t = sensitivity_table(m, ["q4_k", "q5_0"], "weight")
    assert t.names == ["a.weight", "b.weight"] and t.fixed_names == ["b.bias"]
    # 384 columns: q4_k falls back to q5_0 (llama.cpp's rule), same bytes and error
    assert t.applied[("a.weight", "q4_k")] == "q5_0"
    assert t.bytes[("a.weight", "q4_k")] == t.bytes[("a.weight", "q5_0")]
    assert t.values[("a.weight", "q4_k")] == t.values[("a.weight", "q5_0")]
    assert t.applied[("b.weight", "q4_k")] == "q4_k"
    assert t.bytes[("b.weight", "q4_k")] == 64 * 2 * 144
    d = t.to_dict()
    assert set(d["tensors"]["a.weight"]) == {"q4_k", "q5_0"}


def test_recipe_rules_on_the_demo_model(demo):
    assert [i for i in range(8) if _use_more_bits(i, 8)] == [0, 3, 6, 7]
    assert [i for i in range(3) if _use_more_bits(i, 3)] == [2]
    a = recipe_assignment(demo, "Q4_K_M")
    assert a["lm_head.weight"] == "q6_k"                    # output.weight
    assert a["model.embed_tokens.weight"] == "q4_k"         # untied token_embd: the default
    assert a["model.layers.2.self_attn.v_proj.weight"] == "q6_k"
    assert a["model.layers.2.mlp.down_proj.weight"] == "q6_k"
    assert a["model.layers.1.self_attn.v_proj.weight"] == "q4_k"
    assert a["model.layers.0.mlp.down_proj.weight"] == "q4_k"
    assert "model.norm.weight" not in a
    b = recipe_assignment(demo, "Q5_K_M")
    assert b["model.layers.0.self_attn.q_proj.weight"] == "q5_k"
    assert b["model.layers.2.mlp.down_proj.weight"] == "q6_k"
    with pytest.raises(WorkbenchError, match="unknown recipe"):
        recipe_assignment(demo, "Q9_X")


def test_recipe_fallbacks_on_minilm(minilm):
    a = recipe_assignment(minilm, "Q4_K_M")
    # tied embeddings (no output.weight): token_embd gets the output rule; 384 % 256 -> q8_0
    assert a["embeddings.word_embeddings.weight"] == "q8_0"
    assert "embeddings.position_embeddings.weight" not in a
    assert "embeddings.token_type_embeddings.weight" not in a
    v = {i: a[f"encoder.layer.{i}.attention.self.value.weight"] for i in range(6)}
    assert v == {0: "q5_0", 1: "q5_0", 2: "q8_0", 3: "q5_0", 4: "q5_0", 5: "q8_0"}
    d = {i: a[f"encoder.layer.{i}.output.dense.weight"] for i in range(6)}   # 1536 columns
    assert d == {0: "q4_k", 1: "q4_k", 2: "q6_k", 3: "q4_k", 4: "q4_k", 5: "q6_k"}


def test_output_measure_formulas():
    b = np.array([[1.0, 0.0], [0.0, 2.0]])
    q = np.array([[1.0, 1.0], [0.0, 3.0]])
    assert output_measure("encoder", b, q) == pytest.approx((1 - 1 / np.sqrt(2)) / 2)
    lb = [np.log(np.array([[0.5, 0.5], [0.9, 0.1]]))]
    lq = [np.log(np.array([[0.5, 0.5], [0.5, 0.5]]))]
    kl = 0.9 * np.log(0.9 / 0.5) + 0.1 * np.log(0.1 / 0.5)
    assert output_measure("causal-lm", lb, lq) == pytest.approx(kl / 2)


def test_output_errors_measure_and_cache(demo, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    names = ["model.layers.0.self_attn.v_proj.weight", "model.layers.1.mlp.down_proj.weight"]
    got = output_errors(demo, ["q3_k", "q8_0"], samples=4, names=names)
    assert set(got) == {(n, s) for n in names for s in ("q3_k", "q8_0")}
    for n in names:
        assert got[(n, "q3_k")] > 10 * got[(n, "q8_0")] > 0
    assert list((tmp_path / "quant-workbench" / "output-sensitivity").glob("*.json"))
    from workbench.running.runner_passes import get_runner
    r = get_runner(demo)

    def boom(*a, **k):
        raise AssertionError("ran the model although every value is cached")
    monkeypatch.setattr(r, "forward", boom)
    again = output_errors(demo, ["q3_k", "q8_0"], samples=4, names=names)
    assert again == got


def test_activation_measure_and_embedding_usage(demo):
    use = run(embedding_usage(demo, samples=8))
    p = use["model.embed_tokens.weight"]
    assert p.shape == (512,) and p.sum() == pytest.approx(1.0)
    t = sensitivity_table(demo, ["q4_0", "q8_0"], "activation", samples=8)
    for n in t.names:
        assert t.values[(n, "q4_0")] > t.values[(n, "q8_0")] > 0


def test_sensitivity_cli_json(capsys):
    rc = main(["sensitivity", "--schemes", "q4_0,q8_0", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["measure"] == "weight" and out["schemes"] == ["q4_0", "q8_0"]
    t = out["tensors"]
    assert len(t) == 23
    first = next(iter(t.values()))
    assert set(first) == {"q4_0", "q8_0"} and set(first["q4_0"]) == {"value", "bytes", "applied"}
    vals = [np.mean([v["value"] for v in row.values()]) for row in t.values()]
    assert vals == sorted(vals, reverse=True)


def test_frontier_and_allocate_cli(capsys, tmp_path):
    rc = main(["frontier", "--points", "3", "--schemes", "q4_0,q4_k,q8_0",
                     "--measure", "weight", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    kinds = [p["kind"] for p in out["points"]]
    assert kinds.count("allocated") == 3 and kinds.count("uniform") == 3
    assert {p["label"] for p in out["points"] if p["kind"] == "recipe"} == {"Q4_K_M", "Q5_K_M"}
    bpw = [p["bits_per_weight"] for p in out["points"]]
    assert bpw == sorted(bpw)
    plan = tmp_path / "p.json"
    rc = main(["allocate", "--budget-bpw", "5", "--schemes", "q4_0,q8_0", "-o", str(plan),
               "--pin", "lm_head.weight=q8_0", "--measure", "weight", "--json"])
    res = json.loads(capsys.readouterr().out)
    assert rc == 0 and res["bits_per_weight"] <= 5 and res["exact"]
    assert json.loads(plan.read_text())["rules"]


def test_bench_allocate_cli(capsys):
    rc = main(["bench-allocate", "--tensors", "30", "--schemes", "5", "--repeat", "2", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and len(out["runs"]) == 2
    assert all(r["bytes"] <= r["budget"] for r in out["runs"])


def test_spearman_and_rank_agreement(demo_table):
    from workbench.planning.output_measure import rank_agreement, spearman
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486833)   # ties: mid-ranks
    assert rank_agreement(demo_table, demo_table, "q4_0") == pytest.approx(1.0)


def test_fisher_measure_estimates_the_measured_output_change(demo, tmp_path, monkeypatch):
    """Causal LM: 1/2 sum F dW^2 estimates the measured KL (nats/token) of quantizing one tensor,
    so it ranks the tensors as the measurement does (weight error does not). 16 samples: the
    trained demo model's next tokens are peaked, so the sampled-label Fisher needs more tokens
    than 8 samples give (measured: 8 samples rank agreement 0.88 and one tensor's estimate 0.05x
    the measured KL; 16 samples 0.95 and 0.38x-2.05x)."""
    from workbench.planning.output_measure import rank_agreement
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    fis = sensitivity_table(demo, ["q3_k"], "fisher", samples=16)
    out = sensitivity_table(demo, ["q3_k"], "output", samples=16)
    wt = sensitivity_table(demo, ["q3_k"], "weight")
    assert rank_agreement(fis, out, "q3_k") > 0.9
    assert rank_agreement(wt, out, "q3_k") < 0.6
    for n in out.names:
        o, f = out.values[(n, "q3_k")], fis.values[(n, "q3_k")]
        assert o > 0 and 0.33 < f / o < 3.0, n


def test_scheme_lists_are_parsed_by_the_api_for_the_target(capsys):
    """`sensitivity --schemes auto --target mlx` measures the MLX candidates (the CLI parsed
    'auto' for target any, without the target: 65 schemes, none of them MLX's), and the
    frontier's candidates are the API's parse (Frontier.schemes)."""
    import workbench as qw
    rc = main(["sensitivity", "--schemes", "auto", "--target", "mlx", "--measure", "weight",
               "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["schemes"] == qw.parse_schemes("auto", "mlx")
    assert all(s.startswith("mlx-") for s in out["schemes"])
    f = qw.compute_frontier(qw.open_model(), schemes="q4_0, q8_0,q4_0", recipes=[],
                            measure="weight", points=2)
    assert f.schemes == ["q4_0", "q8_0"] and f.table.schemes == ["q4_0", "q8_0"]

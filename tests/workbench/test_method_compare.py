"""workbench.running.methods_compare (the comparison view's methods): one tensor under (scheme, method)
pairs gives the figures `evaluate --method` reports for a plan assigning that pair, plus the
layer output error on the calibration inputs, from one calibration pass."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from workbench.cli import main
from workbench.core.errors import WorkbenchError
from workbench.formats.loaders import open_model
from workbench.running.methods_apply import prepare
from workbench.running.methods_compare import (applies, compare_methods, context_plan, evaluate_method,
                                       layer_output_error, peers_of, tensor_stats)
from workbench.quant.methods.stats import LayerStats
from workbench.quant.plan import KEEP
from workbench.core.progress import run

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "resources" / "demo_model" / "model.safetensors"
Q = "model.layers.0.self_attn.q_proj.weight"


@pytest.fixture(scope="module")
def calib_file(tmp_path_factory):
    lines = [ln for ln in (ROOT / "resources" / "calibration.txt").read_text().splitlines()
             if ln.strip()]
    p = tmp_path_factory.mktemp("calib") / "calib.txt"
    p.write_text("\n".join(lines[0:48:2]) + "\n")
    return p


def test_layer_output_error_and_applies():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((64, 8)).astype(np.float32)
    W = rng.standard_normal((4, 8)).astype(np.float32)
    E = np.zeros_like(W)
    E[1, 3] = 0.5
    want = np.sum((X @ E.T) ** 2) / np.sum((X @ W.T) ** 2)
    assert layer_output_error(X, W, W - E) == pytest.approx(want, rel=1e-6)
    assert layer_output_error(X, W, W) == 0.0
    assert applies("gptq", "int4-g128") is None and applies("awq", "q4_k") is None
    assert "not a quantizing scheme" in applies("gptq", "fp16")
    assert applies("gptq", KEEP)
    assert "gptq supports" in applies("gptq", "nf4-g64")


def test_peers_and_context_plan():
    m = open_model(DEMO)
    assert peers_of(m, Q) == ["model.layers.0.self_attn.k_proj.weight",
                              "model.layers.0.self_attn.v_proj.weight"]
    # v_proj reads the norm's output with q/k and produces o_proj's input
    assert "model.layers.0.self_attn.o_proj.weight" in peers_of(
        m, "model.layers.0.self_attn.v_proj.weight")
    plan = context_plan(Q, "q4_0", "gptq", {"model.layers.0.self_attn.k_proj.weight":
                                           ("int4-g64", "awq")})
    assert plan.scheme_for(Q) == "q4_0" and plan.method_for(Q) == "gptq"
    assert plan.method_for("model.layers.0.self_attn.k_proj.weight") == "awq"
    assert plan.scheme_for("model.layers.1.self_attn.q_proj.weight") == KEEP


def test_pairs_equal_evaluate_method_cli_and_gptq_beats_rtn(calib_file, tmp_path, capsys):
    m = open_model(DEMO)
    stats = run(tensor_stats(m, [Q], str(calib_file)))
    assert set(stats) == {Q} and stats[Q].X is not None and stats[Q].H is not None
    res = run(compare_methods(m, Q, ["int4-g128"], ["rtn", "gptq", "imatrix"], str(calib_file)))
    assert set(res) == {("int4-g128", "rtn"), ("int4-g128", "gptq"), ("int4-g128", "imatrix")}
    for (s, me), mr in res.items():
        assert (mr.scheme, mr.method) == (s, me)
        again = run(evaluate_method(m, Q, s, me, stats))
        assert again.result.error.sqnr_db == mr.result.error.sqnr_db
        assert again.out_rel == mr.out_rel
    # GPTQ: a worse weight SQNR, a better layer output (what it minimises)
    rtn, gptq = res[("int4-g128", "rtn")], res[("int4-g128", "gptq")]
    assert gptq.out_rel < 0.8 * rtn.out_rel
    assert gptq.out_sqnr_db > rtn.out_sqnr_db + 1.0
    # the same numbers as the CLI: `evaluate --plan` with that pair, calibrating itself
    plan = context_plan(Q, "int4-g128", "gptq")
    pf = tmp_path / "plan.json"
    pf.write_text(plan.to_json())
    assert main(["evaluate", str(DEMO), "--plan", str(pf), "--calib", str(calib_file),
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    row = next(t for t in out["tensors"] if t["name"] == Q)
    assert row["method"] == "gptq" and row["scheme"] == "int4-g128"
    assert row["sqnr_db"] == pytest.approx(gptq.result.error.sqnr_db, rel=1e-9)
    assert row["bytes"] == gptq.result.bytes
    # prepare() given the statistics builds the same MethodModel without a calibration pass
    mm = run(prepare(m, plan, stats=stats))
    assert mm.stats.keys() == {Q} and not mm.notes


def test_not_a_linear_input_and_refusals(calib_file):
    m = open_model(DEMO)
    emb = "model.embed_tokens.weight"
    stats = run(tensor_stats(m, [emb], str(calib_file)))
    assert emb not in stats                                  # no Linear reads it
    mr = run(evaluate_method(m, emb, "q4_0", "gptq", stats))
    assert mr.out_rel is None and any("not the input of a Linear" in n for n in mr.notes)
    with pytest.raises(WorkbenchError, match="does not apply"):
        run(evaluate_method(m, Q, "fp16", "gptq", {Q: LayerStats()}))


def test_fold_peer_changes_the_producer_without_touching_the_plain_cache(calib_file):
    from workbench.quant.evaluate import evaluate_tensor
    m = open_model(DEMO)
    up, down = "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight"
    assert down in peers_of(m, up)                 # down_proj's AWQ scale folds into up_proj
    plain = evaluate_tensor(m, up, "int4-g128")
    stats = run(tensor_stats(m, [up, down], str(calib_file)))
    alone = run(evaluate_method(m, up, "int4-g128", "rtn", stats))
    assert alone.result.error.sqnr_db == plain.error.sqnr_db
    folded = run(evaluate_method(m, up, "int4-g128", "rtn", stats,
                                 {down: ("int4-g128", "awq")}))
    assert folded.result.error.sqnr_db != plain.error.sqnr_db
    assert folded.out_rel != alone.out_rel
    # the plain result cached for the GUI's scheme rows is still the plain one
    assert evaluate_tensor(m, up, "int4-g128").error.sqnr_db == plain.error.sqnr_db

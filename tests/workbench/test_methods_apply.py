"""Methods applied to whole models: plan rules with "method", the CLI's --method/--calib/--imatrix,
the AWQ fold (float outputs unchanged), exports read back."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from workbench.cli import main
from workbench.errors import WorkbenchError
from workbench.loaders import open_model
from workbench.plan import Plan
from workbench.progress import run

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "resources" / "demo_model" / "model.safetensors"


@pytest.fixture(scope="module")
def calib_file(tmp_path_factory):
    lines = [ln for ln in (ROOT / "resources" / "calibration.txt").read_text().splitlines()
             if ln.strip()]
    p = tmp_path_factory.mktemp("calib") / "calib.txt"
    p.write_text("\n".join(lines[0:24:2]) + "\n")
    return p


# -- plans ------------------------------------------------------------------------------------

def test_plan_rules_carry_methods_through_json(tmp_path):
    plan = Plan("int4-g128", [{"match": "re:mlp", "scheme": "q4_0", "method": "GPTQ"}],
                method="imatrix")
    assert plan.method_for("model.layers.0.mlp.up_proj.weight") == "gptq"
    assert plan.method_for("model.layers.0.self_attn.q_proj.weight") == "imatrix"
    p = tmp_path / "plan.json"
    plan.save(p)
    d = json.loads(p.read_text())
    assert d["method"] == "imatrix" and d["rules"][0]["method"] == "gptq"
    back = Plan.load(p)
    assert back == plan and back.method_for("x.mlp.y") == "gptq"
    # rtn is the default and is not written
    assert "method" not in Plan("int8-channel").to_dict()
    assert Plan.from_dict({"version": 1, "default": "int8-channel"}).method == "rtn"
    # edits keep the methods
    p2 = plan.with_assignments({"model.layers.0.mlp.up_proj.weight": "int8-channel"})
    assert p2.method == "imatrix"
    p3 = plan.with_method("awq", ["model.layers.1.self_attn.q_proj.weight"])
    assert p3.method_for("model.layers.1.self_attn.q_proj.weight") == "awq"
    assert p3.scheme_for("model.layers.1.self_attn.q_proj.weight") == "int4-g128"


@pytest.mark.parametrize("bad", [{"method": "smoothquant"}, {"method": 3},
                                 {"rules": [{"match": "a", "scheme": "fp16", "method": "nope"}]}])
def test_plan_refuses_unknown_methods(bad):
    with pytest.raises(WorkbenchError, match="method"):
        Plan.from_dict({"version": 1, "default": "int8-channel", **bad})


# -- the AWQ fold --------------------------------------------------------------------------------

def test_awq_fold_keeps_the_float_model_exact(calib_file):
    """The folded float model (consumers' columns ×s, norms / producers' rows ÷s) gives the
    original outputs; the quantized fold changes them only by quantization error."""
    from workbench.methods.apply import prepare, runner_weights
    from workbench.runner import check
    model = open_model(str(DEMO))
    plan = Plan("int4-g128", method="awq")
    mm = run(prepare(model, plan, calib=str(calib_file)))
    # demo (Llama-style, GQA: v_proj narrower than o_proj's input, so no o <- v fold):
    # gate/up <- post_attention_layernorm, down <- up_proj (q/k/v <- input_layernorm where the
    # search finds α > 0)
    assert any(n.endswith("v_proj: not folded") or "v_proj: not folded" in n for n in mm.notes)
    assert "model.layers.0.post_attention_layernorm.weight" in mm.vec
    assert any(n.endswith("mlp.up_proj.weight") for n in mm.row)
    g, u = "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"
    np.testing.assert_array_equal(mm.col[g], mm.col[u])      # fused gate/up share the scale
    assert float(np.ptp(mm.col[g])) > 0.05                   # and it is not trivial
    w0 = model.read_matrix(g)
    np.testing.assert_allclose(mm.read_matrix(g), w0 * mm.col[g][None, :], rtol=1e-6)
    # up_proj is both a consumer (columns ×s) and down_proj's producer (rows ÷s')
    np.testing.assert_allclose(
        mm.read_matrix(u),
        model.read_matrix(u) * mm.col[u][None, :] / mm.row[u][:, None], rtol=1e-5)
    folded = {n: mm.read(n) for n in mm.folded_names}
    res = run(check(model, plan, str(calib_file), 8, weights=folded))
    assert res["kl_max"] < 1e-6 and res["top1_agree"] == 1.0
    # quantized: the stored tensors are Q(W·diag s); the run is close to the original
    qres = run(check(model, plan, str(calib_file), 8, weights=runner_weights(mm, plan)))
    assert 0 < qres["kl_mean"] < 0.5


def test_awq_fold_float_exact_on_minilm(minilm_path):
    """BERT (post-LN): only attention.output.dense <- value folds; the float outputs are equal."""
    from workbench.methods.apply import prepare
    from workbench.runner import check
    model = open_model(minilm_path)
    plan = Plan("int4-g128", method="awq")
    mm = run(prepare(model, plan, samples=12))
    assert sorted(mm.row) == [f"encoder.layer.{i}.attention.self.value.weight" for i in range(6)]
    assert not any("LayerNorm" in n for n in mm.vec)
    res = run(check(model, plan, None, 12, weights={n: mm.read(n) for n in mm.folded_names}))
    assert res["cosine_min"] > 1 - 1e-5

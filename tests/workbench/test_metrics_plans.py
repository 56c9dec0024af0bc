"""Error metrics (known values, model totals) and plans (precedence, JSON, malformed files)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from workbench.core.errors import WorkbenchError
from workbench.quant.evaluate import evaluate, evaluate_tensor
from workbench.formats.loaders import open_model
from workbench.quant.metrics import ErrorSums, ModelTotals, from_sums, sqnr_db, tensor_error
from workbench.quant.plan import KEEP, PLAN_VERSION, Plan, Rule
from workbench.core.progress import run
from workbench.schemes import get_scheme


def test_known_values_relative_perturbation():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((20, 30))
    eps = 1e-3
    e = tensor_error(w, w * (1 + eps))
    assert e.rel_rmse == pytest.approx(eps, rel=1e-9)
    assert e.sqnr_db == pytest.approx(-20 * math.log10(eps), rel=1e-9)  # 60 dB
    assert e.mse == pytest.approx(eps ** 2 * (w ** 2).mean(), rel=1e-9)
    assert e.max_abs_err == pytest.approx(eps * np.abs(w).max(), rel=1e-9)
    assert e.cosine == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(e.channel_rel_err, eps, rtol=1e-6)


def test_known_values_small():
    w = np.array([[3.0, 4.0], [0.0, 0.0]])
    q = np.array([[3.0, 0.0], [0.0, 1.0]])
    e = tensor_error(w, q)
    assert e.mse == (16 + 1) / 4
    assert e.rel_rmse == pytest.approx(math.sqrt(17 / 25))
    assert e.sqnr_db == pytest.approx(10 * math.log10(25 / 17))
    assert e.max_abs_err == 4.0
    assert e.cosine == pytest.approx(9 / (5 * math.sqrt(10)))
    assert e.channel_rel_err[0] == pytest.approx(0.8) and e.channel_rel_err[1] == np.inf
    exact = tensor_error(w, w)
    assert (exact.sqnr_db, exact.rel_rmse, exact.cosine, exact.max_abs_err) == (math.inf, 0, 1, 0)
    neg = tensor_error(np.ones((1, 4)), -np.ones((1, 4)))
    assert neg.cosine == pytest.approx(-1.0) and neg.rel_rmse == pytest.approx(2.0)


def test_sqnr_edge_cases():
    assert sqnr_db(1.0, 0.0) == math.inf
    assert sqnr_db(0.0, 1.0) == -math.inf
    assert sqnr_db(100.0, 1.0) == pytest.approx(20.0)
    z = from_sums(ErrorSums.zero(np.zeros((2, 3))))
    assert z.rel_rmse == 0 and z.cosine == 1.0


def test_model_totals():
    t = ModelTotals()
    t.add(params=100, bytes_before=400, bytes_after=100, sig=50.0, sse=0.5)
    t.add(params=300, bytes_before=1200, bytes_after=150, sig=150.0, sse=1.5)
    assert t.bits_per_weight == 8 * 250 / 400 == 5.0
    assert t.compression == 1600 / 250
    assert t.sqnr_db == pytest.approx(10 * math.log10(200 / 2.0))
    d = t.to_dict()
    assert d["bytes"] == 250 and d["bits_per_weight"] == 5.0 and d["params"] == 400
    assert ModelTotals().compression == 0.0 and ModelTotals().bits_per_weight == 0.0


def test_evaluate_totals_are_sums_of_tensors(tiny_llama):
    path, tensors = tiny_llama
    m = open_model(path)
    plan = Plan("int4-g64", [Rule("lm_head.weight", "int8-channel")])
    ev = run(evaluate(m, plan, cache=None))
    sig = sse = 0.0
    nbytes = 0
    for n, w in tensors.items():
        r = ev.tensors[n]
        nbytes += r.bytes
        w2 = w.reshape(w.shape[0], -1) if w.ndim > 1 else w.reshape(1, -1)
        if r.scheme == KEEP:
            assert w.ndim == 1 and r.bytes == w.nbytes and r.error.sse == 0
        else:
            s = get_scheme(r.scheme)
            d = s.dequantize(s.quantize(w2))
            ref = tensor_error(w2, d)
            assert r.error.mse == pytest.approx(ref.mse, rel=1e-9)
            assert r.error.max_abs_err == pytest.approx(ref.max_abs_err, rel=1e-6)
            assert r.bytes == s.nbytes(w.shape)
        sig += float((w.astype(np.float64) ** 2).sum())
        sse += r.error.sse
    assert ev.tensors["lm_head.weight"].scheme == "int8-channel"
    assert ev.totals.bytes_after == nbytes
    assert ev.totals.bytes_before == sum(w.nbytes for w in tensors.values())
    assert ev.totals.sqnr_db == pytest.approx(10 * math.log10(sig / sse), rel=1e-9)
    assert ev.totals.bits_per_weight == pytest.approx(8 * nbytes / sum(w.size for w in tensors.values()))


def test_evaluate_cache(tiny_llama):
    from workbench.quant.evaluate import EvalCache
    path, _ = tiny_llama
    m = open_model(path)
    cache = EvalCache()
    a = evaluate_tensor(m, "lm_head.weight", "int4-g32", cache)
    assert evaluate_tensor(m, "lm_head.weight", "int4-g32", cache) is a
    assert evaluate_tensor(m, "lm_head.weight", "int8-g32", cache) is not a


# ---- plans -------------------------------------------------------------------------------------

def test_precedence_exact_then_regex_then_default():
    plan = Plan("int8-channel", [
        Rule("re:mlp", "int4-g128"),
        Rule("re:down_proj", "nf4-g64"),
        Rule("model.layers.0.mlp.down_proj.weight", "fp16"),
        Rule("model.norm.weight", "int8-tensor"),
    ])
    assert plan.scheme_for("model.layers.0.mlp.down_proj.weight") == "fp16"   # exact beats re:
    assert plan.scheme_for("model.layers.1.mlp.down_proj.weight") == "int4-g128"  # first re:
    assert plan.scheme_for("model.layers.1.self_attn.q_proj.weight") == "int8-channel"
    assert plan.scheme_for("model.layers.1.input_layernorm.weight", ndim=1) == KEEP
    assert plan.scheme_for("model.norm.weight", ndim=1) == "int8-tensor"  # explicit wins over keep
    assert plan.scheme_for("ids", ndim=2, is_float=False) == KEEP
    assert plan.scheme_for("x.bias", ndim=0) == KEEP


def test_resolve_never_quantizes_non_float(make_safetensors):
    p = make_safetensors({"ids": np.zeros((2, 64), np.int64), "w": np.zeros((2, 64), np.float32),
                          "b": np.zeros(64, np.float32)})
    plan = Plan("int4-g64", [Rule("re:.*", "int8-channel")])
    assert plan.resolve(open_model(p)) == {"ids": KEEP, "w": "int8-channel", "b": "int8-channel"}
    assert Plan("int4-g64").resolve(open_model(p)) == {"ids": KEEP, "w": "int4-g64", "b": KEEP}


def test_rule_schemes_are_canonical():
    plan = Plan("INT8-channel@minmax", [Rule("a", "Int4-G128@minmax"), Rule("re:b", "keep")])
    assert plan.default == "int8-channel"
    assert plan.rules[0].scheme == "int4-g128" and plan.scheme_for("a") == "int4-g128"
    assert Plan.from_json(plan.to_json()) == plan


def test_edits_return_new_plans():
    p = Plan("int8-channel")
    q = p.with_rule("re:mlp", "int4-g32").with_assignments({"a": "fp16"}).with_default("int4-g64")
    assert p.rules == [] and p.default == "int8-channel"
    assert [r.to_dict() for r in q.rules] == [{"match": "re:mlp", "scheme": "int4-g32"},
                                              {"match": "a", "scheme": "fp16"}]
    r = q.with_assignments({"a": "bf16"})
    assert [x.scheme for x in r.rules if x.match == "a"] == ["bf16"]
    assert q.without_rule(0).rules == [Rule("a", "fp16")]
    with pytest.raises(WorkbenchError, match="unknown scheme"):
        q.with_assignments({"a": "int11"})


_schemes = st.sampled_from(["keep", "fp16", "bf16", "int8-channel", "int4-g128", "nf4-g64",
                            "int3-g64-asym@mse", "int4-g32@pot", "fp8-e4m3", "ternary-g64"])
_matches = st.one_of(st.text(min_size=0, max_size=30),
                     st.sampled_from(["re:mlp", "re:^model\\.layers\\.\\d+\\.", "re:(q|k)_proj$",
                                      "re:", "re:.*\\.weight"]))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(_matches, _schemes), max_size=8), _schemes)
def test_plan_json_round_trip(rules, default):
    rules = [(m, s) for m, s in rules if not m.startswith("re:") or _compiles(m[3:])]
    plan = Plan(default, [Rule(m, s) for m, s in rules])
    text = plan.to_json()
    back = Plan.from_json(text)
    assert back == plan and back.to_json() == text
    assert back.to_dict() == json.loads(text)
    for name in ["model.layers.3.mlp.up_proj.weight", "x", ""] + [m for m, _ in rules][:3]:
        assert back.scheme_for(name) == plan.scheme_for(name)


def _compiles(p):
    import re
    try:
        re.compile(p)
        return True
    except re.error:
        return False


def test_save_and_load(tmp_path):
    plan = Plan("int4-g128", [Rule("re:lm_head", "int8-channel")])
    p = tmp_path / "plan.json"
    plan.save(p)
    assert Plan.load(p) == plan
    assert json.loads(p.read_text())["version"] == PLAN_VERSION
    assert json.loads(p.read_text())["format"] == "quant-workbench-plan"


@pytest.mark.parametrize("text, needle", [
    ("{not json", "malformed plan JSON"),
    ("[]", "must be a JSON object"),
    ('{"version": 3, "default": "int8-channel"}', "unsupported plan version 3"),
    ('{"default": "int8-channel"}', "unsupported plan version None"),
    ('{"version": true, "default": "int8-channel"}', "version"),
    ('{"version": "1", "default": "int8-channel"}', "version"),
    ('{"version": 1.0, "default": "int8-channel"}', "version"),
    ('{"format": "other", "version": 1}', "not a plan file"),
    ('{"version": 1, "default": "int11-channel"}', "unknown scheme 'int11-channel'"),
    ('{"version": 1, "default": 8}', "'default' must be a scheme name"),
    ('{"version": 1, "rules": {"a": "fp16"}}', "'rules' must be a list"),
    ('{"version": 1, "rules": [["a", "fp16"]]}', "rule 0"),
    ('{"version": 1, "rules": [{"match": "a"}]}', "rule 0"),
    ('{"version": 1, "rules": [{"match": 5, "scheme": "fp16"}]}', "rule 0"),
    ('{"version": 1, "rules": [{"match": "a", "scheme": "fp16"}, '
     '{"match": "b", "scheme": "int4-g100"}]}', "unknown scheme 'int4-g100'"),
    ('{"version": 1, "rules": [{"match": "re:(", "scheme": "fp16"}]}', "bad regular expression"),
])
def test_malformed_plans(tmp_path, text, needle):
    p = tmp_path / "bad_plan.json"
    p.write_text(text)
    with pytest.raises(WorkbenchError) as ei:
        Plan.load(p)
    msg = str(ei.value)
    assert str(p) in msg, msg
    assert needle in msg, msg
    assert "\n" not in msg


def test_missing_and_binary_plan_files(tmp_path):
    with pytest.raises(WorkbenchError, match="plan file not found"):
        Plan.load(tmp_path / "none.json")
    b = tmp_path / "bin.json"
    b.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(WorkbenchError) as ei:
        Plan.load(b)
    assert str(b) in str(ei.value)

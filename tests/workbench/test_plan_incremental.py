"""The fast paths the window uses on large catalogs (issue 23) give what the per-tensor
functions give: Plan.sources / resolve(names) / exact_changes, the Decider's memo in
plan_decisions, Summary.remove, catalog.grouping."""

import numpy as np

from workbench.formats import catalog
from workbench.formats.model import Model, TensorInfo
from workbench.quant.plan import KEEP, Plan
from workbench.quant.runtimes import decide, get_runtime, plan_decisions, summarize

NAMES = [
    ("model.embed_tokens.weight", (64, 32), "F32"),
    ("model.layers.0.input_layernorm.weight", (32,), "F32"),
    ("model.layers.0.self_attn.q_proj.weight", (32, 32), "F32"),
    ("model.layers.0.self_attn.q_proj.bias", (32,), "F32"),
    ("model.layers.0.mlp.gate.weight", (4, 32), "F32"),                 # a router
    ("model.layers.0.mlp.experts.0.up_proj.weight", (16, 32), "F32"),
    ("model.layers.0.mlp.experts.1.up_proj.weight", (16, 32), "F32"),
    ("model.layers.0.mlp.experts.1.down_proj.weight", (32, 16), "BF16"),
    ("model.layers.0.mlp.shared_experts.up_proj.weight", (16, 32), "F32"),
    ("model.layers.1.mlp.experts.gate_up_proj", (4, 32, 32), "F32"),    # merged 3-D
    ("model.layers.1.self_attn.k_proj.weight", (32, 256), "F16"),
    ("blk.2.ffn_down_exps.weight", (4, 32, 16), "F32"),
    ("blk.2.ffn_gate_inp.weight", (4, 32), "F32"),
    ("model.layers.1.position_ids", (1, 64), "I64"),
    ("lm_head.weight", (64, 32), "F32"),
    ("model.norm.weight", (32,), "F32"),
]


def _model():
    tensors = {n: TensorInfo(n, s, d, 4 * int(np.prod(s))) for n, s, d in NAMES}
    return Model("mem", "safetensors", tensors, lambda n: None)


PLANS = [
    Plan(),
    Plan(default="q4_k", fallback="q8_0"),
    Plan(default="int4-g32", rules=[{"match": "model.layers.0.mlp.gate.weight", "scheme": "q8_0"},
                                     {"match": "lm_head.weight", "scheme": "fp16",
                                      "fallback": "q8_0"},
                                     {"match": "model.norm.weight", "scheme": "fp16"}]),
    Plan(default="q4_0", rules=[{"match": "re:up_proj", "scheme": "q8_0"},
                                {"match": "moe:experts", "scheme": "int4-g32"},
                                {"match": "model.embed_tokens.weight", "scheme": KEEP}]),
]


def test_sources_and_resolve_give_scheme_and_source_per_tensor():
    m = _model()
    for plan in PLANS:
        full = plan.resolve(m)
        for name, info, scheme, explicit, rule in plan.sources(m):
            want, want_explicit = plan.scheme_and_source(name, info.ndim, info.is_float)
            assert scheme == (want if info.is_float else KEEP), (plan, name)
            assert rule is plan.rule_for(name) or rule == plan.rule_for(name)
            if info.is_float:
                assert explicit == want_explicit
            assert full[name] == scheme
        some = [n for n, _s, _d in NAMES[::3]]
        assert plan.resolve(m, some) == {n: full[n] for n in some}


def test_exact_changes_names_what_an_assignment_can_change():
    base = PLANS[2]
    after = base.with_assignments({"model.layers.0.self_attn.q_proj.weight": "q8_0",
                                   "lm_head.weight": "q4_0"})
    assert base.exact_changes(after) == {"model.layers.0.self_attn.q_proj.weight",
                                         "lm_head.weight"}
    assert after.exact_changes(base) == base.exact_changes(after)
    assert base.exact_changes(base) == set()
    # a method on an exact rule is a change of that rule
    assert base.exact_changes(base.with_method("gptq", ["model.norm.weight"])) == \
        {"model.norm.weight"}
    # anything else: every tensor may have changed
    assert base.exact_changes(base.with_default("q8_0")) is None
    assert base.exact_changes(base.with_rule("re:k_proj", "q8_0")) is None
    assert base.exact_changes(base.with_method("awq")) is None
    m = _model()
    for plan in PLANS:
        for names in (["model.layers.0.mlp.gate.weight"], ["blk.2.ffn_gate_inp.weight",
                                                             "model.norm.weight"]):
            after = plan.with_assignments({n: "q8_0" for n in names})
            changed = plan.exact_changes(after)
            old, new = plan.resolve(m), after.resolve(m)
            assert changed is not None
            assert {n for n in old if old[n] != new[n]} <= changed


def test_decider_memo_gives_what_decide_gives():
    """The "any" runtime's decisions are memoised per (request, shape, dtype): each equals the
    decision decide() makes for that tensor alone."""
    m = _model()
    rt = get_runtime("any")
    for plan in PLANS:
        got = plan_decisions(m, plan, "any")
        assert list(got) == list(m.tensors)
        for name, info in m.tensors.items():
            requested, explicit = plan.scheme_and_source(name, info.ndim, info.is_float)
            want = decide(info, requested, rt, fallback=plan.fallback_for(name),
                          explicit=explicit)
            assert got[name] == want, (plan, name)
        assert plan_decisions(m, plan, "any", ["lm_head.weight"]) == \
            {"lm_head.weight": got["lm_head.weight"]}


def test_summary_remove_takes_a_decision_back():
    m = _model()
    ds = list(plan_decisions(m, PLANS[1], "any").values())
    s = summarize(ds)
    for d in ds[::2]:
        s.remove(d)
    assert s.to_dict() == summarize(ds[1::2]).to_dict()


def test_grouping_is_role_group_and_expert_group():
    for name, shape, _d in NAMES:
        ndim = len(shape)
        role = catalog.infer_role(name, ndim)
        assert catalog.grouping(name, ndim) == (role, catalog.group_of(name, role),
                                                catalog.expert_group(name)), name
    # the same template with other block numbers: the memo keeps the number out
    assert catalog.grouping("model.layers.17.mlp.experts.3.up_proj.weight", 2) == \
        ("expert", "layer 17", "layer 17 experts up")
    assert catalog.is_router("model.layers.5.mlp.gate.weight")
    assert not catalog.is_router("model.layers.5.mlp.experts.0.gate_proj.weight")

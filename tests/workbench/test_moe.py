"""Mixture-of-experts as one structure (issue 18): roles, merged 3-D experts, plan selectors,
routers in float, per-expert spread, router usage and expert-weighted allocation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from workbench.formats.catalog import expert_group, expert_index, infer_role, moe_role, projection
from workbench.core.errors import WorkbenchError
from workbench.quant.plan import KEEP, Plan
from workbench.core.progress import run

ROOT = Path(__file__).resolve().parents[2]

NAMES = [
    # (name, ndim, role, expert index, projection, group)
    ("model.layers.3.mlp.experts.7.down_proj.weight", 2, "expert", 7, "down", "layer 3 experts down"),
    ("model.layers.3.mlp.experts.0.gate_proj.weight", 2, "expert", 0, "gate", "layer 3 experts gate"),
    ("model.layers.3.mlp.experts.12.up_proj.weight", 2, "expert", 12, "up", "layer 3 experts up"),
    ("model.layers.2.block_sparse_moe.experts.5.w1.weight", 2, "expert", 5, "gate", "layer 2 experts gate"),
    ("model.layers.2.block_sparse_moe.experts.5.w3.weight", 2, "expert", 5, "up", "layer 2 experts up"),
    ("model.layers.2.block_sparse_moe.experts.5.w2.weight", 2, "expert", 5, "down", "layer 2 experts down"),
    ("model.layers.2.block_sparse_moe.gate.weight", 2, "router", None, None, None),
    ("model.layers.3.mlp.gate.weight", 2, "router", None, None, None),
    ("model.layers.3.mlp.gate.e_score_correction_bias", 1, "router", None, None, None),
    ("model.layers.3.mlp.shared_experts.down_proj.weight", 2, "shared_expert", None, "down", None),
    ("model.layers.3.mlp.shared_expert.gate_proj.weight", 2, "shared_expert", None, "gate", None),
    ("model.layers.3.mlp.shared_expert_gate.weight", 2, "router", None, None, None),
    ("model.layers.0.mlp.experts.gate_up_proj", 3, "expert", None, "gate_up", "layer 0 experts gate_up"),
    ("model.layers.0.mlp.experts.down_proj", 3, "expert", None, "down", "layer 0 experts down"),
    ("blk.4.ffn_gate_exps.weight", 3, "expert", None, "gate", "layer 4 experts gate"),
    ("blk.4.ffn_up_exps.weight", 3, "expert", None, "up", "layer 4 experts up"),
    ("blk.4.ffn_down_exps.weight", 3, "expert", None, "down", "layer 4 experts down"),
    ("blk.4.ffn_gate_inp.weight", 2, "router", None, None, None),
    ("blk.4.ffn_gate_inp_shexp.weight", 2, "router", None, None, None),
    ("blk.4.exp_probs_b.bias", 1, "router", None, None, None),
    ("blk.4.ffn_up_shexp.weight", 2, "shared_expert", None, "up", None),
    # dense look-alikes stay what they were
    ("model.layers.4.mlp.gate_proj.weight", 2, "mlp_gate", None, None, None),
    ("model.layers.0.mlp.gate_up_proj.weight", 2, "mlp_up", None, None, None),
    ("blk.4.ffn_gate.weight", 2, "mlp_gate", None, None, None),
    ("blk.4.ffn_down.weight", 2, "mlp_down", None, None, None),
]


@pytest.mark.parametrize("name,ndim,role,idx,proj,group", NAMES)
def test_roles_of_moe_names(name, ndim, role, idx, proj, group):
    assert infer_role(name, ndim) == role
    assert expert_index(name) == idx
    assert projection(name) == proj
    assert expert_group(name) == group


# ---- tiny Hugging Face MoE models ---------------------------------------------------------------
MOE_ARCHS = {  # arch: (experts per layer, first MoE block, router name, shared experts)
    "qwen3_moe": (4, 0, "mlp.gate.weight", False),
    "mixtral": (4, 0, "block_sparse_moe.gate.weight", False),
    "deepseek_v3": (4, 1, "mlp.gate.weight", True),
}


@pytest.mark.parametrize("arch", sorted(MOE_ARCHS))
def test_tiny_moe_catalog(tiny_arch, arch):
    from workbench.formats.loaders import open_model
    n_exp, first, router, shared = MOE_ARCHS[arch]
    m = open_model(tiny_arch(arch))
    by_role: dict[str, list[str]] = {}
    for n, info in m.tensors.items():
        by_role.setdefault(info.role, []).append(n)
    assert "mlp_gate" not in {m.info(n).role for n in by_role.get("router", [])}
    moe_blocks = range(first, 2)
    assert sorted(by_role["router"] if not shared else
                  [n for n in by_role["router"] if n.endswith(".weight")]) == \
        [f"model.layers.{b}.{router}" for b in moe_blocks]
    assert len(by_role["expert"]) == 3 * n_exp * len(moe_blocks)
    for n in by_role["expert"]:
        info = m.info(n)
        assert info.expert == int(n.split(".experts.")[1].split(".")[0])
        assert info.n_experts == 1 and info.matrix_shape == info.shape
    assert ("shared_expert" in by_role) == shared
    from workbench.running.moe import expert_groups
    groups = expert_groups(m)
    assert len(groups) == 3 * len(moe_blocks)
    assert all([m.info(n).expert for n in ns] == list(range(n_exp)) for ns in groups.values())


@pytest.mark.parametrize("arch", sorted(MOE_ARCHS))
def test_router_stays_float_by_default(tiny_arch, arch):
    from workbench.formats.loaders import open_model
    from workbench.quant.runtimes import plan_decisions
    m = open_model(tiny_arch(arch))
    routers = [n for n in m.tensors if m.info(n).role == "router" and m.info(n).ndim == 2]
    assert routers
    # a uniform scheme and a pattern that matches the router leave it alone
    plan = Plan(default="q4_k", rules=[{"match": r"re:\.gate\.", "scheme": "q8_0"}])
    for rt in ("any", "llama.cpp", "vllm"):
        decs = plan_decisions(m, plan, rt)
        for r in routers:
            assert decs[r].applied == KEEP and decs[r].kind == "kept", (rt, r, decs[r])
    experts = [n for n in m.tensors if m.info(n).role == "expert"]
    assert plan_decisions(m, plan, "any")[experts[0]].applied == "q4_k"
    # an exact name, or the moe:router selector, quantizes it
    r0 = routers[0]
    p2 = Plan(default="q4_k", rules=[{"match": r0, "scheme": "q8_0"}])
    assert plan_decisions(m, p2, "any")[r0].applied == "q8_0"
    assert plan_decisions(m, p2, "any")[routers[-1]].applied == KEEP or len(routers) == 1
    p3 = Plan(default="q4_k", rules=[{"match": "moe:router", "scheme": "int8-channel"}])
    d3 = plan_decisions(m, p3, "any")
    assert all(d3[r].applied == "int8-channel" for r in routers)
    # llama.cpp never re-types ffn_gate_inp, vLLM keeps routers: the explicit rule is skipped
    assert plan_decisions(m, p3, "vllm")[r0].kind == "skipped"


def test_selectors_address_experts(tiny_arch):
    from workbench.formats.loaders import open_model
    m = open_model(tiny_arch("qwen3_moe"))
    plan = Plan(default="q4_k", rules=[{"match": "moe:experts.down@1", "scheme": "q8_0"},
                                       {"match": "moe:experts", "scheme": "q6_k"}])
    res = plan.resolve(m)
    down1 = {n for n, s in res.items() if s == "q8_0"}
    assert down1 == {f"model.layers.1.mlp.experts.{e}.down_proj.weight" for e in range(4)}
    others = {n for n, s in res.items() if s == "q6_k"}
    assert others == {n for n in m.tensors if ".experts." in n} - down1
    assert res["model.layers.1.self_attn.q_proj.weight"] == "q4_k"
    assert res["model.layers.1.mlp.gate.weight"] == KEEP
    # layer ranges and the shared experts
    p = Plan(rules=[{"match": "moe:experts.gate@0-1", "scheme": "q8_0"}])
    assert sum(1 for s in p.resolve(m).values() if s == "q8_0") == 8


def test_selector_plan_json_version(tmp_path):
    plan = Plan(default="q4_k", rules=[{"match": "moe:experts.down@5", "scheme": "q6_k"}])
    d = plan.to_dict()
    assert d["version"] == 2 and d["rules"][0]["match"] == "moe:experts.down@5"
    f = tmp_path / "p.json"
    plan.save(f)
    back = Plan.load(f)
    assert back == plan
    assert back.scheme_for("blk.5.ffn_down_exps.weight", 3) == "q6_k"
    assert back.scheme_for("blk.4.ffn_down_exps.weight", 3) == "q4_k"
    assert back.scheme_for("blk.5.ffn_up_exps.weight", 3) == "q4_k"
    # a plan without selectors stays version 1, and version 1 files load as before
    assert Plan(default="q4_k").to_dict()["version"] == 1
    old = {"format": "quant-workbench-plan", "version": 1, "default": "q8_0",
           "rules": [{"match": r"re:\.mlp\.", "scheme": "q4_k"}]}
    p1 = Plan.from_dict(old)
    assert p1.scheme_for("model.layers.0.mlp.down_proj.weight") == "q4_k"
    assert p1.scheme_for("model.layers.0.mlp.gate.weight") == KEEP


@pytest.mark.parametrize("bad,why", [("moe:expert", "expected moe:KIND"),
                                     ("moe:experts.fc1", "unknown projection"),
                                     ("moe:router.down", "a router has no projection"),
                                     ("moe:experts@7-3", "is empty")])
def test_bad_selectors(bad, why):
    with pytest.raises(WorkbenchError, match=why):
        Plan(rules=[{"match": bad, "scheme": "q4_k"}])
    with pytest.raises(WorkbenchError, match=why):
        Plan.from_dict({"format": "quant-workbench-plan", "version": 2, "default": "q4_k",
                        "rules": [{"match": bad, "scheme": "q4_k"}]})


def _cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "main.py", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})


def test_cli_rule_selector(tiny_arch):
    folder = tiny_arch("mixtral")
    r = _cli("evaluate", folder, "--scheme", "q4_k", "--rule", "moe:experts.down@1=q8_0",
             "--json")
    assert r.returncode == 0, r.stderr
    rows = {t["name"]: t for t in json.loads(r.stdout)["tensors"]}
    for e in range(4):
        assert rows[f"model.layers.1.block_sparse_moe.experts.{e}.w2.weight"]["scheme"] == "q8_0"
        assert rows[f"model.layers.0.block_sparse_moe.experts.{e}.w2.weight"]["scheme"] == "q4_k"
    assert rows["model.layers.1.block_sparse_moe.gate.weight"]["scheme"] == KEEP
    bad = _cli("evaluate", folder, "--scheme", "q4_k", "--rule", "moe:experts.fc9=q8_0")
    assert bad.returncode == 2
    assert "unknown projection" in bad.stderr and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


# ---- GGUF merged 3-D experts --------------------------------------------------------------------
@pytest.fixture(scope="module")
def moe_gguf(tmp_path_factory):
    pytest.importorskip("gguf")
    from tests.moe_gguf import write_moe_gguf
    path = tmp_path_factory.mktemp("moe-gguf") / "moe.gguf"
    weights = write_moe_gguf(path)
    return path, weights


def test_merged_experts_read_per_expert(moe_gguf):
    from workbench.formats.loaders import open_model
    from workbench.running.moe import expert_slices
    path, weights = moe_gguf
    m = open_model(path)
    info = m.info("blk.1.ffn_down_exps.weight")
    assert (info.role, info.shape, info.matrix_shape, info.n_experts, info.expert) == \
        ("expert", (4, 256, 256), (1024, 256), 4, None)
    assert m.info("blk.1.ffn_gate_inp.weight").role == "router"
    assert m.info("blk.1.ffn_gate_inp_shexp.weight").role == "router"
    assert m.info("blk.1.ffn_up_shexp.weight").role == "shared_expert"
    src = weights["blk.1.ffn_down_exps.weight"]
    for e, w in expert_slices(m, "blk.1.ffn_down_exps.weight"):
        assert w.shape == (256, 256)
        # Q8_0 storage: within half a step of each block's scale
        assert np.abs(w - src[e]).max() <= np.abs(src[e]).max() / 127 * 0.51 + 1e-7
    g = m.read("blk.1.ffn_gate_exps.weight")
    np.testing.assert_allclose(g, weights["blk.1.ffn_gate_exps.weight"], atol=2e-3 * 4)


def test_merged_experts_spread(moe_gguf):
    from workbench.formats.loaders import open_model
    from workbench.running.moe import expert_groups, expert_spread
    path, weights = moe_gguf
    m = open_model(path)
    assert expert_groups(m)["layer 1 experts down"] == ["blk.1.ffn_down_exps.weight"]
    sp = run(expert_spread(m, "layer 1 experts gate"))
    src = weights["blk.1.ffn_gate_exps.weight"].astype(np.float16).astype(np.float64)
    assert sp.experts == [0, 1, 2, 3]
    np.testing.assert_allclose(sp.absmax, np.abs(src).max(axis=(1, 2)), rtol=1e-6)
    np.testing.assert_allclose(sp.std, src.reshape(4, -1).std(axis=1), rtol=1e-5)
    d = src.reshape(4, -1) - src.reshape(4, -1).mean(1, keepdims=True)
    kurt = (d ** 4).mean(1) / (d ** 2).mean(1) ** 2 - 3
    np.testing.assert_allclose(sp.kurtosis, kurt, rtol=1e-4, atol=1e-6)
    # the file scales expert e by (1 + e)
    np.testing.assert_allclose(sp.std / sp.std[0], [1, 2, 3, 4], rtol=0.03)


def test_merged_experts_evaluate_per_row(moe_gguf):
    """int8-channel on a merged tensor: one scale per expert row (not per expert)."""
    from workbench.quant.evaluate import evaluate_tensor, quantize
    from workbench.formats.loaders import open_model
    from workbench.schemes import get_scheme
    from workbench.running.moe import expert_slices
    path, _ = moe_gguf
    m = open_model(path)
    name = "blk.0.ffn_up_exps.weight"
    r = evaluate_tensor(m, name, "int8-channel")
    sse = 0.0
    for _e, w in expert_slices(m, name):
        q = get_scheme("int8-channel").dequantize(quantize(w, "int8-channel")).reshape(w.shape)
        sse += float(((q.astype(np.float64) - w) ** 2).sum())
    assert r.error.sse == pytest.approx(sse, rel=1e-6)
    assert r.bytes == 4 * 256 * 256 + 4 * 256 * 4     # int8 weights + a float32 scale per row


def test_gguf_export_retypes_merged_experts_keeps_router(moe_gguf, tmp_path):
    import gguf
    from workbench.formats.loaders import open_model
    from workbench.running.moe import expert_slices
    path, weights = moe_gguf
    out = tmp_path / "q.gguf"
    r = _cli("export", path, "--format", "gguf", "--scheme", "q4_k",
             "--rule", "moe:experts.down=q6_k", "--rule", "re:ffn_gate_inp=q8_0", "-o", out)
    assert r.returncode == 0, r.stderr
    reader = gguf.GGUFReader(str(out))
    types = {t.name: (t.tensor_type.name, [int(x) for x in t.shape]) for t in reader.tensors}
    assert types["blk.1.ffn_gate_exps.weight"] == ("Q4_K", [256, 256, 4])
    assert types["blk.1.ffn_down_exps.weight"] == ("Q6_K", [256, 256, 4])
    assert types["blk.1.ffn_gate_inp.weight"][0] == "F32"
    assert types["blk.1.ffn_gate_inp_shexp.weight"][0] == "F32"
    # gguf's own dequantizer reads what we wrote: each expert within Q6_K error of the source
    src = open_model(path)
    t = next(t for t in reader.tensors if t.name == "blk.1.ffn_down_exps.weight")
    deq = gguf.quants.dequantize(t.data, t.tensor_type).reshape(4, 256, 256)
    for e, w in expert_slices(src, "blk.1.ffn_down_exps.weight"):
        rel = np.sqrt(((deq[e] - w) ** 2).mean() / (w ** 2).mean())
        assert rel < 0.03, (e, rel)


# ---- router usage and expert-weighted allocation -----------------------------------------------
def _reference_usage(folder, samples):
    """Counts from transformers' own router logits (output_router_logits), independent of the
    workbench's hooks and weight loading."""
    import torch
    import transformers
    net = transformers.AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True,
                                                            dtype=torch.float32).eval()
    k = net.config.num_experts_per_tok
    counts, n_tok = None, 0
    for s in samples:
        with torch.no_grad():
            out = net(input_ids=torch.from_numpy(np.asarray(s, np.int64)[None]),
                      output_router_logits=True)
        logits = out.router_logits
        c = np.stack([np.bincount(torch.topk(lg, k, dim=-1).indices.reshape(-1).numpy(),
                                  minlength=lg.shape[-1]) for lg in logits])
        counts = c if counts is None else counts + c
        n_tok += len(s)
    return counts / n_tok


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
def test_expert_usage_matches_transformers_router(tiny_arch, arch):
    from workbench.running.calibration import calibration_samples
    from workbench.formats.loaders import open_model
    from workbench.running.moe import expert_usage
    pytest.importorskip("transformers")
    folder = tiny_arch(arch)
    m = open_model(folder)
    usage = run(expert_usage(m, samples=6))
    data = run(calibration_samples(m, None, 6, 128))
    ref = _reference_usage(folder, data)
    proj = "down_proj" if arch == "qwen3_moe" else "w2"
    moe = "mlp" if arch == "qwen3_moe" else "block_sparse_moe"
    for b in range(2):
        got = [usage[f"model.layers.{b}.{moe}.experts.{e}.{proj}.weight"] for e in range(4)]
        np.testing.assert_allclose(got, ref[b], atol=1e-12)
        assert sum(got) == pytest.approx(2.0)      # top-2 routing
        assert len(set(got)) > 1                    # the router does prefer some experts


def test_expert_usage_deepseek_shared_and_dense(tiny_arch):
    from workbench.formats.loaders import open_model
    from workbench.running.moe import expert_usage
    m = open_model(tiny_arch("deepseek_v3"))
    usage = run(expert_usage(m, samples=4))
    assert set(usage) == {n for n in m.tensors if m.info(n).role == "expert"}
    assert all(".layers.1." in n for n in usage)           # block 0 is dense
    total = sum(usage[f"model.layers.1.mlp.experts.{e}.up_proj.weight"] for e in range(4))
    assert total == pytest.approx(2.0)


def test_usage_weighted_sensitivity_and_one_decision_per_group(tiny_arch):
    from workbench.formats.loaders import open_model
    from workbench.running.moe import expert_usage
    from workbench.planning.sensitivity import build_table
    m = open_model(tiny_arch("qwen3_moe"))
    usage = run(expert_usage(m, samples=6))
    schemes = ["q4_k", "q8_0"]
    plain = run(build_table(m, schemes, runtime="llama.cpp"))
    weighted = run(build_table(m, schemes, runtime="llama.cpp", usage=usage))
    for n, f in usage.items():
        for s in schemes:
            assert weighted.values[(n, s)] == pytest.approx(plain.values[(n, s)] * f, rel=1e-12)
    # routers are not a choice; one projection's experts of a layer are one llama.cpp decision
    assert not [n for n in weighted.names if m.info(n).role == "router"]
    assert len(weighted.groups) == 6 and all(len(v) == 4 for v in weighted.groups)
    from workbench.formats.catalog import expert_group
    assert all(len({expert_group(n) for n in g}) == 1 for g in weighted.groups)
    assert run(build_table(m, schemes, runtime="any")).groups == []
    # vLLM's FusedMoE: every expert of a layer (all projections) is one decision
    vg_all = run(build_table(m, ["int4-channel", "int8-channel"], runtime="vllm")).groups
    vg = [ns for ns in vg_all if any(".experts." in n for n in ns)]
    assert len(vg) == 2 and all(len(ns) == 12 for ns in vg)
    # beside them, each layer's fused q/k/v (workbench.quant.runtimes.fused_groups)
    assert sorted(len(ns) for ns in vg_all if ns not in vg) == [3, 3]
    assert [{m.info(n).block for n in ns} for ns in vg] == [{0}, {1}]
    free_table = run(build_table(m, schemes, runtime="any", usage=usage))
    split_free, mixes = 0, 0
    for bpw in np.linspace(4.6, 8.4, 12):
        budget = weighted.budget_bytes(budget_bpw=float(bpw))
        plan, _ = weighted.solve(budget)
        res = plan.resolve(m)
        for names in weighted.groups:
            assert len({res[n] for n in names}) == 1, (bpw, names[0])
        mixes += {res[n] for n in weighted.names} == {"q4_k", "q8_0"}
        # the "any" runtime chooses per tensor: experts of one group may differ
        fr = free_table.solve(budget)[0].resolve(m)
        split_free += any(len({fr[n] for n in ns}) > 1 for ns in weighted.groups)
    assert mixes >= 3 and split_free >= 1


def test_merged_usage_weighting(moe_gguf):
    from workbench.formats.loaders import open_model
    from workbench.running.moe import expert_slices
    from workbench.quant.evaluate import quantize
    from workbench.schemes import get_scheme
    from workbench.planning.sensitivity import build_table
    path, _ = moe_gguf
    m = open_model(path)
    f = np.array([0.9, 0.5, 0.4, 0.2])
    name = "blk.0.ffn_down_exps.weight"
    t = run(build_table(m, ["q4_0"], runtime="llama.cpp", usage={name: f}))
    per = []
    for _e, w in expert_slices(m, name):
        q = get_scheme("q4_0").dequantize(quantize(w, "q4_0")).reshape(w.shape)
        per.append(float(((q.astype(np.float64) - w) ** 2).sum()))
    assert t.values[(name, "q4_0")] == pytest.approx(float(np.dot(per, f)), rel=1e-9)
    plain = run(build_table(m, ["q4_0"], runtime="llama.cpp"))
    assert plain.values[(name, "q4_0")] == pytest.approx(sum(per), rel=1e-6)


def test_compressed_tensors_routers_ignored(tiny_arch, tmp_path):
    folder = tiny_arch("qwen3_moe")
    out = tmp_path / "ct"
    r = _cli("export", folder, "--format", "compressed-tensors", "--scheme", "int4-g128",
             "-o", out)
    if r.returncode == 2 and "compressed" in r.stderr and "install" in r.stderr:
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0, r.stderr
    q = json.loads((out / "config.json").read_text())["quantization_config"]
    assert "model.layers.0.mlp.gate" in q["ignore"] and "model.layers.1.mlp.gate" in q["ignore"]
    targets = {t for g in q["config_groups"].values() for t in g["targets"]}
    assert "model.layers.1.mlp.experts.3.down_proj" in targets
    assert not any(t.endswith("mlp.gate") for t in targets)


def test_runner_expert_usage_agrees(tiny_arch):
    """Where the runner provides expert_usage (branch runner), it counts what the router hooks
    here count."""
    import workbench.running.runner_jobs as R
    if not hasattr(R, "expert_usage"):
        pytest.skip("workbench.running.runner has no expert_usage yet (workbench.running.moe's is used)")
    from workbench.formats.loaders import open_model
    from workbench.running.moe import expert_usage
    m = open_model(tiny_arch("qwen3_moe"))
    mine = run(expert_usage(m, samples=6))
    theirs = run(R.expert_usage(m, samples=6))
    assert set(mine) == set(theirs)
    for n in mine:
        assert theirs[n] == pytest.approx(mine[n], abs=1e-9), n


def test_inspect_experts_prints_the_spread(moe_gguf):
    from workbench.formats.loaders import open_model
    from workbench.running.moe import expert_spread
    path, _ = moe_gguf
    r = _cli("inspect", path, "--experts", "--json")
    assert r.returncode == 0, r.stderr
    groups = {g["group"]: g for g in json.loads(r.stdout)["groups"]}
    assert sorted(groups) == sorted(f"layer {b} experts {p}" for b in (0, 1)
                                    for p in ("gate", "up", "down"))
    sp = run(expert_spread(open_model(path), "layer 1 experts down"))
    np.testing.assert_allclose(groups["layer 1 experts down"]["std"], sp.std, rtol=1e-12)
    np.testing.assert_allclose(groups["layer 1 experts down"]["absmax"], sp.absmax, rtol=1e-12)
    dense = _cli("inspect", ROOT / "resources" / "demo_model", "--experts")
    assert dense.returncode == 2 and "no mixture-of-experts tensors" in dense.stderr


ROWWISE = ["fp16", "bf16", "fp8-e4m3", "nf4-g64", "ternary-g64", "iq4_nl", "q4_0", "q4_1",
           "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "int4-channel",
           "int4-g128-asym", "int8-channel-asym", "int3-g32"]


@pytest.mark.parametrize("scheme", ROWWISE)
def test_merged_experts_every_scheme_is_per_expert_rows(moe_gguf, scheme):
    """Under every row-wise scheme (per channel, per group, every GGML type), a merged tensor's
    error and bytes are the sums over its experts quantized alone."""
    from workbench.quant.evaluate import evaluate_tensor
    from workbench.formats.loaders import open_model
    from workbench.running.moe import expert_slices
    from workbench.planning.sensitivity import merged_expert_errors
    from workbench.quant.evaluate import quantize
    path, _ = moe_gguf
    m = open_model(path)
    name = "blk.0.ffn_gate_exps.weight"
    r = evaluate_tensor(m, name, scheme)
    assert r.scheme == scheme
    per = merged_expert_errors(m, name, scheme)
    assert r.error.sse == pytest.approx(float(per.sum()), rel=1e-5)
    nbytes = sum(quantize(w, scheme).nbytes for _e, w in expert_slices(m, name))
    assert r.bytes == nbytes


def test_merged_experts_per_tensor_scheme_spans_the_stack(moe_gguf):
    """A per-tensor scheme has one scale for the whole stored tensor (all experts)."""
    from workbench.quant.evaluate import evaluate_tensor, quantize
    from workbench.formats.loaders import open_model
    path, _ = moe_gguf
    m = open_model(path)
    name = "blk.0.ffn_gate_exps.weight"
    r = evaluate_tensor(m, name, "int8-tensor")
    w = m.read_matrix(name)
    from workbench.schemes import get_scheme
    q = get_scheme("int8-tensor").dequantize(quantize(w, "int8-tensor")).reshape(w.shape)
    assert r.error.sse == pytest.approx(float(((q.astype(np.float64) - w) ** 2).sum()), rel=1e-6)


def test_allocate_pin_selector(tiny_arch, tmp_path):
    folder = tiny_arch("qwen3_moe")
    out = tmp_path / "plan.json"
    r = _cli("allocate", folder, "--target", "llama.cpp", "--budget-bpw", "5.5",
             "--schemes", "q4_k,q8_0", "--pin", "moe:experts.down@1=q8_0",
             "--pin", "moe:router@0=q8_0", "-o", out, "--json")
    assert r.returncode == 0, r.stderr
    plan = Plan.load(out)
    for e in range(4):
        assert plan.scheme_for(f"model.layers.1.mlp.experts.{e}.down_proj.weight") == "q8_0"
    # pinned router: an exact rule (llama.cpp then keeps ffn_gate_inp anyway, as it says)
    assert plan.scheme_for("model.layers.0.mlp.gate.weight") == "q8_0"
    assert plan.scheme_for("model.layers.1.mlp.gate.weight") == KEEP
    bad = _cli("allocate", folder, "--budget-bpw", "5", "--pin", "moe:shared=q8_0", "-o", out)
    assert bad.returncode == 2 and "no tensor of the model matches" in bad.stderr


def test_selectors_and_patterns_first_match_in_list_order():
    n0 = "model.layers.2.mlp.experts.0.down_proj.weight"
    n1 = "model.layers.2.mlp.experts.1.down_proj.weight"
    p = Plan(default="q4_k", rules=[{"match": r"re:experts\.0\.", "scheme": "q8_0"},
                                    {"match": "moe:experts", "scheme": "q6_k"}])
    assert (p.scheme_for(n0), p.scheme_for(n1)) == ("q8_0", "q6_k")
    p = Plan(default="q4_k", rules=[{"match": "moe:experts", "scheme": "q6_k"},
                                    {"match": r"re:experts\.0\.", "scheme": "q8_0"}])
    assert (p.scheme_for(n0), p.scheme_for(n1)) == ("q6_k", "q6_k")
    # an exact name beats both; a router skips the pattern and takes the later selector
    p = Plan(default="q4_k", rules=[{"match": r"re:mlp", "scheme": "q8_0"},
                                    {"match": "moe:router@2", "scheme": "fp16"},
                                    {"match": n1, "scheme": "q5_0"}])
    assert p.scheme_for("model.layers.2.mlp.gate.weight") == "fp16"
    assert p.scheme_for("model.layers.3.mlp.gate.weight") == KEEP
    assert (p.scheme_for(n0), p.scheme_for(n1)) == ("q8_0", "q5_0")

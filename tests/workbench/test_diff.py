"""`quant-workbench diff`: two quantizations compared tensor by tensor (workbench.planning.diff)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from workbench.cli import main
from workbench.core.errors import WorkbenchError
from workbench.planning.diff import diff, same_type
from workbench.quant.evaluate import evaluate
from workbench.export import export
from workbench.formats.loaders import open_model
from workbench.quant.plan import Plan
from workbench.core.progress import run

DEMO_PLAN = {"format": "quant-workbench-plan", "version": 1, "default": "q4_k",
             "rules": [{"match": "re:self_attn\\.(q|k)_proj", "scheme": "q8_0"},
                       {"match": "re:mlp\\.down_proj", "scheme": "q6_k"}]}


def _plan(tmp_path, data, name="plan.json"):
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


def test_gguf_export_against_its_plan_matches_names_and_errors(demo_model_path, tmp_path):
    """The workbench's GGUF of a Llama model (llama.cpp names, q/k rows rope-permuted) against
    the plan it was made from: every blk.N.* tensor finds its Hugging Face name, the type is the
    plan's, and the error measured on the GGUF's dequantized weights (after undoing the
    permutation) is the plan's own error."""
    plan_path = _plan(tmp_path, DEMO_PLAN)
    demo = open_model(demo_model_path)
    out = tmp_path / "demo.gguf"
    run(export(demo, Plan.load(plan_path), "gguf", out))
    g = open_model(out)
    assert "blk.0.attn_q.weight" in g.tensors
    res = run(diff(str(out), str(plan_path), str(demo_model_path), check=False))
    rows = {r["name"]: r for r in res["tensors"]}
    ev = run(evaluate(demo, Plan.load(plan_path)))
    q = rows["model.layers.0.self_attn.q_proj.weight"]
    assert q["a"]["name"] == "blk.0.attn_q.weight" and q["a"]["type"] == "Q8_0"
    assert q["b"]["type"] == "q8_0" and q["same_type"]
    checked = 0
    for name, r in rows.items():
        if r["a"] is None or r["b"] is None or demo.info(name).ndim < 2:
            continue
        assert r["same_type"], (name, r["a"]["type"], r["b"]["type"])
        want = ev.tensors[name].error.rel_rmse
        assert r["b"]["rel_rmse"] == pytest.approx(want, rel=1e-9)
        assert r["a"]["rel_rmse"] == pytest.approx(want, rel=1e-5, abs=1e-7), name
        assert r["a"]["bits_per_weight"] == pytest.approx(r["b"]["bits_per_weight"])
        checked += 1
    assert checked >= 10
    assert res["totals"]["a"]["sqnr_db"] == pytest.approx(res["totals"]["b"]["sqnr_db"], abs=0.05)
    assert res["totals"]["only_a"] == 0
    # a wrong inverse permutation would show as an error of order 1
    assert all(r["a"]["rel_rmse"] < 0.2 for r in rows.values()
               if r["a"] and r["a"]["rel_rmse"] is not None)


def test_two_plans_differ_where_the_rules_differ(demo_model_path, tmp_path):
    a = _plan(tmp_path, {"format": "quant-workbench-plan", "version": 1, "default": "q4_0"}, "a.json")
    b = _plan(tmp_path, {"format": "quant-workbench-plan", "version": 1, "default": "q4_0",
                         "rules": [{"match": "re:mlp", "scheme": "q8_0"}]}, "b.json")
    res = run(diff(str(a), str(b), str(demo_model_path), check=False))
    for r in res["tensors"]:
        if ".mlp." in r["name"] and r["name"].endswith("proj.weight"):
            assert (r["a"]["type"], r["b"]["type"]) == ("q4_0", "q8_0")
            assert r["b"]["rel_rmse"] < r["a"]["rel_rmse"] / 4     # 8-bit vs 4-bit
            assert not r["same_type"]
    t = res["totals"]
    assert t["b"]["bytes"] > t["a"]["bytes"] and t["b"]["sqnr_db"] > t["a"]["sqnr_db"]
    assert t["different_type"] == sum(1 for r in res["tensors"]
                                      if ".mlp." in r["name"] and r["name"].endswith("proj.weight"))


def test_compressed_tensors_folder_read_back(tiny_arch, tmp_path):
    pytest.importorskip("compressed_tensors")
    src = tiny_arch("llama")
    model = open_model(src)
    plan = Plan(default="int4-g32", rules=[{"match": "re:mlp", "scheme": "int8-channel"},
                                            {"match": "re:self_attn", "scheme": "int4-g32-asym"},
                                            {"match": "re:embed|lm_head", "scheme": "keep"}])
    out = tmp_path / "ct"
    run(export(model, plan, "compressed-tensors", out))
    plan_path = tmp_path / "p.json"
    plan.save(plan_path)
    res = run(diff(str(out), str(plan_path), str(src), check=False))
    rows = {r["name"]: r for r in res["tensors"]}
    ev = run(evaluate(model, plan))
    n = 0
    for name, r in rows.items():
        if r["a"] and r["b"] and r["b"]["type"] in ("int4-g32", "int8-channel",
                                                    "int4-g32-asym"):
            assert r["a"]["type"] == r["b"]["type"]
            assert r["a"]["rel_rmse"] == pytest.approx(ev.tensors[name].error.rel_rmse, rel=1e-5)
            n += 1
    assert n >= 6
    assert {r["a"]["type"] for r in rows.values() if r["a"]} >= {"int8-channel", "int4-g32-asym"}


def test_cli_json_contract_and_errors(demo_model_path, tmp_path, capsys):
    a = _plan(tmp_path, DEMO_PLAN, "a.json")
    b = _plan(tmp_path, {"format": "quant-workbench-plan", "version": 1, "default": "fp16"},
              "b.json")
    rc = main(["diff", str(a), str(b), "--source", str(demo_model_path), "--no-check", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    t0 = out["tensors"][0]
    assert set(t0) >= {"name", "a", "b"}
    assert set(t0["a"]) >= {"type", "bits_per_weight", "rel_rmse"}
    assert set(out["totals"]) >= {"a", "b"}
    fp16 = [r for r in out["tensors"] if r["b"]["type"] == "fp16"]
    assert fp16 and all(r["b"]["bits_per_weight"] == 16.0 and 0 < r["b"]["rel_rmse"] < 1e-3
                        for r in fp16)
    # a plan without the float model: one line naming the file, exit 2
    rc = main(["diff", str(a), str(b)])
    err = capsys.readouterr().err
    assert rc == 2 and str(a) in err and len(err.strip().splitlines()) == 1
    assert err.strip().endswith("add --source FLOAT")
    import workbench as qw                      # the API says its own parameter
    with pytest.raises(WorkbenchError, match=r"add source=FLOAT$"):
        qw.diff_quantizations(str(a), str(b), check=False)
    rc = main(["diff", str(tmp_path / "nope.gguf"), str(b), "--source", str(demo_model_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "nope.gguf" in err and "not found" in err


def test_same_type_names():
    assert same_type("Q4_K", "q4_k") and same_type("F16", "fp16")
    assert not same_type("Q4_K", "q4_k_m") and not same_type(None, "q4_0")


def test_without_source_files_match_by_name_and_across_naming_schemes(demo_model_path, tmp_path):
    """No float source: two GGUFs match by name; a GGUF (llama.cpp names) and the workbench's
    quantized safetensors (Hugging Face names, config.json beside it) match through llama.cpp's
    name table; no errors without the source."""
    import shutil
    demo = open_model(demo_model_path)
    g8, g4 = tmp_path / "q8.gguf", tmp_path / "q4.gguf"
    run(export(demo, Plan(default="q8_0"), "gguf", g8))
    run(export(demo, Plan(default="q4_0"), "gguf", g4))
    res = run(diff(str(g8), str(g4), check=False))
    rows = {r["name"]: r for r in res["tensors"]}
    q = rows["blk.1.attn_q.weight"]
    assert (q["a"]["type"], q["b"]["type"]) == ("Q8_0", "Q4_0") and q["a"]["rel_rmse"] is None
    assert res["totals"]["only_a"] == res["totals"]["only_b"] == 0
    folder = tmp_path / "st"
    folder.mkdir()
    for f in ("config.json", "tokenizer.json"):
        shutil.copy(demo_model_path.parent / f, folder / f)
    st = folder / "model.safetensors"
    run(export(demo, Plan(default="int4-g64"), "safetensors", st))
    res = run(diff(str(g8), str(st), check=False))
    rows = {r["name"]: r for r in res["tensors"]}
    d = rows["blk.0.ffn_down.weight"]
    assert d["b"]["name"] == "model.layers.0.mlp.down_proj.weight"
    assert (d["a"]["type"], d["b"]["type"]) == ("Q8_0", "int4-g64")
    assert res["totals"]["matched"] == len(demo.tensors)

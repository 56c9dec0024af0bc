"""The model map's data (workbench.planning.model_map) and the `map` command."""

import json
import math

import numpy as np
import pytest

from workbench.cli import main
from workbench.quant.evaluate import evaluate
from workbench.formats.loaders import open_model
from workbench.planning.model_map import (block_totals, colour_range, layout, normalise, plan_bytes_of,
                                 summary)
from workbench.quant.plan import Plan
from workbench.core.progress import run


def test_demo_layout_blocks_in_order_with_roles(demo_model_path):
    m = open_model(demo_model_path)
    blocks = layout(m)
    assert [b.key for b in blocks] == ["embeddings", "layer 0", "layer 1", "layer 2", "head"]
    b0 = blocks[1]
    secs = {s.title: [c.label for c in s.cells] for s in b0.sections}
    assert secs["attention"] == ["q", "k", "v", "o"]
    assert secs["mlp"] == ["gate", "up", "down"]
    assert [s.title for s in b0.sections] == ["attention", "mlp", "norms & biases"]
    # every tensor exactly once
    names = [n for b in blocks for n in b.names]
    assert sorted(names) == sorted(m.tensors)


def test_minilm_layout(minilm):
    blocks = layout(minilm)
    assert blocks[0].key == "embeddings" and len(blocks[0].names) >= 3
    layers = [b for b in blocks if b.index is not None]
    assert [b.index for b in layers] == list(range(6))
    secs = {s.title: [c.label for c in s.cells] for s in layers[0].sections}
    assert secs["attention"] == ["q", "k", "v", "o"]
    assert secs["mlp"] == ["up", "down"]


def test_moe_blocks_show_every_expert(tiny_arch):
    m = open_model(tiny_arch("qwen3_moe"))
    layers = [b for b in layout(m) if b.index is not None]
    secs = {s.title: s for s in layers[0].sections}
    assert "router" in secs
    n_exp = len([n for n in m.tensors if n.startswith("model.layers.0.mlp.experts.")
                 and n.endswith("down_proj.weight")])
    assert n_exp >= 2
    for proj in ("gate", "up", "down"):
        cells = secs[f"experts {proj}"].cells
        assert [c.expert for c in cells] == list(range(n_exp))
        assert all(c.name.endswith(f"{proj}_proj.weight") for c in cells)


def test_block_totals_match_evaluated_bytes(demo_model_path):
    m = open_model(demo_model_path)
    plan = Plan.load(demo_model_path.parents[1] / "demo_plan.json")
    ev = run(evaluate(m, plan))
    bytes_of, _ = plan_bytes_of(m, plan)
    total = 0
    for b in layout(m):
        t = block_totals(b, bytes_of)
        want = sum(ev.tensors[n].bytes for n in b.names)
        assert t.bytes == want
        assert t.params == sum(m.info(n).numel for n in b.names)
        total += t.bytes
    assert total == ev.totals.bytes_after


def test_colour_scale():
    v = np.array([1e-4, 1e-2, np.nan, 1.0])
    lo, hi, log = colour_range(v, "sensitivity")
    assert log and (lo, hi) == (-4.0, 0.0)
    t = normalise(v, lo, hi, log)
    assert t[0] == 0 and t[1] == pytest.approx(0.5) and math.isnan(t[2]) and t[3] == 1
    lo, hi, log = colour_range(np.array([10.0, 30.0, np.inf]), "sqnr")
    assert (lo, hi, log) == (10.0, 30.0, False)
    assert normalise(np.array([np.inf, 20.0]), lo, hi, log).tolist() == [1.0, 0.5]


def test_map_command_json(demo_model_path, capsys):
    plan = demo_model_path.parents[1] / "demo_plan.json"
    assert main(["map", str(demo_model_path), "--plan", str(plan), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    ref = summary(open_model(demo_model_path), Plan.load(plan))
    assert out["totals"] == ref["totals"]
    assert out["values"]["model.embed_tokens.weight"] == pytest.approx(8.5)     # q8_0
    assert out["values"]["model.layers.0.mlp.down_proj.weight"] == pytest.approx(4.5)  # q4_k
    assert [b["key"] for b in out["blocks"]][0] == "embeddings"
    assert main(["map", str(demo_model_path), "--overlay", "kurtosis", "--json"]) == 0
    k = json.loads(capsys.readouterr().out)["values"]
    from workbench.quant.stats import tensor_stats
    m = open_model(demo_model_path)
    want = run(tensor_stats(m, "model.layers.0.self_attn.q_proj.weight")).kurtosis
    assert k["model.layers.0.self_attn.q_proj.weight"] == pytest.approx(want)


def test_the_map_command_is_the_api_call(demo_model_path, capsys):
    import workbench as qw
    from workbench.core.errors import WorkbenchError
    model = qw.open_model(demo_model_path)
    assert main(["map", str(demo_model_path), "--scheme", "q4_0", "--overlay", "sqnr",
                 "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    api = qw.map_model(model, "q4_0", overlay="sqnr", progress=False)
    finite = {n: (v if v is not None and math.isfinite(v) else None)   # JSON: inf is null
              for n, v in api["values"].items()}
    assert {**api, "values": finite} == cli
    name = "model.layers.0.mlp.down_proj.weight"
    r = run(evaluate(model, Plan(default="q4_0"), names=[name])).tensors[name]
    assert api["values"][name] == pytest.approx(r.error.sqnr_db)
    assert api["schemes"][name] == "q4_0" and api["overlay"] == "sqnr"
    default = qw.map_model(model, progress=False)          # the window's default plan
    assert default["schemes"][name] == Plan().resolve(model)[name]
    with pytest.raises(ValueError, match="^overlay "):      # an ArgumentError, before work
        qw.map_model(model, overlay="sensitivity")
    with pytest.raises(WorkbenchError, match="unknown scheme 'bogus'"):
        qw.map_model(model, "bogus")


def test_generated_catalog_for_bench_gui_has_exactly_n_tensors():
    pytest.importorskip("PySide6")
    from app.bench_catalog import make_catalog
    for n in (104, 5000):
        m = make_catalog(n)
        assert len(m.tensors) == n
        blocks = layout(m)
        assert blocks[0].key == "embeddings" and blocks[-1].key == "head"
        assert sum(len(b.names) for b in blocks) == n
        layer = next(b for b in blocks if b.index == 0)
        secs = {s.title: len(s.cells) for s in layer.sections}
        assert secs["experts gate"] == secs["experts up"] == secs["experts down"] >= 1
    a = m.read_matrix("model.layers.0.mlp.experts.0.up_proj.weight")
    assert a.shape == (32, 64) and np.array_equal(
        a, make_catalog(5000).read_matrix("model.layers.0.mlp.experts.0.up_proj.weight"))

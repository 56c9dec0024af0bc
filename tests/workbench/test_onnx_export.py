"""export --format onnx: the traced network runs in ONNX Runtime and computes what the workbench's
own check computes (the transformers model with the plan's dequantized weights)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("transformers")

from workbench.cli import main  # noqa: E402
from workbench.formats.loaders import open_model  # noqa: E402
from workbench.quant.plan import Plan, Rule  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ATTN = r"re:.*self_attn\.(q|k|v|o)_proj\.weight$"


def _plan(tmp_path, scheme, pattern=ATTN, **kw):
    p = tmp_path / f"plan-{scheme}.json"
    p.write_text(Plan(default="keep", rules=[Rule(pattern, scheme)], **kw).to_json())
    return p


def _export(capsys, folder, out, *args):
    rc = main(["export", str(folder), "--format", "onnx", "-o", str(out), "--json", *args])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    return json.loads(cap.out)


def _batch():
    ids = (np.arange(24, dtype=np.int64).reshape(2, 12) * 37 + 5) % 500
    mask = np.ones_like(ids)
    mask[1, 9:] = 0
    return ids, mask


def test_llama_attention_int4_matches_the_workbench_check(tiny_arch, tmp_path, capsys):
    from workbench.export.onnx_check import forward, session
    from workbench.running.runner import Runner
    folder = tiny_arch("llama")
    out = tmp_path / "m.onnx"
    info = _export(capsys, folder, out, "--plan", str(_plan(tmp_path, "int4-g32")),
                   "--accuracy-level", "0")
    assert info["nodes"]["matmulnbits"] == 8            # 2 layers x q/k/v/o
    assert info["opset"] == 17 and info["accuracy_level"] == 0
    proto = onnx.load(str(out))
    nbits = [n for n in proto.graph.node if n.op_type == "MatMulNBits"]
    assert len(nbits) == 8 and all(n.domain == "com.microsoft" for n in nbits)
    attrs = {a.name: a.i for a in nbits[0].attribute}
    assert attrs["bits"] == 4 and attrs["block_size"] == 32 and attrs["accuracy_level"] == 0
    meta = {p.key: p.value for p in proto.metadata_props}
    assert meta["quant_workbench.opset"] == "17"
    assert meta["quant_workbench.onnxruntime"] == __import__("onnxruntime").__version__
    assert json.loads(meta["quant_workbench.plan"])["rules"][0]["scheme"] == "int4-g32"

    model = open_model(str(folder))
    runner = Runner(model)
    ids, mask = _batch()
    base = runner.forward((ids, mask))
    names = [n for n in model.tensors if "self_attn" in n and n.endswith("proj.weight")]
    want = runner.forward((ids, mask), override=_quantized(model, names, "int4-g32"))
    got = forward(session(out), "causal-lm", ids, mask)
    for w, g, b in zip(want, got, base):
        assert g.shape == w.shape
        assert np.abs(g - w).max() < 2e-4               # ORT computes the workbench's weights
        assert np.abs(b - w).max() > 1e-3               # ... which really differ from float


def _quantized(model, names, scheme):
    """The runner's override: `names` dequantized under `scheme`, the rest float."""
    from workbench.quant.streaming import dequantized
    return lambda n: dequantized(model, n, scheme) if n in names else None


def test_bert_encoder_outputs_and_pooled(tiny_arch, tmp_path, capsys):
    from workbench.export.onnx_check import session
    from workbench.running.runner import Runner
    folder = tiny_arch("bert")
    out = tmp_path / "bert.onnx"
    info = _export(capsys, folder, out, "--scheme", "int8-g32-asym", "--accuracy-level", "0")
    # every Linear of the 2 layers (q, k, v, attention.output.dense, intermediate, output)
    assert info["nodes"]["matmulnbits"] == 12 and info["model_kind"] == "encoder"
    sess = session(out)
    ids, mask = _batch()
    h, pooled = sess.run(["last_hidden_state", "pooled"],
                         {"input_ids": ids, "attention_mask": mask})
    model = open_model(str(folder))
    runner = Runner(model)
    names = [n for n in runner.linear_names() if "pooler" not in n]
    want = runner.forward((ids, mask), override=_quantized(model, names, "int8-g32-asym"))
    assert h.shape == (2, 12, 128)
    assert np.abs(pooled - want).max() < 1e-4


def test_w8a8_runs_integer_matmuls(tiny_arch, tmp_path, capsys):
    from workbench.export.onnx_check import optimized_op_counts, session
    folder = tiny_arch("llama")
    out = tmp_path / "w8a8.onnx"
    info = _export(capsys, folder, out, "--scheme", "int8-channel", "--activations", "int8",
                   "--calib", str(ROOT / "resources" / "calibration.txt"))
    assert info["nodes"]["activation_qdq"] == 15        # 2 x 7 projections + lm_head
    assert info["nodes"]["dequantize_linear"] == 15
    ops = optimized_op_counts(out)
    assert ops.get("MatMulIntegerToFloat") == 15        # every Linear an integer matmul
    ids, mask = _batch()
    logits = session(out).run(["logits"], {"input_ids": ids, "attention_mask": mask})[0]
    assert np.isfinite(logits).all()
    meta = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    assert meta["quant_workbench.activations"] == "int8"
    acts = json.loads(meta["quant_workbench.plan"])["activations"]
    assert len(acts) == 15 and all(a["amax"] > 0 for a in acts.values())


def test_unexpressible_schemes_fall_back_or_stay_float(tiny_arch, tmp_path, capsys):
    folder = tiny_arch("llama")
    plan = tmp_path / "mixed.json"
    plan.write_text(Plan(default="keep", rules=[
        Rule(r"re:.*q_proj\.weight$", "q4_k", fallback="int4-g64"),
        Rule(r"re:.*k_proj\.weight$", "int3-g32"),
        Rule(r"re:.*mlp\.down_proj\.weight$", "q4_0"),
        Rule(r"re:.*mlp\.up_proj\.weight$", "q4_1"),
        Rule(r"re:.*mlp\.gate_proj\.weight$", "q8_0"),
        Rule(r"re:.*embed_tokens\.weight$", "int8-channel")]).to_json())
    rc = main(["evaluate", str(folder), "--plan", str(plan), "--target", "onnxruntime", "--json"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    rows = {r["name"]: r for r in json.loads(cap.out)["tensors"]}
    q = rows["model.layers.0.self_attn.q_proj.weight"]
    assert (q["kind"], q["scheme"]) == ("fallback", "int4-g64")
    k = rows["model.layers.0.self_attn.k_proj.weight"]
    assert (k["kind"], k["scheme"]) == ("kept", "keep") and "MatMulNBits" in k["note"]
    emb = rows["model.embed_tokens.weight"]
    assert emb["kind"] == "skipped"
    info = _export(capsys, folder, tmp_path / "mixed.onnx", "--plan", str(plan))
    assert info["nodes"]["matmulnbits"] == 2 * 4        # q (fallback), down, up, gate
    assert info["fallbacks"]["tensors"]["fallback"] == 2


def test_check_runtime_onnxruntime(tiny_arch, tmp_path, capsys):
    folder = tiny_arch("llama")
    saved = tmp_path / "kept.onnx"
    rc = main(["check", str(folder), "--plan", str(_plan(tmp_path, "int8-g32")), "--runtime",
               "onnxruntime", "--samples", "6", "--save-onnx", str(saved), "--json"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    res = json.loads(cap.out)
    assert res["runtime"] == "onnxruntime" and res["accuracy_level"] == 4
    assert res["ort_ops"]["MatMulNBits"] == 8
    assert res["top1_agree"] > 0.9 and 0 <= res["kl_mean"] < 0.05
    assert abs(res["ppl"] / res["ppl_base"] - 1) < 0.05
    assert saved.is_file() and saved.stat().st_size == res["onnx_bytes"]


def test_missing_extra_is_one_line(tiny_arch, tmp_path, capsys, monkeypatch):
    import builtins
    real = builtins.__import__

    def fake(name, *a, **k):
        if name == "onnxruntime" or name.startswith("onnxruntime."):
            raise ImportError("no onnxruntime")
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", fake)
    out = tmp_path / "x.onnx"
    rc = main(["export", str(tiny_arch("llama")), "--scheme", "int4-g32", "--format", "onnx",
               "-o", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and '.[onnx]' in err
    assert not out.exists()


def test_bad_inputs(tiny_arch, tmp_path, capsys):
    folder = tiny_arch("llama")
    rc = main(["export", str(folder), "--scheme", "int4-g32", "--format", "onnx", "--target",
               "vllm", "-o", str(tmp_path / "a.onnx")])
    assert rc == 2 and "--target onnxruntime" in capsys.readouterr().err
    rc = main(["check", str(folder), "--scheme", "int4-g32", "--runtime", "onnxruntime",
               "--target", "llama.cpp"])
    assert rc == 2 and "onnxruntime" in capsys.readouterr().err
    rc = main(["export", str(folder), "--scheme", "int4-g32", "--format", "onnx",
               "-o", str(tmp_path / "missing" / "a.onnx")])
    assert rc == 2 and "output folder does not exist" in capsys.readouterr().err


def test_allocate_for_onnxruntime_picks_only_what_it_can_store(tiny_arch, tmp_path, capsys):
    folder = tiny_arch("llama")
    out = tmp_path / "alloc.json"
    rc = main(["allocate", str(folder), "--budget-bpw", "9", "--schemes",
               "int4-g32,int8-channel,q4_k", "--measure", "weight", "--target", "onnxruntime",
               "-o", str(out), "--json"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    res = json.loads(cap.out)
    assert res["target"] == "onnxruntime" and res["bytes"] <= res["budget_bytes"]
    # q4_k has no MatMulNBits form: it would stay float, so it never pays for its bytes
    assert res["schemes"]["q4_k"] == 0
    assert res["schemes"]["int4-g32"] + res["schemes"]["int8-channel"] == 15

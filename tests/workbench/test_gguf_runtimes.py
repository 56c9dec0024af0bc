"""workbench.quant.runtimes: what llama.cpp / vLLM re-type, llama-quantize's fallbacks, the summary,
--strict; and evaluate / exporters applying the same decisions."""

from __future__ import annotations

import json

import numpy as np
import pytest

from workbench.core.errors import WorkbenchError
from workbench.quant.evaluate import evaluate
from workbench.formats.model import TensorInfo
from workbench.quant.plan import Plan
from workbench.core.progress import run
from workbench.quant.runtimes import (FallbackSummary, check_strict, decide, plan_decisions,
                                summarize)


def info(name, shape, dtype="F32"):
    return TensorInfo(name, tuple(shape), dtype, int(np.prod(shape)) * 4)


# llama-quant.cpp tensor_type_fallback, for a 384-wide row (a multiple of 32, not of 256)
@pytest.mark.parametrize("requested,applied", [
    ("q2_k", "q4_0"), ("q3_k", "q4_0"), ("q4_k", "q5_0"), ("q5_k", "q5_1"), ("q6_k", "q8_0")])
def test_llama_quantize_fallback_table(requested, applied):
    d = decide(info("blk.0.attn_q.weight", (384, 384)), requested, "llama.cpp",
               gguf_name="blk.0.attn_q.weight")
    assert (d.kind, d.applied) == ("fallback", applied)
    assert "384" in d.note and applied in d.note


def test_fallback_to_f16_when_the_row_is_not_a_multiple_of_32():
    # 48 % 256 and 48 % 32 are both nonzero: llama-quantize "must use F16 due to unusual shape"
    for req in ("q4_k", "q8_0"):
        d = decide(info("blk.0.ffn_up.weight", (64, 48)), req, "llama.cpp",
                   gguf_name="blk.0.ffn_up.weight")
        assert (d.kind, d.applied) == ("fallback", "fp16")


def test_never_retyped_rule_is_skipped_default_is_kept():
    tt = info("embeddings.token_type_embeddings.weight", (2, 384))
    d = decide(tt, "q8_0", "llama.cpp", gguf_name="token_types.weight", explicit=True)
    assert (d.kind, d.applied) == ("skipped", "keep") and "token_types" in d.note
    d = decide(tt, "q8_0", "llama.cpp", gguf_name="token_types.weight", explicit=False)
    assert (d.kind, d.applied) == ("kept", "keep")
    norm = info("blk.0.attn_norm.weight", (384,))
    assert decide(norm, "q4_0", "llama.cpp", gguf_name="blk.0.attn_norm.weight").kind == "skipped"
    # the workbench's own safetensors ('any') quantizes what a rule asks
    assert decide(tt, "q8_0", "any").kind == "ok"


def test_plan_fallback_wins_and_round_trips():
    plan = Plan(default="q4_k", fallback="q8_0",
                rules=[{"match": "re:v_proj", "scheme": "q6_k", "fallback": "q4_0"}])
    again = Plan.from_json(plan.to_json())
    assert again == plan and again.fallback == "q8_0"
    assert json.loads(plan.to_json())["rules"][0]["fallback"] == "q4_0"
    assert again.fallback_for("model.layers.0.self_attn.v_proj.weight") == "q4_0"
    assert again.fallback_for("model.layers.0.self_attn.q_proj.weight") == "q8_0"
    d = decide(info("x.weight", (8, 384)), "q4_k", "llama.cpp", fallback="q8_0")
    assert (d.kind, d.applied) == ("fallback", "q8_0")
    # a plan fallback that does not fit either: the runtime's own rule follows
    d = decide(info("x.weight", (8, 384)), "q4_k", "llama.cpp", fallback="q6_k")
    assert d.applied == "q5_0"


def test_scheme_without_llama_type_is_an_error():
    with pytest.raises(WorkbenchError, match="int4-g128"):
        decide(info("x.weight", (8, 256)), "int4-g128", "llama.cpp")


def test_summary_counts_shares_and_line():
    ds = [decide(info("a.weight", (10, 384)), "q4_k", "llama.cpp"),       # -> q5_0
          decide(info("b.weight", (30, 512)), "q4_k", "llama.cpp"),       # ok
          decide(info("c.bias", (384,)), "q4_k", "llama.cpp", gguf_name="c.bias")]  # skipped
    s = summarize(ds)
    assert isinstance(s, FallbackSummary)
    assert s.tensors == {"ok": 1, "fallback": 1, "kept": 0, "skipped": 1}
    assert s.share("fallback") == pytest.approx(3840 / (3840 + 15360 + 384))
    assert s.moves == {"q4_k->q5_0": 1}
    assert "1 tensors fell back" in str(s) and "q4_k->q5_0 x1" in str(s)
    with pytest.raises(WorkbenchError, match="strict=True"):
        check_strict(ds)
    check_strict([ds[1]])  # nothing to complain about


def test_evaluate_q4_k_minilm_falls_back_not_silently_kept(minilm):
    ev = run(evaluate(minilm, Plan(default="q4_k"), cache=None))
    matrices = [r for r in ev.tensors.values() if len(r.shape) == 2 and r.requested == "q4_k"]
    kept = [r.name for r in matrices if r.scheme == "keep"]
    assert kept == []                                     # before: 35 of 41 kept in F32
    fell = [r for r in matrices if r.scheme == "q5_0"]
    assert len(fell) > 30 and all(r.note and "q5_0" in r.note for r in fell)
    d = ev.to_dict()["fallbacks"]
    assert d["fallbacks"]["q4_k->q5_0"] == len(fell)
    assert ev.totals.bits_per_weight < 6.0
    with pytest.raises(WorkbenchError, match="strict=True"):
        run(evaluate(minilm, Plan(default="q4_k"), cache=None, strict=True))


def test_minilm_q8_0_strict_is_fine_for_llama_cpp(minilm):
    # the default reaching position/token-type embeddings is what llama-quantize does too
    ds = plan_decisions(minilm, Plan(default="q8_0"), "llama.cpp")
    assert ds["embeddings.token_type_embeddings.weight"].applied == "keep"
    check_strict(ds.values())
    ds = plan_decisions(minilm, Plan(default="q8_0", rules=[
        {"match": "embeddings.token_type_embeddings.weight", "scheme": "q8_0"}]), "llama.cpp")
    assert ds["embeddings.token_type_embeddings.weight"].kind == "skipped"
    with pytest.raises(WorkbenchError, match="token_types"):
        check_strict(ds.values())


def test_unsupported_architecture_is_refused_naming_the_converter(make_safetensors, tmp_path):
    # a folder whose config.json names an architecture the exporter does not convert: nothing
    # is written (an existing file stays as it was), and the message names the way through
    from workbench.export import export
    from workbench.formats.loaders import open_model
    path = make_safetensors({"encoder.block.0.layer.0.SelfAttention.q.weight":
                             np.ones((32, 64), np.float32)})
    (path.parent / "config.json").write_text(json.dumps(
        {"architectures": ["T5ForConditionalGeneration"], "model_type": "t5"}))
    out = tmp_path / "t5.gguf"
    out.write_bytes(b"user's file")
    with pytest.raises(WorkbenchError) as exc:
        run(export(open_model(path), Plan(default="q8_0"), "gguf", out))
    msg = str(exc.value)
    assert "T5ForConditionalGeneration" in msg and "convert_hf_to_gguf.py" in msg
    assert "--format gguf" in msg and "\n" not in msg
    assert out.read_bytes() == b"user's file"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    from workbench.export.preflight import check
    p = check(open_model(path), Plan(default="q8_0"), "gguf")
    assert not p.ok and "convert_hf_to_gguf.py" in p.reason


def test_unsupported_architecture_cli_exit_2(make_safetensors, tmp_path, capsys):
    from workbench.cli import main
    path = make_safetensors({"model.layers.0.mlp.experts.gate_up_proj":
                             np.ones((2, 64, 32), np.float32)})
    (path.parent / "config.json").write_text(json.dumps(
        {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss"}))
    (path.parent / "tokenizer.json").write_text("{}")
    out = tmp_path / "o.gguf"
    assert main(["export", str(path), "--scheme", "q4_k", "--format", "gguf", "-o",
                 str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "GptOssForCausalLM" in err[0] and "convert_hf_to_gguf" in err[0]
    assert not out.exists()
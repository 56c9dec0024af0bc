"""Issue 25 B: a uniform --scheme plan follows the target runtime's own convention for the
embeddings and the output head (llama-quantize's output / tied token_embd types; vLLM and ONNX
Runtime keep the embeddings float), unless a rule names the tensor or --quantize-all."""

from __future__ import annotations

import json

import pytest

from workbench.cli import main
from workbench.planning.conventions import apply, convention, llama_output_type
from workbench.formats.loaders import open_model
from workbench.quant.plan import Plan, Rule
from workbench.quant.runtimes import plan_decisions

WORD = "embeddings.word_embeddings.weight"


def applied(model, plan, runtime):
    return {n: d.applied for n, d in plan_decisions(model, plan, runtime).items()}


def test_llama_output_type_follows_llama_quant():
    # row a multiple of the default's block: Q6_K (unless the default is Q8_0)
    assert llama_output_type("q4_k", 4096) == "q6_k"
    assert llama_output_type("q4_0", 4096) == "q6_k"
    assert llama_output_type("q8_0", 4096) == "q8_0"
    # not a multiple of the default's block: Q8_0
    assert llama_output_type("q4_k", 384) == "q8_0"
    # a multiple of 32 but not of 256: Q6_K, then tensor_type_fallback Q6_K -> Q8_0
    assert llama_output_type("q4_0", 384) == "q8_0"


@pytest.mark.parametrize("scheme", ["q4_k", "q4_0", "q2_k"])
def test_minilm_llama_keeps_tied_embeddings_at_q8_0(minilm, scheme):
    plan, conv = apply(Plan(default=scheme), minilm, scheme, "llama.cpp")
    a = applied(minilm, plan, "llama.cpp")
    assert conv.rules == {WORD: "q8_0"}
    assert a[WORD] == "q8_0"
    assert a["encoder.layer.0.attention.self.query.weight"] != "keep"
    assert a["embeddings.position_embeddings.weight"] == "keep"   # never re-typed anyway
    assert WORD in conv.line() and "Q8_0" in conv.line() and "--quantize-all" in conv.line()
    # without the convention (--quantize-all / target any) the word embeddings are quantized
    plain = applied(minilm, Plan(default=scheme), "llama.cpp")[WORD]
    assert plain not in ("q8_0", "keep")


def test_nothing_for_float_or_q8_0_defaults(minilm):
    for s in ("fp16", "bf16", "q8_0"):
        assert convention(minilm, s, "llama.cpp").rules == {}
    assert convention(minilm, "q4_k", "any").why == {}


def test_vllm_and_onnxruntime_keep_embeddings(minilm):
    for rt in ("vllm", "onnxruntime"):
        plan, conv = apply(Plan(default="int4-g128"), minilm, "int4-g128", rt)
        a = applied(minilm, plan, rt)
        embs = [n for n in minilm.tensors if minilm.info(n).role == "embedding"]
        assert len(embs) == 3 and all(a[n] == "keep" for n in embs)
        assert set(conv.why) == set(embs) and conv.rules == {}
        assert a["encoder.layer.0.attention.self.query.weight"] == "int4-g128"


def test_untied_output_takes_q6_k_and_token_embd_the_default(tiny_arch):
    m = open_model(tiny_arch("llama"))          # hidden 256, its own lm_head (output.weight)
    plan, conv = apply(Plan(default="q4_k"), m, "q4_k", "llama.cpp")
    assert conv.rules == {"lm_head.weight": "q6_k"}
    a = applied(m, plan, "llama.cpp")
    assert a["lm_head.weight"] == "q6_k" and a["model.embed_tokens.weight"] == "q4_k"
    assert applied(m, apply(Plan(default="q8_0"), m, "q8_0", "llama.cpp")[0],
                   "llama.cpp")["lm_head.weight"] == "q8_0"
    # onnxruntime quantizes the head (a MatMul), as its own quantizer does
    plan, conv = apply(Plan(default="int4-g32"), m, "int4-g32", "onnxruntime")
    assert applied(m, plan, "onnxruntime")["lm_head.weight"] == "int4-g32"
    assert "lm_head.weight" not in conv.why


def test_a_rule_naming_the_tensor_wins(minilm):
    plan = Plan(default="q4_k", rules=[Rule(WORD, "q4_0")])
    plan, conv = apply(plan, minilm, "q4_k", "llama.cpp")
    assert conv.rules == {} and conv.line() == ""
    assert applied(minilm, plan, "llama.cpp")[WORD] == "q4_0"


def test_cli_says_it_and_quantize_all_turns_it_off(minilm_path, capsys):
    args = ["export", str(minilm_path), "--scheme", "q4_k", "--format", "gguf", "--check"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert err.count("convention: llama.cpp convention for --scheme q4_k") == 1 and WORD in err
    assert main(args + ["--quantize-all"]) == 0
    assert "convention" not in capsys.readouterr().err


def test_evaluate_json_reports_the_convention(tiny_arch, capsys):
    folder = tiny_arch("llama")
    assert main(["evaluate", str(folder), "--scheme", "q4_0", "--target", "llama.cpp",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    t = {r["name"]: r for r in out["tensors"]}
    assert out["convention"]["rules"] == {"lm_head.weight": "q6_k"}
    assert t["lm_head.weight"]["scheme"] == "q6_k"
    assert t["model.layers.0.mlp.down_proj.weight"]["scheme"] == "q4_0"
    assert main(["evaluate", str(folder), "--scheme", "q4_0", "--target", "llama.cpp",
                 "--quantize-all", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    t = {r["name"]: r for r in out["tensors"]}
    assert "convention" not in out and t["lm_head.weight"]["scheme"] == "q4_0"

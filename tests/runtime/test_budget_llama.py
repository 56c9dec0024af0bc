"""Issue 25 against the real llama.cpp: a uniform --scheme plan types the output head and the
tied token embeddings as llama-quantize does, and `allocate --budget-of` a GGUF that
llama-quantize wrote gives a plan whose GGUF is no bigger, that llama.cpp runs, and whose
embeddings are closer to the float model's than the uniform file's of the same size."""

from __future__ import annotations

import json

import numpy as np
import pytest

from workbench.cli import main
from workbench.planning.conventions import apply
from workbench.export import export
from workbench.formats.llama_names import gguf_names
from workbench.formats.loaders import open_model
from workbench.quant.plan import Plan
from workbench.core.progress import run
from workbench.quant.runtimes import plan_decisions

from .conftest import ROOT, THREADS, llama_embeddings, run_tool
from .test_recipes_llama import dry_run_types


def _f32(model, tmp_path_factory, which):
    path = tmp_path_factory.getbasetemp() / f"conv-{which}-f32.gguf"
    if not path.exists():
        run(export(model, Plan(default="fp32"), "gguf", path))
    return path


@pytest.mark.parametrize("which", ["demo", "minilm"])
@pytest.mark.parametrize("ftype,scheme", [("Q4_0", "q4_0"), ("Q8_0", "q8_0"), ("Q5_1", "q5_1")])
def test_uniform_plan_types_heads_as_llama_quantize(llama_bin, minilm_folder, tmp_path_factory,
                                                    which, ftype, scheme):
    folder = ROOT / "resources" / "demo_model" if which == "demo" else minilm_folder
    model = open_model(folder)
    real = dry_run_types(llama_bin, _f32(model, tmp_path_factory, which), ftype)
    plan, conv = apply(Plan(default=scheme), model, scheme, "llama.cpp")
    names = gguf_names(model)
    ours = {names[n]: d.applied for n, d in plan_decisions(model, plan, "llama.cpp").items()
            if names.get(n) in ("output.weight", "token_embd.weight")}
    assert ours, names
    for g, applied in ours.items():
        assert applied == real[g], (g, applied, real[g], conv.line())
    if which == "demo" and scheme == "q4_0":      # untied head: Q6_K, token_embd the default
        assert ours == {"output.weight": "q6_k", "token_embd.weight": "q4_0"}
    if which == "minilm" and scheme == "q4_0":    # tied (no output.weight): Q8_0
        assert ours == {"token_embd.weight": "q8_0"}


def test_budget_of_a_llama_quantize_file(llama_bin, minilm_folder, tmp_path, tmp_path_factory,
                                         sentences, minilm_reference, capsys):
    model = open_model(minilm_folder)
    q40 = tmp_path / "minilm-Q4_0.gguf"
    run_tool(llama_bin, "llama-quantize", _f32(model, tmp_path_factory, "minilm"), q40, "Q4_0",
             THREADS)
    plan = tmp_path / "plan.json"
    assert main(["allocate", str(minilm_folder), "--budget-of", str(q40), "--measure", "weight",
                 "--schemes", "q4_0,q4_1,q5_0,q5_1,q8_0", "-o", str(plan), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["budget"]["kind"] == "file" and out["target"] == "llama.cpp"
    mine = tmp_path / "minilm-alloc.gguf"
    assert main(["export", str(minilm_folder), "--plan", str(plan), "--format", "gguf", "-o",
                 str(mine)]) == 0
    capsys.readouterr()
    size, budget = mine.stat().st_size, q40.stat().st_size
    assert size == out["accounting"]["file_bytes"]["bytes"] and size <= budget
    assert size > 0.99 * budget

    def cos(path):
        e = llama_embeddings(llama_bin, path, sentences[1])
        return float(np.mean(np.sum(e * minilm_reference, axis=1)))
    c_uniform, c_alloc = cos(q40), cos(mine)
    print(f"\nsame GGUF size ({budget:,d} / {size:,d} bytes): llama-quantize Q4_0 cosine "
          f"{c_uniform:.5f}, allocated {c_alloc:.5f}")
    assert c_alloc > c_uniform

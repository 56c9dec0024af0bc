"""Issue 21's defaults, on the small demo model: the candidates a target can run, the measure
the inputs allow (said on stderr and in JSON), vLLM's fused groups as one decision, the
refusal of a budget below the smallest plan, and the export notes summarized per kind."""

from __future__ import annotations

import json
import shutil

import pytest

from workbench.cli import main
from workbench.formats.loaders import open_model
from workbench.quant.runtimes import (LLAMA_TYPES, RUNTIMES, candidate_schemes, fused_groups,
                                get_runtime, note_kinds)
from workbench.planning.sensitivity import best_measure


def test_candidates_are_what_each_runtime_runs():
    assert set(candidate_schemes("llama.cpp")) == LLAMA_TYPES - {"fp32"}   # lattices cut per budget
    vllm = candidate_schemes("vllm")
    assert "fp8-e4m3" in vllm and "int4-g128-asym" in vllm and "int8-channel" in vllm
    assert not [s for s in vllm if s.startswith(("q", "int2", "int3", "int5", "nf4", "fp16"))]
    for rt in ("llama.cpp", "vllm"):
        assert all(get_runtime(rt).unsupported(s) is None for s in candidate_schemes(rt))
    # "any": every runtime's candidates but MLX's (only the MLX export writes those)
    union = [s for r in RUNTIMES if r not in ("any", "mlx") for s in candidate_schemes(r)]
    assert set(candidate_schemes("any")) == set(union)
    assert not [s for s in candidate_schemes("any") if s.startswith("mlx-")]
    assert candidate_schemes("mlx") and all(s.startswith("mlx-") for s in candidate_schemes("mlx"))
    assert len(candidate_schemes("any")) == len(set(union))          # no duplicates


def test_fused_groups_only_for_vllm():
    names = [f"encoder.layer.{i}.attention.self.{x}.weight" for i in range(2)
             for x in ("query", "key", "value")] + ["model.layers.0.mlp.gate_proj.weight",
                                                     "model.layers.0.mlp.up_proj.weight",
                                                     "model.layers.0.mlp.down_proj.weight"]
    g = fused_groups(names, "vllm")
    assert sorted(map(tuple, g)) == sorted([
        tuple(f"encoder.layer.{i}.attention.self.{x}.weight" for x in ("query", "key", "value"))
        for i in range(2)] + [("model.layers.0.mlp.gate_proj.weight",
                               "model.layers.0.mlp.up_proj.weight")])
    assert fused_groups(names, "llama.cpp") == [] and fused_groups(names, "any") == []


def test_best_measure_follows_the_inputs(demo_model_path, tmp_path):
    m = open_model(demo_model_path)
    assert best_measure(m)[0] == "fisher"
    assert best_measure(m, imatrix="x.gguf")[0] == "activation"
    bare = tmp_path / "model.safetensors"
    shutil.copy(demo_model_path, bare)                 # no config.json: not runnable
    measure, why = best_measure(open_model(bare))
    assert measure == "weight" and "not runnable" in why and "config.json" in why


def test_default_measure_is_said_on_stderr_and_in_json(demo_model_path, tmp_path, capsys):
    bare = tmp_path / "model.safetensors"
    shutil.copy(demo_model_path, bare)
    out = tmp_path / "plan.json"
    assert main(["allocate", str(bare), "--budget-bpw", "6", "--schemes", "q4_0,q8_0",
                 "-o", str(out), "--json"]) == 0
    cap = capsys.readouterr()
    res = json.loads(cap.out)
    assert res["measure"] == "weight" and res["measure_reason"].startswith("the model is not")
    assert res["candidates"] == ["q4_0", "q8_0"] and res["bits_per_weight"] <= 6.0
    assert cap.err.startswith("measure: weight (the model is not runnable")
    # an explicit measure is taken as given and not announced
    assert main(["allocate", str(bare), "--budget-bpw", "6", "--schemes", "q4_0,q8_0",
                 "--measure", "weight", "-o", str(out), "--json"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["measure_reason"] == "given" and "measure:" not in cap.err


def test_help_states_the_defaults(capsys):
    for cmd in ("allocate", "frontier"):
        with pytest.raises(SystemExit):
            main([cmd, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "auto (the default): fisher when the model is runnable" in text
        assert "default: every scheme the --target runtime can run and export" in text


def test_budget_below_the_smallest_plan_names_it_and_what_reaches_it(demo_model_path,
                                                                      tmp_path, capsys):
    bare = tmp_path / "model.safetensors"
    shutil.copy(demo_model_path, bare)
    rc = main(["allocate", str(bare), "--budget-bpw", "5", "--schemes", "q8_0",
               "-o", str(tmp_path / "p.json")])
    err = capsys.readouterr().err
    # refused from the shapes alone, before any measure runs: one line, no "measure:" line
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "measure:" not in err
    line = err.strip().splitlines()[-1]
    assert "is below the smallest plan the candidates allow" in line and "q8_0" in line
    # schemes the target runs whose uniform plan fits 5 bits/weight are named, with their size
    reach = line.split("candidates that reach the budget as a uniform plan: ")[1]
    named = [p.split(" (")[0] for p in reach.split(", ")]
    assert {"q4_0", "q4_k", "int4-g128"} <= set(named) and "q6_k" not in named
    assert not (tmp_path / "p.json").exists()
    # the same figures as the measured table's refusal
    from workbench.planning.sensitivity import sensitivity_table
    from workbench.planning.sizes import size_floor
    m = open_model(bare)
    t = sensitivity_table(m, ["q8_0"], "weight")
    budget = t.budget_bytes(None, 5.0)
    with pytest.raises(Exception) as exc:
        t.solve(budget)
    assert str(exc.value).split(": ", 1)[1] == line.split("error: ", 1)[1].split(": ", 1)[1]
    assert size_floor(m, ["q8_0"])[0] == t.fixed_bytes + sum(
        min(t.bytes[(n, s)] for s in ("keep", "q8_0")) for n in t.names)


def test_notes_are_grouped_by_kind():
    notes = {f"encoder.layer.{i}.x.weight": "q4_k needs the row length (innermost dimension) "
             "to be a multiple of 256, got 384: q5_0 instead" for i in range(5)}
    notes["blk.0.attn_norm.weight"] = "llama.cpp never re-types blk.0.attn_norm.weight"
    notes["blk.1.attn_norm.weight"] = "llama.cpp never re-types blk.1.attn_norm.weight"
    kinds = note_kinds(notes)
    assert [len(n) for _, n in kinds] == [5, 2]
    assert kinds[1][0] == "llama.cpp never re-types <tensor>"


def test_export_prints_one_line_per_kind_of_note(minilm_path, tmp_path, capsys):
    out = tmp_path / "m.gguf"
    assert main(["export", str(minilm_path), "--scheme", "q4_k", "--format", "gguf",
                 "-o", str(out)]) == 0
    # 30 projections fall back (384-wide rows); the word embeddings are not among them: llama.cpp's
    # convention types them Q8_0 (issue 25), said once on its own line
    lines = capsys.readouterr().err.splitlines()
    err = [x for x in lines if x.startswith("note:")]
    assert len(err) == 2 and err[0].startswith("note: 30 tensors (e.g. ")
    assert "q5_0 instead" in err[0] and "--verbose" in err[1]
    assert sum(x.startswith("convention: ") for x in lines) == 1
    assert main(["export", str(minilm_path), "--scheme", "q4_k", "--format", "gguf",
                 "-o", str(out), "--verbose"]) == 0
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("note:")]
    assert len(err) == 30


def test_the_solution_does_not_depend_on_the_machines_speed(monkeypatch):
    """The exact merge is bounded by counts, not wall time: a clock that jumps a minute at every
    reading (a machine that is busy) gives the same choice, exact."""
    import itertools
    import numpy as np
    from workbench.planning import allocate as A
    rng = np.random.default_rng(3)
    costs = [sorted(rng.integers(10, 200, 6).tolist()) for _ in range(60)]
    errors = [sorted(rng.random(6).tolist(), reverse=True) for _ in range(60)]
    budget = int(sum(c[2] for c in costs))
    quiet = A.solve_detailed(costs, errors, budget)
    ticks = itertools.count()
    monkeypatch.setattr(A.time, "perf_counter", lambda: 60.0 * next(ticks))
    busy = A.solve_detailed(costs, errors, budget)
    assert busy.choice == quiet.choice and busy.exact == quiet.exact
    assert quiet.exact


def test_default_candidates_leave_out_schemes_far_below_the_budget(demo_model_path, tmp_path,
                                                                   capsys):
    import workbench as qw
    from workbench.planning.sizes import GAP_BITS, budget_candidates
    from workbench.quant.runtimes import candidate_schemes
    model = qw.open_model(demo_model_path)
    every = candidate_schemes("llama.cpp")
    said = []
    kept = budget_candidates(model, every, qw.Budget.bits_per_weight(6.0), "llama.cpp", None,
                             said.append)
    from workbench.schemes import get_scheme
    low = [s for s in every if get_scheme(s).bits_per_weight() < 6.0 - GAP_BITS]
    assert GAP_BITS == 2.0 and {"q2_k", "q3_k", "tq1_0", "tq2_0"} <= set(low)   # 3.44 and under
    assert kept == [s for s in every if s not in low] and "q4_k" in kept and "iq4_xs" in kept
    assert len(said) == 1 and f"{len(low)} schemes" in said[0] and "tq1_0" in said[0]
    # a low budget keeps every one (IQ1_S's 1.5625 + 1 is above 2.0); so does a cut that would
    # leave the budget out of reach
    assert budget_candidates(model, every, qw.Budget.bits_per_weight(2.0), "llama.cpp") == every
    assert budget_candidates(model, ["tq1_0", "q8_0"], qw.Budget.bits_per_weight(4.5),
                             "llama.cpp") == ["tq1_0", "q8_0"]
    # allocate: the default candidates are cut, a list the user names is not
    lines = []
    a = qw.allocate_plan(model, qw.Budget.bits_per_weight(6.0), measure="weight", methods="rtn",
                         target="llama.cpp", say=lines.append)
    assert "tq1_0" not in a.candidates and "q4_k" in a.candidates
    assert any(x.startswith(f"candidates: {len(low)} schemes") for x in lines)
    b = qw.allocate_plan(model, qw.Budget.bits_per_weight(6.0), measure="weight", methods="rtn",
                         target="llama.cpp", schemes="tq1_0,q4_k,q8_0")
    assert b.candidates == ["tq1_0", "q4_k", "q8_0"]
    assert main(["allocate", str(demo_model_path), "--budget-bpw", "6", "--target", "llama.cpp",
                 "--measure", "weight", "--methods", "rtn", "-o", str(tmp_path / "p.json"),
                 "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["candidates"] == a.candidates
    assert f"candidates: {len(low)} schemes" in out.err

"""One source for each sensitivity measure's facts: workbench.planning.measures. The API's
choices, the CLI's --measure, the app's menu and tooltips, the tables' units and the refusals
all read the registry, and a measure added there appears in each of them."""

from __future__ import annotations

import argparse

import pytest

from workbench.core.errors import WorkbenchError
from workbench.planning import measures
from workbench.planning.measures import Measure, get_measure, list_measures, measure_names


def test_the_measures_and_their_needs():
    assert measure_names() == ("weight", "activation", "fisher", "output")
    facts = {m.name: (m.needs_model, m.reads_calibration, m.takes_imatrix, m.output_units,
                      m.measured) for m in list_measures()}
    assert facts == {"weight": (False, False, False, False, False),
                     "activation": (False, True, True, False, False),
                     "fisher": (True, True, False, True, False),
                     "output": (True, True, False, True, True)}
    assert get_measure("fisher").units(causal=True) == "KL nats/token (estimated)"
    assert get_measure("output").units(causal=False) == "1 - cosine"
    assert get_measure("weight").units(causal=True) == "squared weight error"
    with pytest.raises(WorkbenchError, match="unknown measure 'hessian' \\(choose from weight, "
                                             "activation, fisher, output\\)"):
        get_measure("hessian")


def test_every_list_reads_the_registry():
    from workbench.api import args
    from workbench.api.choices import MEASURES
    from workbench.planning.sensitivity import MEASURES as table_measures
    assert MEASURES == table_measures == measure_names()
    assert args._measures() == ["auto", *measure_names()]
    from workbench.cli.commands import sensitivity
    p = argparse.ArgumentParser()
    sensitivity.add_table_args(p, sensitivity.AUTO)
    choice = next(a for a in p._actions if a.dest == "measure")
    assert list(choice.choices) == ["auto", *measure_names()]


def test_a_measure_added_appears_everywhere(monkeypatch):
    monkeypatch.setitem(measures._REGISTRY, "hessian", Measure(
        "hessian", "second-order weight error", "the Hessian's diagonal times the error",
        needs_model=True, reads_calibration=True, output_units=True))
    from workbench.api import args
    from workbench.planning.sensitivity import predicted_unit
    assert "hessian" in args._measures()
    assert "hessian" in measure_names()
    assert str(get_measure("hessian").refusal(None, "x.imatrix")) == (
        "measure='hessian' runs the calibration inputs: give calib=, not imatrix=")
    assert get_measure("activation").refusal(None, "x.imatrix") is None
    # units: not an output measure on a model that does not run
    assert predicted_unit(object(), "weight") == "sensitivity"


def test_the_api_refuses_an_imatrix_for_a_network_measure(demo_model_path, monkeypatch):
    import workbench as qw
    from workbench import api
    monkeypatch.setattr(api, "_check_inputs", lambda *a, **k: None)   # the file's own checks
    model = qw.open_model(demo_model_path)
    with pytest.raises(WorkbenchError, match="^measure='fisher' runs the calibration inputs: "
                                             "give calib=, not imatrix=$"):
        qw.measure_sensitivity(model, "q4_0", measure="fisher", imatrix="x.imatrix")


def test_the_cli_names_its_flags_in_the_refusal(demo_model_path, tmp_path, capsys, monkeypatch):
    from workbench import api
    from workbench.cli import main
    monkeypatch.setattr(api, "_check_inputs", lambda *a, **k: None)   # the file's own checks
    imatrix = tmp_path / "x.imatrix"
    imatrix.write_bytes(b"not read: the measure refuses it first")
    assert main(["sensitivity", str(demo_model_path), "--measure", "fisher", "--schemes",
                 "q4_0", "--imatrix", str(imatrix)]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "--measure fisher runs the calibration inputs: give --calib, not --imatrix")


# ---- a measure added in one place: its Measure entry and its values job, nothing else --------
def _worst_case_values(inp):
    """Job: a toy measure, the largest absolute weight error times the tensor's size."""
    from workbench.core.progress import Progress
    from workbench.quant.evaluate import evaluate_tensor
    from workbench.quant.runtimes import decide
    out = {}
    names = [n for n in inp.model.tensors
             if inp.model.info(n).ndim >= 2 and inp.model.info(n).is_float]
    for i, n in enumerate(names):
        yield Progress(i, len(names), f"worst case {n}")
        info = inp.model.info(n)
        for s in inp.schemes:
            r = evaluate_tensor(inp.model, n, s, decision=decide(info, s, inp.runtime))
            out[(n, s)] = float(r.error.max_abs_err) * r.params
    return out, 0.0


@pytest.fixture
def worst_case(monkeypatch):
    monkeypatch.setitem(measures._REGISTRY, "worst-case", Measure(
        "worst-case", "max |dW| x params", "the largest weight error times the tensor's size",
        values=_worst_case_values))
    return "worst-case"


def test_a_toy_measure_runs_end_to_end(demo_model_path, worst_case):
    import workbench as qw
    from workbench.quant.evaluate import evaluate_tensor
    model = qw.open_model(demo_model_path)
    table = qw.measure_sensitivity(model, "q4_0,q8_0", measure=worst_case)
    assert table.measure == worst_case and table.measure_reason == "given"
    name = table.names[0]
    for s in ("q4_0", "q8_0"):
        r = evaluate_tensor(model, name, s)
        assert table.value(name, s) == pytest.approx(float(r.error.max_abs_err) * r.params)
    assert all(table.value(n, "q8_0") < table.value(n, "q4_0") for n in table.names)
    seen = []
    alloc = qw.allocate_plan(model, qw.Budget.bits_per_weight(6.0), schemes="q4_0,q8_0",
                             measure=worst_case, methods="rtn", say=seen.append,
                             estimate=True, progress=False)
    assert alloc.measure == worst_case
    chosen = table.assignment_of(alloc.plan, model)
    assert alloc.solution.error == pytest.approx(table.predicted(chosen))
    assert alloc.evaluation.totals.bits_per_weight <= 6.0
    counts = {s: list(chosen.values()).count(s) for s in ("q4_0", "q8_0")}
    assert counts["q4_0"] and counts["q8_0"]          # the budget makes it mix the two
    assert any(line.startswith("allocate: expected: about") for line in seen)   # default cost


def test_the_cli_offers_a_measure_added(demo_model_path, worst_case, capsys):
    import json
    from workbench.cli import main
    assert main(["sensitivity", str(demo_model_path), "--measure", worst_case,
                 "--schemes", "q4_0", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["measure"] == worst_case and doc["tensors"]


def test_the_automatic_choice_reads_the_ranks(demo_model_path, monkeypatch):
    from workbench.formats.loaders import open_model
    from workbench.planning.sensitivity import best_measure
    model = open_model(demo_model_path)
    monkeypatch.setitem(measures._REGISTRY, "worst-case", Measure(
        "worst-case", "max |dW| x params", "a toy", values=_worst_case_values, auto_rank=9))
    assert best_measure(model) == ("worst-case", "it reads the weights alone")
    monkeypatch.setitem(measures._REGISTRY, "worst-case", Measure(
        "worst-case", "max |dW| x params", "a toy", values=_worst_case_values))
    assert best_measure(model, imatrix="x.imatrix") == ("activation", "an imatrix was given")

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
    assert get_measure("hessian").refusal(None, "x.imatrix") == (
        "--measure hessian runs the calibration inputs: give --calib, not --imatrix")
    assert get_measure("activation").refusal(None, "x.imatrix") is None
    # units: not an output measure on a model that does not run
    assert predicted_unit(object(), "weight") == "sensitivity"


def test_the_api_refuses_an_imatrix_for_a_network_measure(demo_model_path, monkeypatch):
    import workbench as qw
    from workbench import api
    monkeypatch.setattr(api, "_check_inputs", lambda *a, **k: None)   # the file's own checks
    model = qw.open_model(demo_model_path)
    with pytest.raises(WorkbenchError, match="--measure fisher runs the calibration inputs"):
        qw.measure_sensitivity(model, "q4_0", measure="fisher", imatrix="x.imatrix")

"""The lattice i-quants (runtimes.LOW_BIT_ONLY) join allocate's "auto" candidates only when the
budget's mean bits/weight is below their own + 1: a 4+ bits/weight allocation keeps its
candidate list (and so its time), a 2.5 bits/weight one can use IQ2_XXS."""

from __future__ import annotations

import pytest

from workbench import api
from workbench.formats.loaders import open_model
from workbench.planning.budget import Budget
from workbench.quant.runtimes import LOW_BIT_ONLY, candidate_schemes, low_bit_candidates


def test_low_bit_candidates_follow_the_budget():
    assert "iq2_xxs" in LOW_BIT_ONLY and "iq2_xs" in LOW_BIT_ONLY
    for rt in ("any", "llama.cpp"):
        assert "iq2_xxs" not in candidate_schemes(rt) and "iq2_xs" not in candidate_schemes(rt)
        assert low_bit_candidates(rt, 2.5) == ["iq2_xxs", "iq2_xs", "iq2_s"]
        assert low_bit_candidates(rt, 3.1) == ["iq2_xs", "iq2_s"]   # 2.0625 + 1 < 3.1
        assert low_bit_candidates(rt, 3.4) == ["iq2_s"]             # < 2.5625 + 1
        assert low_bit_candidates(rt, 3.6) == [] and low_bit_candidates(rt, 4.5) == []
    assert low_bit_candidates("vllm", 2.5) == []                # vLLM cannot run it


class _Measured(Exception):
    """Raised by the stand-in measure with the candidate list it was given."""


def _candidates(monkeypatch, model, bpw, schemes=api.AUTO):
    def measure(model, names, **kw):
        raise _Measured(list(names))
    monkeypatch.setattr(api, "measure_sensitivity", measure)
    with pytest.raises(_Measured) as got:
        api.allocate_plan(model, Budget.bits_per_weight(bpw), schemes=schemes,
                          target="llama.cpp", methods="rtn", notes=False)
    return got.value.args[0]


def test_allocate_adds_them_only_for_a_low_budget(demo_model_path, monkeypatch):
    m = open_model(demo_model_path)
    assert _candidates(monkeypatch, m, 4.5) == candidate_schemes("llama.cpp")
    assert _candidates(monkeypatch, m, 2.6) == candidate_schemes("llama.cpp") + ["iq2_xxs", "iq2_xs",
                                                                        "iq2_s"]
    # named explicitly, a scheme is a candidate whatever the budget
    assert _candidates(monkeypatch, m, 4.5, "q4_0,iq2_xxs") == ["q4_0", "iq2_xxs"]

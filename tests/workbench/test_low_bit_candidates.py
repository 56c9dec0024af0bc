"""The lattice i-quants (runtimes.LOW_BIT_ONLY: IQ2_XXS/IQ2_XS/IQ2_S, IQ3_XXS/IQ3_S) are among
llama.cpp's candidates, but allocate's "auto" list keeps them only when the budget's mean
bits/weight is below their own + 1: a 4+ bits/weight allocation keeps its candidate list (and so
its time), a 2.5 bits/weight one can use IQ2_XXS."""

from __future__ import annotations

import pytest

from workbench import api
from workbench.formats.loaders import open_model
from workbench.planning.budget import Budget
from workbench.quant.runtimes import LOW_BIT_ONLY, candidate_schemes, for_budget

IQ2 = ["iq2_xxs", "iq2_xs", "iq2_s"]


def test_low_bit_candidates_follow_the_budget():
    assert set(IQ2) <= set(LOW_BIT_ONLY)
    for rt in ("any", "llama.cpp"):
        names = candidate_schemes(rt)
        assert set(IQ2) <= set(names)
        assert [s for s in for_budget(names, 2.5) if s in IQ2] == IQ2
        assert [s for s in for_budget(names, 3.1) if s in IQ2] == ["iq2_xs", "iq2_s"]  # 2.0625 + 1 < 3.1
        assert [s for s in for_budget(names, 3.4) if s in IQ2] == ["iq2_s"]            # < 2.5625 + 1
        assert not set(for_budget(names, 3.6)) & set(IQ2)
        assert not set(for_budget(names, 4.5)) & set(LOW_BIT_ONLY)
    assert not set(candidate_schemes("vllm")) & set(LOW_BIT_ONLY)      # vLLM cannot run them


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


def test_allocate_takes_them_only_for_a_low_budget(demo_model_path, monkeypatch):
    m = open_model(demo_model_path)
    high = _candidates(monkeypatch, m, 4.5)
    assert not set(high) & set(LOW_BIT_ONLY) and "q4_k" in high
    low = _candidates(monkeypatch, m, 2.6)
    assert set(IQ2) | {"iq3_xxs", "iq3_s"} <= set(low)
    # named explicitly, a scheme is a candidate whatever the budget
    assert _candidates(monkeypatch, m, 4.5, "q4_0,iq2_xxs") == ["q4_0", "iq2_xxs"]

"""IQ1_S / IQ1_M are llama.cpp candidates for `allocate` and `frontier`, kept in allocate's
"auto" list only while the budget's mean bits/weight is below their own + 1 (2.5625 / 2.75),
like the other lattice types (runtimes.LOW_BIT_ONLY); a 4.5 bits/weight allocation keeps its
candidate list."""

from __future__ import annotations

import pytest

from workbench import api
from workbench.formats.loaders import open_model
from workbench.planning.budget import Budget
from workbench.quant.runtimes import LOW_BIT_ONLY, candidate_schemes, for_budget
from workbench.schemes import get_scheme

IQ1 = ["iq1_s", "iq1_m"]


def test_in_llama_cpp_candidates_gated_by_the_budget():
    for n in IQ1:
        assert LOW_BIT_ONLY[n] == get_scheme(n).bits_per_weight()
    for rt in ("any", "llama.cpp"):
        names = candidate_schemes(rt)
        assert set(IQ1) <= set(names)
        assert [s for s in for_budget(names, 2.0) if s in IQ1] == IQ1
        assert [s for s in for_budget(names, 2.6) if s in IQ1] == ["iq1_m"]     # 1.5625 + 1 < 2.6
        assert not set(for_budget(names, 2.8)) & set(IQ1)
    assert not set(candidate_schemes("vllm")) & set(IQ1)


class _Measured(Exception):
    pass


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
    assert not set(_candidates(monkeypatch, m, 4.5)) & set(IQ1)
    assert set(IQ1) <= set(_candidates(monkeypatch, m, 2.2))
    assert _candidates(monkeypatch, m, 4.5, "q4_0,iq1_m") == ["q4_0", "iq1_m"]

"""llama.cpp's lattice types (IQ3_XXS, IQ3_S) are default allocate candidates only at low
budgets (mean bits/weight below theirs + 1): 4+ bits/weight allocations keep the candidate list
(and so the time) they had without them; explicit --schemes lists are kept as given."""

from __future__ import annotations

import pytest

from workbench.quant.runtimes import LOW_BIT_ONLY, candidate_schemes, for_budget


def test_for_budget_thresholds():
    names = candidate_schemes("llama.cpp")
    assert {"iq3_xxs", "iq3_s"} <= set(names) <= set(candidate_schemes("any"))
    high = for_budget(names, 4.5)
    assert high == [s for s in names if s not in LOW_BIT_ONLY]
    assert [s for s in for_budget(names, 4.2) if s in LOW_BIT_ONLY] == ["iq3_s"]  # 3.4375 + 1 > 4.2
    assert for_budget(names, 2.0) == names         # below IQ1_S's 1.5625 + 1 too


@pytest.mark.parametrize("bpw, has_lattice", [(5.0, False), (3.2, True)])
def test_allocate_candidates_follow_the_budget(demo_model_path, tmp_path, bpw, has_lattice):
    import workbench as qw
    model = qw.open_model(demo_model_path)
    from workbench.planning.sizes import budget_candidates
    auto = candidate_schemes("llama.cpp")
    from workbench.planning.sizes import GAP_BITS
    from workbench.schemes import get_scheme
    got = budget_candidates(model, auto, qw.Budget.bits_per_weight(bpw), "llama.cpp")
    assert ("iq3_s" in got) is has_lattice and ("iq3_xxs" in got) is has_lattice
    assert got == [s for s in for_budget(auto, bpw)
                   if get_scheme(s).bits_per_weight() >= bpw - GAP_BITS]


def test_allocate_takes_them_only_by_default(demo_model_path, monkeypatch):
    """allocate_plan("auto") drops them at 5 bits/weight; an explicit list keeps them (the
    measuring stops at the first job: only the candidates are looked at)."""
    import workbench as qw
    from workbench import api
    seen = []

    class Stop(Exception):
        pass

    def stop(model, names, *a, **k):
        seen.append(list(names))
        raise Stop
    monkeypatch.setattr(api, "measure_sensitivity", stop)
    model = qw.open_model(demo_model_path)
    for schemes in ("auto", "q4_0,iq3_s"):
        with pytest.raises(Stop):
            qw.allocate_plan(model, qw.Budget.bits_per_weight(5.0), schemes=schemes,
                             measure="weight", target="llama.cpp", methods="rtn")
    from workbench.planning.sizes import budget_candidates
    assert seen[0] == budget_candidates(model, candidate_schemes("llama.cpp"),
                                        qw.Budget.bits_per_weight(5.0), "llama.cpp")
    assert "iq3_s" not in seen[0] and seen[1] == ["q4_0", "iq3_s"]

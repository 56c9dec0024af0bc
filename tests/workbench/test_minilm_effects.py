"""Issue 11's done-when on the real MiniLM (all-MiniLM-L6-v2), with the shipped calibration text:
which measure predicts the measured output ranking of tensors, and whether the allocated plan
beats every uniform plan that fits the same budget end to end. Fewer samples than the README's
figures (time), but every number is measured."""

from __future__ import annotations

import pytest

from workbench.core.progress import run
from workbench.running.runner_jobs import check
from workbench.planning.output_measure import rank_agreement
from workbench.planning.sensitivity import sensitivity_table

pytestmark = pytest.mark.slow

SAMPLES = 16


def test_fisher_measure_predicts_the_output_ranking(minilm, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))      # measure, do not read a cache
    t = {m: sensitivity_table(minilm, ["q4_0"], m, samples=SAMPLES)
         for m in ("weight", "activation", "fisher", "output")}
    rho = {m: rank_agreement(t[m], t["output"], "q4_0") for m in ("weight", "activation", "fisher")}
    # 39 tensors (the pooler is not read by mean-pooled embeddings and is left out)
    assert rho["fisher"] > 0.9
    assert rho["fisher"] > rho["weight"] + 0.5 and rho["fisher"] > rho["activation"] + 0.5
    # the estimate is of the same quantity, not only the same order
    for n in t["output"].names:
        o, f = t["output"].values[(n, "q4_0")], t["fisher"].values[(n, "q4_0")]
        if o > 1e-9:
            assert 0.33 < f / o < 3.0, n


# uniform plans within 4.5 bits/weight (evaluate's count, F32 norms and biases included):
# int4-g128 4.165, q3_k 4.373 (384-wide rows fall back to q4_0), int4-g64-asym 4.414
CANDIDATES = ["int4-g128", "q3_k", "int4-g64-asym", "q4_k", "int5-g64-asym", "q6_k"]


def test_allocation_at_4_5_bpw_beats_every_uniform_plan_within_budget(minilm, tmp_path):
    """Allocated on the first 16 lines of the calibration text, checked on 48 other lines."""
    from workbench.running.calibration import DEFAULT_CALIB
    lines = DEFAULT_CALIB.read_text().splitlines()
    held = tmp_path / "held-out.txt"
    held.write_text("\n".join(lines[200:248]) + "\n")
    table = sensitivity_table(minilm, CANDIDATES, "fisher", samples=SAMPLES)
    budget = table.budget_bytes(None, 4.5)
    plan, _ = table.solve(budget)
    a = table.assignment_of(plan, minilm)
    assert table.bytes_of(a) <= budget
    alloc = run(check(minilm, plan, held))["cosine_mean"]
    fitting = [s for s in CANDIDATES if table.bytes_of({n: s for n in table.names}) <= budget]
    assert set(fitting) == {"int4-g128", "q3_k", "int4-g64-asym"}
    best = max(run(check(minilm, table.plan_for({n: s for n in table.names}), held))
               ["cosine_mean"] for s in fitting)
    assert alloc > best

"""The fuzz suite under its CI budget: every area (the six input formats and issue 20's nine
hardening kinds), thousands of mutated inputs, each in a worker under 1 GiB above its footprint
and 10 s of CPU; any traceback, exit 3, hang, signal or blow-up fails the test (the failing
inputs are saved under the test's temporary folder)."""

from __future__ import annotations

import os

from tests.fuzz.cases import AREAS, BASE_AREAS
from tests.fuzz.runner import fuzz

BUDGET_S = float(os.environ.get("QW_FUZZ_SECONDS", "60"))


def test_fuzz_finds_nothing_in_its_budget(tmp_path):
    failures = []
    tallies = fuzz(BUDGET_S, seed=20261122, areas=AREAS, save_dir=tmp_path / "failures",
                   log=failures.append)
    counts = {a: t.to_dict() for a, t in tallies.items()}
    for area, c in counts.items():
        # every area really ran (the budget is shared time-fairly: a header case takes
        # milliseconds, an export scenario or a 40,000-rule plan a second or more)
        assert c["tried"] >= (5 if area in BASE_AREAS else 1), counts
        # and the mutations reached the error paths
        # (a hardening class's generator makes fewer, slower cases, some meant to load: it
        # must reach an error path once it has had a fair number of cases)
        assert c["clean_errors"] > 0 or c["tried"] < (5 if area in BASE_AREAS else 20), counts
    assert not failures, "\n".join(failures[:5])

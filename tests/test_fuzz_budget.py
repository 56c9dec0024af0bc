"""The fuzz suite under its CI budget: every area (the six input formats, issue 20's nine
hardening kinds, issue 32's and 47's classes), a fixed number of mutated inputs of each, each in
a worker under 1 GiB above its footprint and 10 s of CPU; any traceback, exit 3, hang, signal
or blow-up fails the test (the failing inputs are saved under the test's temporary folder).

The cases are fixed (an area's k-th case is the same whatever ran before it) and so is their
number: the verdict does not depend on how loaded the machine is, only the time it takes
(about a minute on 2 idle cores). A time-budgeted run gave each area what the clock allowed,
and under load an area could get fewer cases than the test asked of it. Longer runs:
``python -m tests.fuzz --minutes N``; ``QW_FUZZ_SCALE=K`` multiplies the counts here."""

from __future__ import annotations

import os

from tests.fuzz.cases import AREAS, BASE_AREAS
from tests.fuzz.runner import fuzz

SCALE = max(1, int(os.environ.get("QW_FUZZ_SCALE", "1")))
#: cases per area: fast header kinds many, the scenarios that build, export and run a tiny
#: model (a second or more each) few
CASES = {"safetensors": 30, "gguf": 15, "pytorch": 30, "quantized": 30, "plan": 60,
         "session": 40, "outputs": 2, "pt-cycles": 20, "imatrix": 60, "calibration": 30,
         "roundtrip": 8, "gguf-align": 15, "truncation": 10, "scale": 1, "optional": 1,
         "config-tensors": 1, "config-counts": 1, "config-values": 1, "r4-outputs": 2,
         "r4-sidecars": 2, "r4-nesting": 3, "r4-messages": 2, "r4-leftovers": 3,
         "api-args": 40}


def test_fuzz_finds_nothing_in_its_budget(tmp_path):
    failures = []
    cases = {a: CASES.get(a, 2) * SCALE for a in AREAS}
    tallies = fuzz(None, seed=20261122, areas=AREAS, save_dir=tmp_path / "failures",
                   log=failures.append, cases=cases)
    counts = {a: t.to_dict() for a, t in tallies.items()}
    for area, c in counts.items():
        # every case ran, whatever the time (a generator's own mistake is no case)
        assert c["tried"] + c["skipped"] == cases[area] and c["tried"] > 0, counts
        # and the mutations reached the error paths (a base area in its first cases; a
        # hardening class's generator makes fewer, slower cases, some meant to load)
        assert c["clean_errors"] > 0 or c["tried"] < (5 if area in BASE_AREAS else 20), counts
    assert not failures, "\n".join(failures[:5])

"""`quant-workbench bench-cluster`: the sweep of a generated checkpoint on a local Dask cluster
of 1 and 2 workers (workbench.bench.cluster), its schemes read by the API's parse_schemes."""

from __future__ import annotations

import json

import pytest

from workbench.cli import main

pytest.importorskip("distributed")


def test_one_block_on_one_and_two_workers(capsys):
    assert main(["bench-cluster", "--layers", "1", "--repeats", "1", "--noop-tasks", "10",
                 "--schemes", "q4_0, Q8_0,q4_0", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["schemes"] == ["q4_0", "q8_0"]            # names as parse_schemes gives them
    assert res["tensors"] == 7 and res["params"] == 11_272_192
    assert [r["workers"] for r in res["runs"]] == [1, 2]
    assert all(r["tasks"] == 7 and r["noop_tasks"] == 10 for r in res["runs"])
    assert set(res["projection"]) >= {"worker_hours", "workers_per_machine", "hours"}


def test_an_unknown_scheme_is_refused_before_any_work(capsys):
    assert main(["bench-cluster", "--schemes", "q4_0,bogus"]) == 2
    assert "unknown scheme 'bogus'" in capsys.readouterr().err

"""Errors are routed by their type or by an explicit check, never by their text: the table's
below-the-smallest refusal is the allocator's BelowSmallest (another error that mentions a
budget passes through as it is), the runner passes ``use_cache`` where the network's forward
names it (a TypeError inside the forward is not retried), and a legacy PyTorch checkpoint is
read whole because it is not a zip, not because a memory-mapped load failed."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from workbench.core.errors import WorkbenchError
from workbench.planning import allocate
from workbench.planning.allocate import BelowSmallest
from workbench.planning.sensitivity import SensitivityTable


def _table():
    names, schemes = ["a.weight", "b.weight"], ["q4_0", "q8_0"]
    t = SensitivityTable(model_path="m.safetensors", measure="weight", runtime="any",
                         schemes=schemes, names=names, params=2 * 4096)
    for n in names:
        for s, (b, v) in zip(schemes, [(2304, 1.0), (4352, 0.1)]):
            t.values[(n, s)], t.bytes[(n, s)] = v, b
    return t


def test_a_budget_below_the_smallest_is_the_allocators_type():
    with pytest.raises(BelowSmallest) as info:
        allocate.solve_detailed([[10, 20], [5]], [[1.0, 0.5], [0.0]], 12)
    assert (info.value.budget, info.value.cheapest) == (12, 15)
    assert str(info.value) == "budget 12 bytes is below the smallest possible size 15 bytes"
    again = pickle.loads(pickle.dumps(info.value))   # a cluster worker's error stays itself
    assert isinstance(again, BelowSmallest) and again.cheapest == 15


def test_the_table_says_below_the_smallest_in_its_terms():
    t = _table()
    plan, sol = t.solve(2 * 4352)
    assert sol.cost == 2 * 4352
    with pytest.raises(WorkbenchError, match="below the smallest plan the candidates allow"):
        t.solve(2 * 2304 - 1)


def test_another_error_that_names_a_budget_is_not_rewritten(monkeypatch):
    def fails(*a, **k):
        raise WorkbenchError("the budget solver ran out of work")
    monkeypatch.setattr(allocate, "solve_detailed", fails)
    with pytest.raises(WorkbenchError) as info:
        _table().solve(10**6)
    assert str(info.value) == "the budget solver ran out of work"


class _Base:
    def __init__(self, forward):
        self.forward = forward
        self.calls = []

    def __call__(self, **kw):
        self.calls.append(sorted(kw))
        return self.forward(**kw)


def test_use_cache_is_passed_where_the_forward_names_it():
    from workbench.running.runner import Runner, takes_use_cache

    def decoder(input_ids, attention_mask=None, use_cache=None):
        return "decoded"

    def encoder(input_ids, attention_mask=None):
        return "encoded"
    runner = Runner.__new__(Runner)
    for forward, takes, out in [(decoder, True, "decoded"), (encoder, False, "encoded")]:
        runner.base = _Base(forward)
        assert takes_use_cache(runner.base) is takes
        assert runner._base_call(np.zeros(1), np.ones(1)) == out
        assert runner.base.calls == [sorted(["input_ids", "attention_mask"]
                                            + (["use_cache"] if takes else []))]


def test_a_type_error_inside_the_forward_is_not_retried():
    from workbench.running.runner import Runner

    def decoder(input_ids, attention_mask=None, use_cache=None):
        raise TypeError("bad use_cache layout in layer 3")
    runner = Runner.__new__(Runner)
    runner.base = _Base(decoder)
    with pytest.raises(TypeError, match="layer 3"):
        runner._base_call(np.zeros(1), np.ones(1))
    assert len(runner.base.calls) == 1            # one call: the text did not send it again


def test_a_legacy_pytorch_checkpoint_is_read_whole(tmp_path):
    torch = pytest.importorskip("torch")
    from workbench.formats.loaders import open_model
    w = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    for name, zipped in [("legacy.pt", False), ("zip.pt", True)]:
        path = tmp_path / name
        torch.save({"w.weight": w}, path, _use_new_zipfile_serialization=zipped)
        model = open_model(str(path))
        assert np.array_equal(model.raw("w.weight"), w.numpy()), name

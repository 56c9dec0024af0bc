"""The API in a notebook: results with a one-line repr and to_dict(), and progress shown by
default (a line updated in place on a terminal or in Jupyter; plain lines every 10 s in a log;
nothing with progress=False)."""

from __future__ import annotations

import io
import sys

import workbench as qw
from workbench.core.progress import LineProgress, Progress, TextProgress, default_progress


def test_allocation_repr_is_one_short_line_and_to_dict_the_json(demo_model_path):
    model = qw.open_model(demo_model_path)
    a = qw.allocate_plan(model, qw.Budget.bits_per_weight(5.0), measure="weight",
                         methods="rtn", progress=False)
    r = repr(a)
    assert "\n" not in r and len(r) < 300, r               # was ~200 KB (every field)
    t = a.evaluation.totals
    assert f"{t.bytes_after:,d} bytes" in r and f"{t.bits_per_weight:.3f} bits/weight" in r
    top = max(a.to_dict()["schemes"].items(), key=lambda kv: kv[1])
    assert f"{top[0]} {top[1]}" in r
    d = a.to_dict()
    assert d["bytes"] == t.bytes_after and d["predicted"] == a.solution.error
    f = qw.compute_frontier(model, points=2, measure="weight", progress=False)
    assert "\n" not in repr(f) and "2 allocated plans" in repr(f) and len(repr(f)) < 300


def test_default_progress_follows_the_stream(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True
    monkeypatch.setattr(sys, "stderr", Tty())
    assert isinstance(default_progress(), TextProgress)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    shown = default_progress()
    assert isinstance(shown, LineProgress) and shown.first_after == 10.0
    monkeypatch.setitem(sys.modules, "ipykernel", object())   # Jupyter: redrawn in place
    assert isinstance(default_progress(), TextProgress)


def test_a_call_without_progress_draws_it_and_progress_false_is_silent(demo_model_path,
                                                                         monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True
    model = qw.open_model(demo_model_path)
    err = Tty()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(TextProgress, "__call__", _every_event(TextProgress.__call__))
    qw.statistics(model)
    assert "\r[" in err.getvalue() and "%" in err.getvalue()
    err2 = Tty()
    monkeypatch.setattr(sys, "stderr", err2)
    qw.statistics(model, progress=False)
    assert err2.getvalue() == ""


def _every_event(call):
    """TextProgress redraws at most every 0.1 s: draw every event (a fast call still shows)."""
    def draw(self, ev: Progress):
        self._last = 0.0
        return call(self, ev)
    return draw

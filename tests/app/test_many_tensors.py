"""The window's incremental paths for large catalogs (issue 23): an edit re-resolves only the
tensors it names and updates the totals by deltas, the tier board moves only the changed cards,
the layer browser filters by one scan of all names, the model map is laid out on the compute
thread. Each is checked against the full computation it replaces, on a generated MoE catalog
(app.bench_catalog) with the compute thread's whole-model sweep left out, as bench-gui does."""

import dataclasses
import math
import re
from types import SimpleNamespace

import pytest

from workbench.quant.evaluate import evaluate_tensor
from workbench.quant.runtimes import plan_decisions, summarize

from app import commands
from app.bench_catalog import make_catalog
from app.layer_tree import GROUP_ROLE, NAME_ROLE
from app.tier_placement import members

from apphelpers import wait_idle


@pytest.fixture
def moe_window(make_window, qtbot):
    win = make_window(None)
    # the whole-model sweep (statistics and error of every tensor) is not started: the tests
    # deliver the results they need themselves
    win.doc.modelChanged.disconnect(win.analyzer._model_changed)
    win.doc.stateChanged.disconnect(win.analyzer._state_changed)
    win.doc.set_model(make_catalog(2000, n_layers=4))
    wait_idle(qtbot, win)
    return win


def _same_totals(a, b):
    for f in ("params", "bytes_before", "bytes_after", "pending", "measured", "estimated"):
        assert getattr(a, f) == getattr(b, f), f
    for f in ("bits_per_weight", "compression", "sqnr_db", "throughput_gbs",
              "sqnr_estimate_db"):
        x, y = getattr(a, f), getattr(b, f)
        assert (x is None) == (y is None), f
        if x is not None:
            assert x == pytest.approx(y, rel=1e-9, nan_ok=True) or (math.isinf(x) and x == y), f


def _check_document(doc):
    """Everything the document keeps incrementally equals a computation from scratch."""
    assert doc.assignment == doc.plan.resolve(doc.model)
    full = plan_decisions(doc.model, doc.plan, "any")
    assert {n: (d.requested, d.applied, d.kind, d.note, d.params)
            for n, d in doc.decisions.items()} == \
        {n: (d.requested, d.applied, d.kind, d.note, d.params) for n, d in full.items()}
    assert doc.fallback_summary().to_dict() == summarize(full.values()).to_dict()
    _same_totals(doc.totals(), doc._compute_totals())
    assert doc.sizes(doc.names()) == [doc.bytes_of(n) for n in doc.names()]
    for n in doc.names()[::97]:
        r = doc.result(n)
        assert doc.bytes_of(n) == (r.bytes if r is not None else doc.estimated_bytes(n))


def _check_tiers(win):
    doc, board = win.doc, win.tiers
    for col in board.columns:
        names = members(doc, col.tier)
        assert col.model.names == names
        assert col.model.stringList() == names          # what the view shows
        pl = board.placement
        assert pl.params[col.tier] == sum(doc.model.info(n).numel for n in names)
        assert pl.bytes[col.tier] == sum(doc.bytes_of(n) for n in names)
        assert sorted(pl.schemes[col.tier]) == sorted({doc.scheme_of(n) for n in names})


def test_edits_update_plan_totals_and_tiers_like_a_full_recompute(moe_window, qtbot):
    win = moe_window
    doc = win.doc
    names = doc.names()
    experts = [n for n in names if ".experts." in n]
    _check_document(doc)
    _check_tiers(win)
    # one tensor, several, back to the default's scheme, a vector: each an exact-name edit (the
    # incremental path)
    edits = [([experts[5]], "q4_0"), (experts[10:40], "int4-g32"), ([experts[5]], "int8-channel"),
             (experts[100:103], "q5_1"), ([names[1]], "fp16"),
             ([n for n in names if n.endswith("q_proj.weight")], "q8_0")]
    for targets, scheme in edits:
        cmd = commands.assign(doc, targets, scheme)
        assert cmd is not None
        assert doc.plan.exact_changes(cmd.after[0]) == set(cmd.targets)
        win.push(cmd)
        _check_document(doc)
        _check_tiers(win)
    # results of the current scheme (some tensors), a result of another scheme (not counted),
    # an estimate and throughputs arrive: the running totals follow
    for n in experts[10:14] + [experts[5]]:
        doc.add_result(evaluate_tensor(doc.model, n, doc.scheme_of(n), cache=None))
    doc.add_result(evaluate_tensor(doc.model, experts[200], "q4_0", cache=None))
    doc.add_throughput(experts[10], doc.scheme_of(experts[10]), 12.5)
    doc.add_throughput(experts[11], doc.scheme_of(experts[11]), None)
    _check_document(doc)
    _check_tiers(win)
    # undo / redo walk the same path back and forth
    for _ in range(3):
        win.undo_stack.undo()
        _check_document(doc)
        _check_tiers(win)
    for _ in range(2):
        win.undo_stack.redo()
        _check_document(doc)
    # edits that are not exact-name ones take the full path: a rule, the default
    win.push(commands.add_rule(doc, r"re:\.down_proj\.weight$", "q4_k"))
    _check_document(doc)
    _check_tiers(win)
    # q4_k falls back on rows of 32 (not a multiple of 256); exact-name edits of such tensors
    # then update the running fallback summary
    assert doc.fallback_summary().tensors["fallback"] > 0
    downs = [n for n in experts if n.endswith("down_proj.weight")]
    win.push(commands.assign(doc, downs[:4], "q8_0"))
    _check_document(doc)
    win.undo_stack.undo()
    _check_document(doc)
    win.push(commands.set_default(doc, "int4-g64"))
    _check_document(doc)
    _check_tiers(win)
    # every tensor measured: the exact model SQNR, equal to the sum over all results
    for n in names:
        doc.add_result(evaluate_tensor(doc.model, n, doc.scheme_of(n), cache=None))
    t = doc.totals()
    assert t.pending == 0 and t.sqnr_db is not None
    _check_document(doc)


def test_running_totals_with_estimates_and_non_finite_errors(moe_window):
    doc = moe_window.doc
    names = doc.names()
    # every tensor measured but two, which have sampled-rows estimates: the "≈" figure
    for n in names[:-2]:
        doc.add_result(evaluate_tensor(doc.model, n, doc.scheme_of(n), cache=None))
    for n in names[-2:]:
        doc.add_estimate(SimpleNamespace(name=n, requested=doc.scheme_of(n), sig=4.0, sse=0.01))
    t = doc.totals()
    assert t.sqnr_db is None and t.sqnr_estimate_db is not None and t.estimated == 2
    _check_document(doc)
    # a NaN error (a tensor with non-finite values) poisons the model SQNR, and replacing it
    # with a finite result cures it (a running sum could not take a NaN back)
    e = evaluate_tensor(doc.model, names[5], doc.scheme_of(names[5]), cache=None)
    bad = dataclasses.replace(e, error=dataclasses.replace(e.error, sig=math.nan))
    doc.add_result(bad)
    assert math.isnan(doc.totals().sqnr_estimate_db)
    _check_document(doc)
    doc.add_result(e)
    assert math.isfinite(doc.totals().sqnr_estimate_db)
    _check_document(doc)


def _shown(browser):
    """The tensor names the browser shows (every row, expanded or not), depth first."""
    m = browser.proxy
    out = []

    def walk(parent):
        for r in range(m.rowCount(parent)):
            idx = m.index(r, 0, parent)
            if idx.data(NAME_ROLE):
                out.append(idx.data(NAME_ROLE))
            walk(idx)
    walk(browser.view.rootIndex())
    return out


@pytest.mark.parametrize("text", ["layers.2.mlp.experts.1", "UP_PROJ", "q_proj", "experts.7.",
                                  "re:experts\\.1[0-2]\\.down", "re:^model\\.norm", "nothing",
                                  "ß", "re:(", ""])
def test_filter_keeps_what_a_per_name_match_keeps(moe_window, text):
    win = moe_window
    b = win.browser
    names = win.doc.names()
    b.filter_edit.setText(text)
    t = text.strip()
    if not t:
        want = set(names)
    elif t.startswith("re:"):
        try:
            rx = re.compile(t[3:], re.IGNORECASE)
        except re.error:
            rx = None
        want = set(names) if rx is None else {n for n in names if rx.search(n)}
        assert (rx is None) == bool(b.filter_error.text())
    else:
        rx = re.compile(re.escape(t), re.IGNORECASE)
        want = {n for n in names if rx.search(n)}
    shown = _shown(b)
    assert len(shown) == len(set(shown)) and set(shown) == want
    # a group row is there only when a tensor under it matches; with a filter every row that
    # holds a match is open
    m = b.proxy
    for g in range(m.rowCount()):
        gi = m.index(g, 0)
        assert m.rowCount(gi) > 0
        if t and want:
            assert b.view.isExpanded(gi)
    b.filter_edit.setText("")
    assert set(_shown(b)) == set(names)


def test_browser_rows_made_lazily_still_select_and_group(moe_window, qtbot):
    win = moe_window
    b, doc = win.browser, win.doc
    expert = [n for n in doc.names() if ".experts.3.down_proj" in n][1]
    win.select(expert)
    cur = b.view.currentIndex()
    assert cur.data(NAME_ROLE) == expert and b.view.isExpanded(cur.parent())
    key = doc.model.info(expert).expert_group
    assert cur.parent().data(GROUP_ROLE) == key
    assert set(b.group_names(key)) == {n for n in doc.names()
                                       if doc.model.info(n).expert_group == key}
    assert b.show_group(key)
    assert set(b.selected_names()) == set(b.group_names(key))


def test_map_laid_out_on_the_compute_thread_is_the_layout(moe_window, qtbot):
    from workbench.planning.model_map import layout
    win = moe_window
    view = win.model_map
    assert view._prepared is not None and view._prepared[0] is win.doc.model
    win.tabs.setCurrentIndex(win.map_tab_index)
    assert view._prepared is None
    want = [c.name for b in layout(win.doc.model) for s in b.sections for c in s.cells]
    assert view.canvas.names == want
    assert list(view.nbytes) == [win.doc.bytes_of(n) for n in want]

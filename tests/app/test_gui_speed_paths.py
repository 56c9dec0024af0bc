"""Behaviour of the GUI's fast paths (issue 10): the sampled-rows error estimate shown right
after an edit of a large tensor, and the tier board refreshing a column once per change."""

import numpy as np
import pytest

from workbench.planning.estimate import MIN_ELEMENTS, estimate_tensor, sample_rows
from workbench.quant.evaluate import evaluate_tensor
from workbench.export.st_writer import StreamingSafetensorsWriter
from workbench.formats.loaders import open_model

from apphelpers import wait_idle

BIG = "model.layers.0.mlp.down_proj.weight"


@pytest.fixture(scope="module")
def big_model(tmp_path_factory):
    """A 2048x2048 matrix (4M weights: estimated) with a few large rows, and a small one."""
    path = tmp_path_factory.mktemp("big") / "model.safetensors"
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((2048, 2048)) * 0.02).astype(np.float32)
    w[::97] *= 4.0           # rows of a larger scale, spread over the tensor
    wr = StreamingSafetensorsWriter(str(path))
    wr.add(BIG, w)
    wr.add("model.layers.0.self_attn.q_proj.weight",
           (rng.standard_normal((256, 256)) * 0.02).astype(np.float32))
    wr.finish()
    return path


def test_sample_rows_spans_the_tensor():
    idx = sample_rows(4096, 4096)
    assert idx[0] == 0 and idx[-1] == 4095
    assert 120 <= idx.size <= 128 and np.all(np.diff(idx) > 0)
    assert sample_rows(10, 4096).tolist() == list(range(10))


def test_estimate_is_close_to_the_exact_error(big_model):
    m = open_model(str(big_model))
    assert m.info(BIG).numel >= MIN_ELEMENTS
    for scheme in ("int4-g128", "int3-g64", "q4_0", "int8-channel"):
        est = estimate_tensor(m, BIG, scheme)
        exact = evaluate_tensor(m, BIG, scheme, cache=None)
        assert est is not None and est.sampled_rows <= 2048 // 8
        assert abs(est.sqnr_db - exact.error.sqnr_db) < 0.25, scheme
    # a per-tensor scale depends on rows outside the sample: not estimated
    assert estimate_tensor(m, BIG, "int4-tensor") is None
    # small tensors are measured exactly at once
    assert estimate_tensor(m, "model.layers.0.self_attn.q_proj.weight", "int4-g128") is None


def test_edit_of_a_large_tensor_shows_the_estimate_first(make_window, qtbot, big_model):
    from app import commands
    win = make_window(big_model)
    doc = win.doc
    seen = []

    def on_estimate(names):
        # the totals bar is connected before this slot: it has refreshed already
        seen.append((list(names), win.totals.sqnr.value.text(), doc.result(BIG) is None))
    doc.estimatesChanged.connect(on_estimate)
    win.push(commands.assign(doc, [BIG], "int3-g64"))
    # the size totals only, at once; the SQNR says how far its evaluation is (no bare "…")
    n = len(doc.model.tensors)
    assert win.totals.sqnr.value.text() == f"{n - 1}/{n} measured"
    qtbot.waitUntil(lambda: doc.totals().sqnr_db is not None, timeout=60000)
    wait_idle(qtbot, win)
    assert seen, "no estimate before the exact result"
    names, text, pending = seen[0]
    assert names == [BIG] and pending and text.startswith("≈") and text.endswith(" dB")
    est, exact = doc.estimate(BIG), doc.result(BIG)
    assert abs(est.sqnr_db - exact.error.sqnr_db) < 0.25
    t = doc.totals()
    assert t.estimated == 0 and t.sqnr_estimate_db == t.sqnr_db
    assert not win.totals.sqnr.value.text().startswith("≈")
    # an undo to a scheme already evaluated: the cached exact result, no estimate
    seen.clear()
    win.undo_stack.undo()
    wait_idle(qtbot, win)
    assert seen == [] and doc.totals().sqnr_db is not None


def test_edits_of_a_large_tensor_reuse_its_matrix(make_window, qtbot, big_model):
    """The exact evaluation after an edit of a large tensor reads the matrix once and keeps
    it for the next edit (not re-read from the file); results equal a fresh evaluation, and
    the estimate sampled from the held matrix equals the one sampled from the file."""
    from app import commands
    from workbench.quant.evaluate import DEFAULT_EVAL_CACHE
    win = make_window(big_model)
    doc, m = win.doc, win.doc.model
    small = "model.layers.0.self_attn.q_proj.weight"
    win.select(small)      # the plots of the selected tensor read it for their histogram
    wait_idle(qtbot, win)
    reads = []
    orig = m.read_matrix
    m.read_matrix = lambda n: (reads.append(n), orig(n))[1]
    try:
        for scheme in ("int3-g64", "int5-g128", "q4_0"):
            DEFAULT_EVAL_CACHE.clear()
            win.push(commands.assign(doc, [BIG], scheme))
            qtbot.waitUntil(lambda: doc.totals().sqnr_db is not None, timeout=60000)
            wait_idle(qtbot, win)
            fresh = evaluate_tensor(open_model(str(big_model)), BIG, scheme, cache=None)
            assert doc.result(BIG).error.sse == fresh.error.sse
            assert doc.result(BIG).error.max_abs_err == fresh.error.max_abs_err
    finally:
        m.read_matrix = orig
    assert reads.count(BIG) <= 1 and BIG in win.analyzer.matrices.names()
    held = win.analyzer.matrices.peek(m, BIG)
    a = estimate_tensor(m, BIG, "int4-g64", matrix=held)
    b = estimate_tensor(m, BIG, "int4-g64")
    assert a.sse == b.sse and a.sig == b.sig
    # a small tensor is never held
    win.push(commands.assign(doc, [small], "int3-g64"))
    wait_idle(qtbot, win)
    assert small not in win.analyzer.matrices.names()


def test_tier_header_refreshed_once_per_change(make_window, qtbot):
    """An edit of many tensors refreshes each tier column's header once per document signal,
    not once per card (the header sums its members)."""
    from app import commands
    win = make_window()
    doc = win.doc
    cols = win.tiers.columns
    calls = []
    for c in cols:
        orig = c.refresh_header
        c.refresh_header = (lambda o=orig, c=c: (calls.append(c.tier), o())[1])
    names = [n for n in doc.names() if doc.model.info(n).ndim >= 2]
    assert len(names) > 10
    before = len(calls)
    doc.resultsChanged.emit(names)    # results of every matrix arrive in one batch
    per_tier = {t: calls[before:].count(t) for t in set(calls[before:])}
    assert per_tier and max(per_tier.values()) == 1


def test_table_cells_cached_until_the_document_changes(window, qtbot):
    from app import commands
    from app.table_model import C_SCHEME
    m = window.table.model
    name = "model.layers.0.self_attn.q_proj.weight"
    idx = m.index(m.row_of(name), C_SCHEME)
    calls = []
    orig = m._data
    m._data = lambda i, r: (calls.append((i.row(), i.column(), r)), orig(i, r))[1]
    m._drop_cache()       # a paint of the window may have asked for this cell already
    first = idx.data()
    assert idx.data() == first and len(calls) == 1          # served from the cache
    # after a selection (and what the compute thread delivers for it) the values are
    # computed once more at most, then served again
    window.select("model.layers.1.mlp.up_proj.weight")
    wait_idle(qtbot, window)
    calls.clear()
    for _ in range(3):
        assert idx.data() == first
    assert len(calls) <= 1
    n = len(calls)
    window.push(commands.assign(window.doc, [name], "q8_0"))  # an edit drops the cache
    assert idx.data() == "q8_0" and len(calls) == n + 1


def test_axis_pictures_replayed_are_the_ones_drawn(window, qtbot):
    """Selecting a tensor again replays each axis' kept picture and the grid's kept paths:
    the plots look exactly as when they were drawn afresh (caches emptied)."""
    a, b = "model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight"
    plots = (window.plots.histogram, window.plots.ranges, window.plots.errors)

    def show(name):
        window.select(name)
        wait_idle(qtbot, window)
        qtbot.wait(10)
        return [p.grab().toImage() for p in plots]

    show(a)
    show(b)      # a left axis may grow to b's labels (then a's picture is drawn once more)
    first = show(a)
    show(b)
    axes = [p.getPlotItem().getAxis(s) for p in plots for s in ("left", "bottom")]
    sizes = [len(ax._picture_cache) for ax in axes]
    assert all(n >= 2 for n in sizes)            # a's and b's pictures kept
    again = show(a)                              # replayed from the caches
    assert [len(ax._picture_cache) for ax in axes] == sizes   # nothing new drawn
    for ax in axes:
        ax._picture_cache.clear()
        ax.picture = None
    for p in plots:
        p.getPlotItem()._fast_grid._cache.clear()
        p.getPlotItem()._fast_grid.update()
    fresh = [p.grab().toImage() for p in plots]
    for x, y, z in zip(first, again, fresh):
        assert x == y == z


def test_a_selection_paints_each_widget_once(window, qtbot):
    """A selection repaints the window once: the tensor's title and summary, the plots, the
    layer browser and the scheme table each get one paint event at most (the plots' scenes are
    flushed after every view has taken the selection, not before the table moved: then the
    panel's labels and the window behind them were painted twice)."""
    from PySide6.QtCore import QEvent, QObject
    from PySide6.QtWidgets import QApplication
    from app import perf
    assert perf.FAST
    a, b = "model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight"
    for name in (a, b, a):
        window.select(name)
        wait_idle(qtbot, window)
    qtbot.wait(20)
    painted = {}

    class Count(QObject):
        def eventFilter(self, obj, ev):
            if ev.type() == QEvent.Type.Paint:
                painted[id(obj)] = painted.get(id(obj), 0) + 1
            return False
    app = QApplication.instance()
    counter = Count()
    app.installEventFilter(counter)
    try:
        window.select(b)
        for _ in range(50):
            n = sum(painted.values())
            app.processEvents()
            if sum(painted.values()) == n:
                break
    finally:
        app.removeEventFilter(counter)
    plots = window.plots
    watched = {"title": plots.title, "summary": plots.summary,
               "histogram": plots.histogram.viewport(), "table": window.table.view.viewport(),
               "browser": window.browser.view.viewport()}
    counts = {k: painted.get(id(w), 0) for k, w in watched.items()}
    assert counts["title"] == counts["summary"] == counts["histogram"] == 1, counts
    assert max(counts.values()) == 1, counts      # nothing painted twice


def test_scheme_table_unsorted_shows_its_model_then_sorts_by_header(window, qtbot):
    """Unsorted, the scheme table's view shows the model itself (a repaint makes no call
    through the sort proxy); a header click switches it to the sort proxy, sorted, with the
    current row, the selection and the column widths kept, and every path that maps rows
    (selection, show_tensor, activated) still names the right tensors."""
    from PySide6.QtCore import QItemSelectionModel, Qt
    from app.table_model import C_NAME, C_PARAMS, NAME_ROLE, SORT_ROLE
    t = window.table
    m = t.model
    assert t.view.model() is m and not t.sorted
    names = [m.name_at(r) for r in range(m.rowCount())]
    shown = [t.view.model().index(r, C_NAME).data() for r in range(m.rowCount())]
    assert shown == [m.index(r, C_NAME).data() for r in range(m.rowCount())]
    cur = "model.layers.1.mlp.up_proj.weight"
    window.select(cur)
    wait_idle(qtbot, window)
    extra = "model.layers.0.self_attn.q_proj.weight"
    t.view.selectionModel().select(t.view_index(m.row_of(extra)),
                                   QItemSelectionModel.SelectionFlag.Select
                                   | QItemSelectionModel.SelectionFlag.Rows)
    chosen = t.selected_names()
    assert set(chosen) == {cur, extra}
    t.set_column_shown(C_PARAMS, True)   # a narrow window hides it (app.table_columns)
    t.view.setColumnWidth(C_PARAMS, 131)
    activated = []
    t.activated.connect(activated.append)

    t.view.sortByColumn(C_PARAMS, Qt.SortOrder.DescendingOrder)   # what a header click does
    assert t.sorted and t.view.model() is t.proxy
    view = t.view.model()
    keys = [view.index(r, C_PARAMS).data(SORT_ROLE) for r in range(view.rowCount())]
    assert keys == sorted(keys, reverse=True) and keys[0] > keys[-1]
    assert sorted(view.index(r, 0).data(NAME_ROLE) for r in range(view.rowCount())) \
        == sorted(names)
    assert t.view.horizontalHeader().sortIndicatorSection() == C_PARAMS
    assert t.view.columnWidth(C_PARAMS) == 131
    assert t.selected_names() == chosen
    assert m.name_at(t.model_row(t.view.currentIndex())) == cur
    assert activated == []           # the same tensor: nothing new to tell the window
    # selecting elsewhere (the browser, the map) moves the sorted table's current row
    other = "model.layers.0.mlp.down_proj.weight"
    window.select(other)
    assert m.name_at(t.model_row(t.view.currentIndex())) == other
    # a click on a sorted row tells the window its tensor
    last = t.view.model().index(t.view.model().rowCount() - 1, C_NAME)
    t.view.setCurrentIndex(last)
    assert window.doc.current == m.name_at(t.model_row(last)) == activated[-1]
    # and the other order, through the proxy as usual
    t.view.sortByColumn(C_PARAMS, Qt.SortOrder.AscendingOrder)
    keys = [view.index(r, C_PARAMS).data(SORT_ROLE) for r in range(view.rowCount())]
    assert keys == sorted(keys)

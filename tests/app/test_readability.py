"""Issue 10, point 5 (the rest): the tree's width is resizable and remembered; the channel
plot's y label is not clipped and its legend does not cover the outliers; roles fit; unchecked
checkboxes have a visible box; the add-rule dialog is a sensible size with a short pattern.
And the fast drawing paths (app.perf) keep the picture: peaks survive the decimation."""

import re

import numpy as np
import pytest
from PySide6.QtCore import QSettings
from PySide6.QtGui import QColor, QFontMetrics

from app.scheme_table import RuleDialog, common_pattern
from app.table_model import C_ROLE

from apphelpers import minilm_path, wait_idle

Q = "model.layers.0.self_attn.q_proj.weight"


def test_tree_width_is_resizable_and_remembered(make_window, qtbot, tmp_path):
    from app.main_window import MainWindow
    from app.messages import RecordedMessages
    win = make_window()
    total = sum(win.main_split.sizes())
    win.main_split.setSizes([520, total - 520])
    assert win.main_split.sizes()[0] == 520          # the splitter handle resizes the tree
    win.save_settings()
    again = MainWindow(messages=RecordedMessages(), settings=win.settings, autosave=False)
    qtbot.addWidget(again)
    again.resize(win.size())
    again.show()
    qtbot.waitExposed(again)
    assert abs(again.main_split.sizes()[0] - 520) <= 2
    again.runner.shutdown()


def test_channel_plot_label_legend_and_roles(window, qtbot):
    window.resize(1280, 800)
    window.fit_layout()
    window.select(Q)
    wait_idle(qtbot, window)
    qtbot.wait(50)
    ranges = window.plots.ranges
    item = ranges.getPlotItem()
    axis = item.getAxis("left")
    label = axis.labelString()
    assert "(x" not in label                       # no SI prefix to clip: "value (x0.00"
    fm = QFontMetrics(axis.label.font())
    assert fm.horizontalAdvance(axis.label.toPlainText()) < axis.boundingRect().height()
    # the legend is the title line, not a box inside the plot over the outliers
    assert item.legend is None and "outliers" in item.titleLabel.text
    # the histogram's too (its box covered the peak when the range was lopsided)
    hist = window.plots.histogram.getPlotItem()
    assert hist.legend is None and "dequantized" in hist.titleLabel.text
    # roles fit their column whole
    t = window.table
    cell = t.view.fontMetrics()
    widest = max(cell.horizontalAdvance(window.doc.model.info(n).role)
                 for n in window.doc.names())
    # (a narrow window hides the column, app.table_columns: the width it is shown at)
    shown = t.view.columnWidth(C_ROLE) if not t.view.isColumnHidden(C_ROLE) else t.columns.natural[C_ROLE]
    assert shown >= widest + 8


def test_unchecked_checkbox_has_a_visible_box(window):
    box = window.plots.log_box
    assert not box.isChecked()
    img = box.grab().toImage()
    border = QColor("#7d8595")
    found = sum(1 for x in range(0, min(20, img.width())) for y in range(img.height())
                if abs(QColor(img.pixel(x, y)).red() - border.red()) < 24
                and abs(QColor(img.pixel(x, y)).blue() - border.blue()) < 24
                and QColor(img.pixel(x, y)).red() > 90)
    assert found >= 12                              # the box's border is drawn
    box.setChecked(True)
    img = box.grab().toImage()
    blue = sum(1 for x in range(0, min(20, img.width())) for y in range(img.height())
               if QColor(img.pixel(x, y)).blue() > 200 and QColor(img.pixel(x, y)).red() < 120)
    assert blue >= 20                               # checked: filled with the accent colour
    box.setChecked(False)


def test_add_rule_dialog_size_and_short_patterns(window, qtbot):
    names = window.doc.names()
    q = [n for n in names if n.endswith("q_proj.weight")]
    assert common_pattern(q, names) == r"re:q_proj\.weight$"
    norms = [n for n in names if "layernorm" in n]
    pat = common_pattern(norms, names)
    assert len(pat) < 60 and {n for n in names if re.search(pat[3:], n)} == set(norms)
    dlg = RuleDialog(window.doc, pat, window)
    dlg.show()
    qtbot.waitExposed(dlg)
    assert dlg.width() >= 600
    assert dlg.match.fontMetrics().horizontalAdvance(dlg.match.text()) < dlg.match.width()
    assert dlg.count.text().startswith(f"matches {len(norms)} tensor(s): ")
    dlg.close()


def test_rule_pattern_on_minilm_is_not_a_39_name_alternation():
    path = minilm_path()
    if path is None:
        pytest.skip("MiniLM not installed")
    from workbench.formats.loaders import open_model
    names = list(open_model(path).tensors)
    for chosen in ([n for n in names if n.endswith("LayerNorm.weight")],
                   [n for n in names if n.endswith(".bias")],
                   [n for n in names if "attention" in n and n.endswith(".weight")]):
        pat = common_pattern(chosen, names)
        assert len(pat) < 120, pat
        assert {n for n in names if re.search(pat[3:], n)} == set(chosen)


def test_envelope_keeps_peaks_at_pixel_width():
    from app.plots.channels import buckets_for, envelope_to
    rng = np.random.default_rng(0)
    n = 30000
    lo, hi = -rng.random(n), rng.random(n)
    hi[12345], lo[54] = 7.0, -9.0
    ab = np.maximum(-lo, hi)
    b = buckets_for(n, 400)
    assert b == 800
    x, elo, ehi, eab = envelope_to(np.arange(n, dtype=float), lo, hi, ab, b)
    assert x.size <= b and ehi.max() == 7.0 and elo.min() == -9.0 and eab.max() == 9.0
    assert buckets_for(300, 400) == 300              # never more buckets than channels


def test_fast_and_old_paths_draw_the_same_extremes(window, qtbot):
    from app import perf
    window.select(Q)
    wait_idle(qtbot, window)
    st = window.doc.stats[Q]
    plot = window.plots.ranges
    assert perf.FAST and plot.band.isVisible()
    path = plot.band.path()
    r = path.boundingRect()
    assert r.top() == pytest.approx(float(np.nanmin(st.ch_min)))
    assert r.bottom() == pytest.approx(float(np.nanmax(st.ch_max)))
    (x0, x1), (y0, y1) = plot.getPlotItem().vb.viewRange()
    assert x0 <= 0 and x1 >= st.ch_min.size - 1
    assert y0 <= float(np.nanmin(st.ch_min)) and y1 >= float(np.nanmax(st.ch_absmax))
    # the outliers are drawn where they are
    o = np.flatnonzero(plot.outliers)
    assert plot.out_points.data.size == o.size


def _marker_boxes(plot):
    """Scene rectangles of every marker drawn on the comparison plot: each point at its
    drawn size, the ring of each Pareto point, the current scheme's ring."""
    from PySide6.QtCore import QPointF, QRectF
    vb = plot.getPlotItem().getViewBox()
    boxes = []

    def add(x, y, size):
        c = vb.mapViewToScene(QPointF(float(x), float(y)))
        boxes.append(QRectF(c.x() - size / 2, c.y() - size / 2, size, size))
    d = plot.scatter.data
    for x, y, s in zip(d["x"], d["y"], d["size"]):
        add(x, y, s if s > 0 else plot.scatter.opts["size"])
    for item in (plot.rings, plot.cur):
        for x, y in zip(item.data["x"], item.data["y"]):
            add(x, y, item.opts["size"])
    return boxes


def _assert_label_clear(plot, text):
    label = plot.cur_label
    assert label is not None and label.isVisible() and label.toPlainText() == text
    # the text itself (TextItem pads it by a few pixels), in scene coordinates
    rect = label.mapRectToScene(label.boundingRect()).adjusted(3, 4, -3, -4)
    vb = plot.getPlotItem().getViewBox()
    # inside the plotting area: clear of the axes' tick labels, the axis titles and the
    # legend line above the plot (the only other labels of this plot)
    assert vb.sceneBoundingRect().contains(rect), text
    for box in _marker_boxes(plot):
        assert not rect.intersects(box), (text, rect, box)
    others = [t for t in plot.placer.texts if t is not label and t.isVisible()]
    for t in others:
        assert not rect.intersects(t.mapRectToScene(t.boundingRect()).adjusted(3, 4, -3, -4))


def test_comparison_current_label_clears_points_and_labels(qtbot):
    """The current scheme's name on the bits/weight-vs-SQNR plot never covers a point marker
    (its own ring included) or another label, for every scheme of a real tensor as the current
    one, and with methods (four markers per scheme, near-equal figures)."""
    import math
    from app.comparison_model import MethodPoint
    from app.plots.scheme_points import SchemePointsPlot
    from workbench.formats.loaders import open_model
    from workbench.planning.scheme_choice import tensor_points
    from apphelpers import DEMO
    pts = tensor_points(open_model(str(DEMO)), Q)
    plot = SchemePointsPlot()
    qtbot.addWidget(plot)
    plot.resize(620, 400)
    plot.show()
    qtbot.waitExposed(plot)
    plot.set_points(pts, pts[0].scheme)
    qtbot.wait(20)
    assert len(plot.points) > 90
    for p in plot.points:
        plot.set_current(p.scheme)
        _assert_label_clear(plot, p.scheme)
    # methods: each quantizing scheme four times, the figures a little apart
    mpts = []
    for p in plot.points:
        if not math.isfinite(p.sqnr_db) or p.bits_per_weight > 9:
            continue
        for k, m in enumerate(("rtn", "imatrix", "gptq", "awq")):
            mpts.append(MethodPoint(p.scheme, m, p.family, p.bits_per_weight,
                                    p.sqnr_db + 0.4 * k, p.sqnr_db, p.rel_rmse, p.bytes,
                                    p.pareto and k == 2))
    plot.set_points(mpts, (mpts[0].scheme, "gptq"))
    qtbot.wait(20)
    for p in mpts[::3]:
        plot.set_current((p.scheme, p.method))
        _assert_label_clear(plot, f"{p.scheme} · {p.method}")


def test_comparison_caption_fits_at_1280(window, qtbot):
    """The caption above the comparison table shows a whole form at 1280x800 (it was cut by
    the method boxes: "◆ Pareto · ● curr"), its text stays the fullest form."""
    window.resize(1280, 800)
    window.fit_layout()
    window.select(Q)
    window.tabs.setCurrentIndex(2)
    wait_idle(qtbot, window, 120000)
    label = window.comparison.label
    qtbot.wait(20)
    shown = label.shown_text()
    assert shown in label._forms and not shown.endswith("…")
    assert label.fontMetrics().horizontalAdvance(shown) <= label.contentsRect().width()
    assert label.text().startswith(Q) and "click a point" in label.text()


def test_comparison_at_1280_shows_key_columns_and_the_whole_plot(window, qtbot):
    """At 1280x800 the comparison table shows Scheme, Bits/w, SQNR and Rel. RMSE whole (it
    showed Scheme, Bits/w and a sliver of SQNR), the header text clears the sort arrow, and
    the plot beside it is no wider than its pane (its unwrapped legend had widened the plot
    item past the pane: the right end of the axis, 24 and 32 bits, was cut off)."""
    from app.comparison_model import C_BITS, C_REL, C_SCHEME, C_SQNR, COLUMNS
    window.resize(1280, 800)
    window.fit_layout()
    window.select(Q)
    window.tabs.setCurrentIndex(2)
    wait_idle(qtbot, window, 120000)
    qtbot.wait(20)
    cmp = window.comparison
    view = cmp.view
    hdr = view.horizontalHeader()
    right = max(hdr.sectionViewportPosition(c) + hdr.sectionSize(c)
                for c in (C_SCHEME, C_BITS, C_SQNR, C_REL))
    assert right <= view.viewport().width(), (right, view.viewport().width())
    fm = hdr.fontMetrics()
    for c in (C_BITS, C_SQNR, C_REL):
        # centred text, a sort arrow of about 12 px at the right: 14 px clear on each side
        assert hdr.sectionSize(c) - fm.horizontalAdvance(COLUMNS[c]) >= 28 + 8, COLUMNS[c]
    plot = cmp.plot
    assert plot.width() >= cmp.PLOT_MIN - 2
    item = plot.getPlotItem()
    assert item.geometry().width() <= plot.width() + 0.5, (item.geometry().width(), plot.width())
    assert item.titleLabel.item.boundingRect().width() <= plot.width()
    # the whole log axis is in view: the 32 bits/weight tick lies inside the plot
    vb = item.getViewBox()
    from PySide6.QtCore import QPointF
    x32 = vb.mapViewToScene(QPointF(float(np.log10(32.0)), 0.0)).x()
    assert 0 < x32 <= plot.width()
    # moving the divider is the user's choice: a resize shares the change out as usual
    # instead of fitting the table again (which would put it back near 476 px)
    cmp.split.moveSplitter(300, 1)
    kept = cmp.split.sizes()[0]
    assert kept < cmp.table_want() - 100
    window.resize(1300, 800)
    qtbot.wait(20)
    assert abs(cmp.split.sizes()[0] - kept) <= 20

"""The window at 1280×800 and 1920×1080 (issue 49, seen on the SmolLM2 GGUF's screenshots):
the scheme table fits its pane without sideways scrolling, the heat map's row labels lie
inside the plot (the top one sat half off it), and the budget slider keeps a usable width
(it was squeezed to its handle)."""

from __future__ import annotations

import pytest

from apphelpers import wait_idle

pytest.importorskip("transformers")

SLOW = 180000
QUICK = {"effects/measure": "weight", "effects/schemes": "q4_0,q5_0,q8_0,q4_k,q6_k"}
SIZES = [(1280, 800), (1920, 1080)]
SLIDER_MIN = 120     # px: room to drag over the frontier's range, not only the handle


def _settle(qtbot, win, size):
    win.resize(*size)
    qtbot.wait(50)
    wait_idle(qtbot, win, SLOW)


@pytest.mark.parametrize("size", SIZES)
def test_scheme_table_fits_without_sideways_scrolling(make_window, qtbot, size):
    from app.table_model import C_NOTE, COLUMNS
    win = make_window()
    win.tabs.setCurrentIndex(0)
    _settle(qtbot, win, size)
    t = win.table
    view, hdr = t.view, t.view.horizontalHeader()
    shown = [c for c in range(len(COLUMNS)) if not hdr.isSectionHidden(c)]
    total = sum(hdr.sectionSize(c) for c in shown)
    assert total <= view.viewport().width()
    assert not view.horizontalScrollBar().isVisible()
    assert view.horizontalScrollBar().maximum() == 0
    # the columns the table gives up at this width are named above it, and come back on request
    hidden = [COLUMNS[c] for c in range(len(COLUMNS)) if hdr.isSectionHidden(c)]
    if size[0] >= 1920:
        assert not hidden
    for name in hidden:
        assert name in t.hidden_label.toolTip()
    assert C_NOTE in shown and {"Tensor", "Scheme", "Bits/w", "SQNR dB"} <= {COLUMNS[c] for c in shown}
    # each shown header's text fits its section (no column squeezed to an ellipsis)
    fm = hdr.fontMetrics()
    for c in shown:
        assert fm.horizontalAdvance(COLUMNS[c]) <= hdr.sectionSize(c)


def test_a_hidden_column_can_be_shown_again(make_window, qtbot):
    from app.table_model import COLUMNS
    win = make_window()
    win.tabs.setCurrentIndex(0)
    _settle(qtbot, win, (1280, 800))
    t = win.table
    hdr = t.view.horizontalHeader()
    hidden = [c for c in range(len(COLUMNS)) if hdr.isSectionHidden(c)]
    assert hidden                                  # 1280 px cannot show all 13 columns
    t.set_column_shown(hidden[0], True)            # the header's context menu does this
    qtbot.wait(20)
    assert not hdr.isSectionHidden(hidden[0])
    _settle(qtbot, win, (1920, 1080))
    assert not any(hdr.isSectionHidden(c) for c in range(len(COLUMNS)))


def _label_rects(plot):
    """Scene rects of the left axis's tick labels, as pyqtgraph lays them out to paint."""
    from PySide6.QtGui import QImage, QPainter
    axis = plot.getPlotItem().getAxis("left")
    img = QImage(10, 10, QImage.Format.Format_ARGB32)
    p = QPainter(img)
    try:
        _axis, _ticks, texts = axis.generateDrawSpecs(p)
    finally:
        p.end()
    return [(axis.mapRectToScene(r), text) for r, _f, text in texts]


@pytest.mark.parametrize("size", SIZES)
def test_heat_map_row_labels_lie_inside_the_plot(make_window, qtbot, size):
    win = make_window(values=QUICK)
    win.tabs.setCurrentIndex(win.effects_tab_index)
    qtbot.waitUntil(lambda: win.effects.table() is not None, timeout=SLOW)
    _settle(qtbot, win, size)
    for plot in (win.sensitivity_view.heat, win.sensitivity_view.bars):
        win.sensitivity_view.stack.setCurrentWidget(plot)
        qtbot.wait(50)
        assert plot.names
        box = plot.getPlotItem().getViewBox().sceneBoundingRect()
        rects = _label_rects(plot)
        assert rects
        for r, text in rects:
            assert box.top() - 0.5 <= r.top() and r.bottom() <= box.bottom() + 0.5, (text, r, box)
        # each label names the row its centre points at
        vb = plot.getPlotItem().getViewBox()
        from app.commands import _short
        for r, text in rects:
            row = int(vb.mapSceneToView(r.center()).y())
            assert _short(plot.names[row]) == text


@pytest.mark.parametrize("kind", ["heat", "bars"])
@pytest.mark.parametrize("height", [234, 390])      # the plot's height at 1280×800, 1920×1080
def test_many_rows_labels_lie_inside_the_plot(qtbot, kind, height):
    """The SmolLM2 GGUF's 211 weight matrices: the top label sat half off the heat map."""
    import numpy as np
    from app.commands import _short
    from app.sensitivity_view import HeatMap, SortedBars
    names = [f"model.layers.{i // 7}.mlp.t{i % 7}.weight" for i in range(211)]
    plot = HeatMap() if kind == "heat" else SortedBars()
    qtbot.addWidget(plot)
    plot.resize(340, height)
    plot.show()
    qtbot.wait(20)
    values = np.geomspace(1e4, 1.0, 211 * 7).reshape(211, 7)
    if kind == "heat":
        plot.set_table(names, ["q4_0", "q4_k", "q5_0", "q5_k", "q6_k", "q8_0", "f16"], values)
    else:
        plot.set_values(names, values[:, 0])
    for _ in range(3):          # painted: the axis widens to its labels, the plot relays out
        plot.grab()
        qtbot.wait(20)
    vb = plot.getPlotItem().getViewBox()
    box = vb.sceneBoundingRect()
    rects = _label_rects(plot)
    assert len(rects) >= 8
    for r, text in rects:
        assert box.top() - 0.5 <= r.top() and r.bottom() <= box.bottom() + 0.5, (text, r, box)
        row = int(np.floor(vb.mapSceneToView(r.center()).y()))
        assert _short(plot.names[row]) == text


def test_row_labels_fit_a_short_plot_with_many_rows():
    """272 rows in 230 px (the SmolLM2 GGUF at 1280×800): the first label is that of a row
    whose centre lies half a label's height below the top."""
    from app.sensitivity_view import label_rows
    rows = label_rows(272, 230.0, 11.0)
    px = 230.0 / 272
    assert rows
    for i in rows:
        centre = (i + 0.5) * px
        assert 5.5 <= centre <= 230.0 - 5.5
    gaps = {b - a for a, b in zip(rows, rows[1:])}
    assert len(gaps) == 1 and gaps.pop() * px >= 12.0          # one row apart per label height
    assert label_rows(10, 230.0, 11.0) == list(range(10))      # tall rows: every one


@pytest.mark.parametrize("size", SIZES)
def test_budget_slider_keeps_a_usable_width(make_window, qtbot, size):
    win = make_window(values=QUICK)
    win.tabs.setCurrentIndex(win.effects_tab_index)
    qtbot.waitUntil(lambda: win.effects.table() is not None and bool(win.effects.frontier),
                    timeout=SLOW)
    _settle(qtbot, win, size)
    panel = win.budget_panel
    assert panel.slider.isVisible()
    assert panel.slider.width() >= SLIDER_MIN
    # the row's other controls stay whole beside it or above it
    for w in (panel.spin, panel.unit, panel.apply_button):
        assert w.width() >= w.minimumSizeHint().width()
    assert panel.slider.geometry().right() <= panel.contentsRect().right()


def _luma(c) -> float:
    return 0.2126 * c.red() + 0.7152 * c.green() + 0.0722 * c.blue()


@pytest.mark.parametrize("size", SIZES)
def test_budget_slider_groove_is_visible_past_its_handle(make_window, qtbot, size):
    """The SmolLM2 screenshots' slider looked squeezed to its handle: at a budget near the
    frontier's low end, the groove past the handle was drawn in nearly the panel's colour."""
    from PySide6.QtWidgets import QStyle, QStyleOptionSlider
    win = make_window(values=QUICK)
    win.tabs.setCurrentIndex(win.effects_tab_index)
    qtbot.waitUntil(lambda: win.effects.table() is not None and bool(win.effects.frontier),
                    timeout=SLOW)
    _settle(qtbot, win, size)
    s = win.budget_panel.slider
    s.blockSignals(True)
    s.setValue(s.minimum() + (s.maximum() - s.minimum()) // 16)     # near the low end
    s.blockSignals(False)
    opt = QStyleOptionSlider()
    s.initStyleOption(opt)
    st = s.style()
    handle = st.subControlRect(QStyle.ComplexControl.CC_Slider, opt,
                               QStyle.SubControl.SC_SliderHandle, s)
    img = s.grab().toImage()
    y = handle.center().y()
    back = _luma(img.pixelColor(handle.right() + 4, 0))             # the panel behind it
    xs = range(handle.right() + 4, s.width() - 6)
    assert len(xs) >= SLIDER_MIN - 40
    seen = [abs(_luma(img.pixelColor(x, yy)) - back) for x in xs
            for yy in (y - 1, y, y + 1)]
    # the groove's own colour stands out from the panel along its whole length
    columns = [max(seen[3 * k:3 * k + 3]) for k in range(len(xs))]
    assert min(columns) >= 25, (min(columns), back)

"""What the screenshot review of issue 10 found and fixed: names in the tree and table that
elided to identical labels, the check / status lines clipped mid-word in a narrow window, a
literal "&&", an empty sensitivity axis with crowded labels, and point labels covering each
other in the sensitivity and frontier plots."""

import numpy as np
import pytest
from PySide6.QtCore import QRectF
from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import QApplication

from app.format import shorten_name

from apphelpers import minilm_path, wait_idle

LAYER0 = ["attention.output.LayerNorm.bias", "attention.output.LayerNorm.weight",
          "attention.output.dense.bias", "attention.output.dense", "attention.self.key.bias",
          "attention.self.key", "attention.self.query.bias", "attention.self.query",
          "attention.self.value.bias", "attention.self.value", "intermediate.dense.bias",
          "intermediate.dense", "output.LayerNorm.bias", "output.LayerNorm.weight",
          "output.dense.bias", "output.dense"]


def test_shortened_bert_names_stay_distinct(qapp):
    fm = QFontMetrics(QApplication.font())
    for room in (90, 110, 130, 170):
        fits = (lambda t, room=room: fm.horizontalAdvance(t) <= room)
        shown = [shorten_name(n, fits) for n in LAYER0]
        # what eliding on the left alone showed: several identical labels
        left = [fm.elidedText(n, __import__("PySide6.QtCore").QtCore.Qt.TextElideMode.ElideLeft,
                              room) for n in LAYER0]
        assert len(set(shown)) == len(LAYER0), (room, shown)
        if room <= 130:
            assert len(set(left)) < len(LAYER0)
    # what the delegate paints: the shortened name, its middle elided when still too wide
    from PySide6.QtCore import Qt
    for room in (100, 120, 140):
        fits = (lambda t, room=room: fm.horizontalAdvance(t) <= room)
        painted = []
        for n in LAYER0:
            short = shorten_name(n, fits)
            mode = Qt.TextElideMode.ElideMiddle if short != n else Qt.TextElideMode.ElideLeft
            painted.append(fm.elidedText(short, mode, room))
        assert len(set(painted)) == len(LAYER0), (room, painted)
        assert painted[0] != painted[12]    # attention.output.LayerNorm.bias / output.Layer…
    assert shorten_name("attention.output.LayerNorm.bias", lambda t: len(t) <= 20) == \
        "a.o.LayerNorm.bias"
    assert shorten_name("output.dense", lambda t: True) == "output.dense"


def test_fit_label_keeps_its_text_and_paints_a_form_that_fits(qapp, qtbot):
    from app.fit_label import FitLabel
    label = FitLabel()
    qtbot.addWidget(label)
    forms = ["fell back: 34 tensors (84.3% of params) · kept: 64 tensors (0.1% of params)",
             "fell back: 34 (84.3%) · kept: 64 (0.1%)", ""]
    label.set_forms(forms)
    label.resize(2000, 20)
    assert label.text() == forms[0] and label.shown_text() == forms[0]
    fm = label.fontMetrics()
    label.resize(fm.horizontalAdvance(forms[1]) + 10, 20)
    assert label.text() == forms[0] and label.shown_text() == forms[1]
    label.resize(30, 20)
    assert label.shown_text() == ""


def test_narrow_window_check_and_status_lines_fit(make_window, qtbot):
    win = make_window()
    win.resize(1280, 800)
    qtbot.wait(50)
    panel, bar = win.check_panel, win.totals
    fx = win.effects
    fx.figures = {"model_kind": "causal-lm", "samples": 16, "tokens": 404, "kl_mean": 0.1188,
                  "kl_p99": 0.634, "top1_agree": 0.338, "ppl": 681.6, "ppl_base": 651.1}
    panel.refresh()
    qtbot.wait(20)
    for label in (panel.value, panel.caption, bar.status, bar.fallbacks):
        shown = label.shown_text()
        room = label.contentsRect().width()
        assert label.fontMetrics().horizontalAdvance(shown) <= room, (label.text(), shown)
    assert "KL 0.1188" in panel.value.text()          # the fullest form stays the text
    # llama.cpp's rounding modelled (issue 49): the caption's longer forms say so, and the
    # panel still fits without widening
    width = panel.width()
    fx.figures = {**fx.figures, "emulate": "llama.cpp"}
    panel.refresh()
    qtbot.wait(20)
    shown = panel.caption.shown_text()
    assert panel.caption.fontMetrics().horizontalAdvance(shown) <= \
        panel.caption.contentsRect().width(), shown
    assert panel.width() == width and "llama.cpp rounding" in panel.caption.toolTip()


def test_sensitivity_pane_without_table(window):
    pane = window.findChild(__import__("app.sensitivity_view", fromlist=["x"]).TensorSensitivity)
    window.select("model.layers.0.self_attn.q_proj.weight")
    assert "&&" not in pane.summary.text() and "Sensitivity & Budget" in pane.summary.text()
    assert not pane.plot.isVisibleTo(pane)     # no empty log axis with crowded labels


def test_point_labels_do_not_overlap(qapp, qtbot):
    import pyqtgraph as pg
    from app.plots.labels import LabelPlacer
    w = pg.PlotWidget()
    qtbot.addWidget(w)
    w.resize(260, 220)
    w.show()
    qtbot.wait(20)
    item = w.getPlotItem()
    item.setXRange(3, 9, padding=0)
    item.setYRange(-3, 1, padding=0)
    # pairs of schemes at nearly the same place (q4_0 / q4_k, q5_0 / q5_k, ...)
    pts = [(4.5, 0.0, "q4_0"), (4.55, -0.05, "q4_k"), (5.5, -1.0, "q5_0"), (5.55, -1.05, "q5_k"),
           (6.6, -1.8, "q6_k"), (8.1, -2.4, "int8-channel"), (8.5, -2.5, "q8_0")]
    # and six schemes at one place: not all can have a label there
    pts += [(7.0 + 0.01 * k, -0.5, f"int{k}-g32") for k in range(6)]
    placer = LabelPlacer(item)
    placer.set([(x, y, s, "#fff") for x, y, s in pts], [(x, y) for x, y, _ in pts])
    shown = [t for t in placer.texts if t.isVisible()]
    assert 7 <= len(shown) < len(pts)
    assert {"q4_0", "q4_k", "q5_0", "q5_k"} <= {t.toPlainText() for t in shown}
    # the text areas (TextItem pads its text by a few pixels) never overlap
    rects = [t.mapRectToScene(t.boundingRect()).adjusted(3, 4, -3, -4) for t in shown]
    for i in range(len(rects)):
        for j in range(i + 1, len(rects)):
            assert not rects[i].intersects(rects[j]), (shown[i].toPlainText(),
                                                       shown[j].toPlainText())
    assert shown[0].toPlainText() == "q4_0"           # the first candidate always placed

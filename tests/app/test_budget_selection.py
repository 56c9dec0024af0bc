"""The budget view as a user sees it (issue 49): applying a budget keeps the current tensor
selected; the budget status line elides with its whole text in a tooltip instead of being cut,
at 1280×800 and 1920×1080; the export dialog's long texts wrap."""

from __future__ import annotations

import pytest

from apphelpers import wait_idle

pytest.importorskip("transformers")

SLOW = 180000
#: the weight measure over a few schemes: a quick table on the demo model
QUICK = {"effects/measure": "weight", "effects/schemes": "q4_0,q5_0,q8_0,q4_k,q6_k"}
PICK = "model.layers.1.mlp.up_proj.weight"


def _open_budget(win, qtbot):
    win.tabs.setCurrentIndex(win.effects_tab_index)
    qtbot.waitUntil(lambda: win.effects.table() is not None and bool(win.effects.frontier),
                    timeout=SLOW)
    wait_idle(qtbot, win, SLOW)


def _selected(win) -> str | None:
    """The tensor the layer table shows as current (its row's name)."""
    t = win.table
    idx = t.view.currentIndex()
    return t.model.name_at(t.model_row(idx)) if idx.isValid() else None


@pytest.mark.parametrize("sort", [None, 1])
def test_applying_a_budget_keeps_the_current_tensor(make_window, qtbot, sort):
    from PySide6.QtCore import Qt
    win = make_window(values=QUICK)
    _open_budget(win, qtbot)
    t = win.table
    if sort is not None:         # the table sorted by a column (a header click)
        t.view.sortByColumn(sort, Qt.SortOrder.AscendingOrder)
    win.select(PICK)
    t.view.setFocus()
    assert win.doc.current == PICK
    panel = win.budget_panel
    depth = win.undo_stack.count()
    panel.unit.setCurrentIndex(0)
    panel.spin.setValue(5.0)
    panel.apply_budget()
    qtbot.waitUntil(lambda: win.undo_stack.count() > depth, timeout=SLOW)
    wait_idle(qtbot, win, SLOW)
    assert win.doc.current == PICK
    assert _selected(win) == PICK
    idx = t.view.currentIndex()          # and in sight
    assert t.view.viewport().rect().intersects(t.view.visualRect(idx))


def test_a_card_moved_by_the_budget_stays_current(make_window, qtbot):
    """The user clicked PICK's card in the tier board; the budget moves it to another tier:
    the card's old column must not make its neighbour the current tensor."""
    win = make_window(values=QUICK)
    _open_budget(win, qtbot)
    board = win.tiers
    col = next(c for c in board.columns if PICK in c.model.names)
    row = col.model.names.index(PICK)
    col.view.setCurrentIndex(col.model.index(row))          # as a click on the card does
    assert win.doc.current == PICK
    before = win.doc.scheme_of(PICK)
    panel = win.budget_panel
    panel.unit.setCurrentIndex(0)
    for bpw in (3.0, 8.0):          # one of them moves PICK's card to another tier
        depth = win.undo_stack.count()
        panel.spin.setValue(bpw)
        panel.apply_budget()
        qtbot.waitUntil(lambda: win.undo_stack.count() > depth, timeout=SLOW)
        wait_idle(qtbot, win, SLOW)
        if win.doc.scheme_of(PICK) != before:
            break
    assert win.doc.scheme_of(PICK) != before
    assert win.doc.current == PICK
    assert _selected(win) == PICK


@pytest.mark.parametrize("size", [(1280, 800), (1920, 1080)])
def test_budget_line_elides_with_the_whole_text_in_its_tooltip(make_window, qtbot, size):
    win = make_window(values=QUICK)
    win.resize(*size)
    _open_budget(win, qtbot)
    panel = win.budget_panel
    panel.unit.setCurrentIndex(0)
    panel.spin.setValue(5.0)
    panel.apply_budget()
    qtbot.waitUntil(lambda: panel.result.text().startswith("allocated"), timeout=SLOW)
    wait_idle(qtbot, win, SLOW)
    full = panel.result.text()
    assert "as evaluate counts them" in full and "predicted error" in full
    lab = panel.result
    fm = lab.fontMetrics()
    # at the window's own width, what is painted fits the label: never cut at its edge
    assert fm.horizontalAdvance(lab.shown_text()) <= lab.contentsRect().width()
    assert full in lab.toolTip()
    # narrower than its text: a shorter whole form, or an ellipsis, never cut mid-word
    lab.setFixedWidth(fm.horizontalAdvance(full) // 2)
    shown = lab.shown_text()
    assert shown != full and fm.horizontalAdvance(shown) <= lab.contentsRect().width()
    assert shown.startswith("allocated") and "predicted" in shown
    lab.setFixedWidth(80)
    assert lab.shown_text().endswith("…")
    # wide enough: the whole line
    lab.setFixedWidth(fm.horizontalAdvance(full) + 40)
    assert panel.result.shown_text() == full


def test_export_dialog_long_texts_wrap(make_window, qtbot):
    from app.export_dialog import ExportDialog
    from workbench.core.progress import Progress
    win = make_window()
    dlg = ExportDialog(win.doc, win.runner, parent=win)
    qtbot.addWidget(dlg)
    dlg.show()
    wait_idle(qtbot, win)
    long = ("wrote /a/folder/with/a/long/name/model-q4.safetensors, but no tensor can be "
            "quantized in compressed-tensors with this plan's schemes: every tensor is "
            "written dense (float16), 12 of them larger than the plan asked")
    for text in (long, "x " * 120):
        dlg.status.setText(text)
        qtbot.wait(50)
        lab = dlg.status
        assert lab.wordWrap()
        # every line of it is inside the label: its height is what its width needs
        assert lab.height() >= lab.heightForWidth(lab.width()) > lab.fontMetrics().height()
    # a progress message is shown whole (wrapped), not cut at 60 characters mid-word
    msg = "quantizing model.layers.1.mlp.down_proj.weight with gptq (fitted on the calibration)"
    dlg._progress(Progress(1, 2, msg))
    assert dlg.status.text() == msg


def test_an_exact_sqnr_has_no_unit():
    """The screenshot of a GGUF kept as it is read "MODEL SQNR exact dB"."""
    import math
    from app.format import db_text
    assert db_text(math.inf) == "exact"
    assert db_text(20.984) == "20.98 dB"
    assert db_text(None) == "…"
    assert db_text(math.nan) == "n/a"


def test_a_long_verdict_is_cut_at_a_word_with_the_whole_text_in_the_tooltip():
    """The SmolLM2 GGUF's compressed-tensors verdict read "... 271 tensors kept in …"."""
    from app.export_dialog import _short
    text = ("can write; no tensor can be quantized as the plan asks (written dense); 1 rules "
            "skipped on tensors the runtime never re-types (21.0% of parameters); 271 tensors "
            "kept in their own dtype (100.0% of parameters)")
    short = _short(text)
    assert len(short) <= 172 and short.endswith(" …")
    assert text.startswith(short[:-2])                      # a whole-word prefix of it
    assert text[len(short) - 2] == " "
    assert _short("short verdict") == "short verdict"

"""The scheme cell editor never misleads (issue 49): its text is never clipped, a scheme the
tensor cannot take is listed as unavailable with the reason, typing its name with the list open
says why instead of picking another, and one Return (or one click) commits."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox

from app.scheme_picker import UNAVAILABLE_ROLE, find_scheme
from app.table_model import C_SCHEME

from apphelpers import wait_idle

Q = "model.layers.0.self_attn.q_proj.weight"


@pytest.fixture
def wide384(tmp_path):
    """A model whose rows are 384 long, as MiniLM's: no K-quant (blocks of 256) can take them."""
    from safetensors.numpy import save_file
    rng = np.random.default_rng(0)
    t = {Q: (0.05 * rng.standard_normal((384, 384))).astype(np.float32),
         "model.layers.0.mlp.up_proj.weight":
             (0.05 * rng.standard_normal((768, 384))).astype(np.float32)}
    path = tmp_path / "wide384.safetensors"
    save_file(t, str(path))
    return path


def _editor(win) -> QComboBox:
    t = win.table
    idx = t.view_index(t.model.row_of(Q), C_SCHEME)
    t.view.setCurrentIndex(idx)
    t.view.edit(idx)
    editor = t.view.findChild(QComboBox)
    assert editor is not None and editor.isEditable()
    return editor


def test_the_editor_is_as_tall_as_its_text_needs(make_window, qtbot, wide384):
    win = make_window(path=wide384)
    ed = _editor(win)
    row = win.table.view.rowHeight(win.table.model.row_of(Q))
    assert ed.sizeHint().height() > 0
    assert ed.height() >= ed.sizeHint().height(), (ed.height(), ed.sizeHint().height(), row)


def test_unavailable_schemes_are_listed_with_the_reason(make_window, qtbot, wide384):
    win = make_window(path=wide384)
    ed = _editor(win)
    i = find_scheme(ed, "q4_k")
    assert i >= 0, "q4_k is listed (greyed), not left out"
    why = ed.itemData(i, UNAVAILABLE_ROLE)
    assert "256" in why and "384" in why
    assert not ed.model().item(i).isEnabled()
    j = find_scheme(ed, "q4_0")
    assert ed.itemData(j, UNAVAILABLE_ROLE) is None and ed.model().item(j).isEnabled()


def test_typing_an_unavailable_name_with_the_list_open_says_why(make_window, qtbot, wide384):
    win = make_window(path=wide384)
    before = win.doc.scheme_of(Q)
    ed = _editor(win)
    ed.showPopup()
    qtbot.waitUntil(ed.view().isVisible, timeout=5000)
    qtbot.keyClick(ed.view(), "q")          # the first key goes to the open list ...
    assert not ed.view().isVisible() and ed.lineEdit().hasFocus()
    qtbot.keyClicks(ed.lineEdit(), "4_k")   # ... the next ones to the text field it opened
    assert ed.lineEdit().text() == "q4_k"
    qtbot.keyClick(ed.lineEdit(), Qt.Key.Key_Return)
    wait_idle(qtbot, win)
    assert win.doc.scheme_of(Q) == before and win.undo_stack.count() == 0
    msg = win.statusBar().currentMessage()
    assert "q4_k is not available" in msg and "256" in msg and Q in msg


def test_one_return_in_the_open_list_commits(make_window, qtbot, wide384):
    win = make_window(path=wide384)
    ed = _editor(win)
    ed.showPopup()
    qtbot.waitUntil(ed.view().isVisible, timeout=5000)
    i = find_scheme(ed, "q8_0")
    ed.view().setCurrentIndex(ed.model().index(i, 0))
    qtbot.keyClick(ed.view(), Qt.Key.Key_Return)
    wait_idle(qtbot, win)
    assert win.doc.scheme_of(Q) == "q8_0" and win.undo_stack.count() == 1
    assert win.table.view.findChild(QComboBox) is None or not win.table.view.findChild(
        QComboBox).isVisible()

"""Issue 33, "small things from the same walk": the scheme picker opens on a double-click, the
table's last column fits at 1600×1000, a dragged card stays selected, a tier box and its summary
agree."""

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox

from app.table_model import C_SCHEME

Q = "model.layers.0.self_attn.q_proj.weight"


def test_scheme_picker_list_opens_on_double_click(window, qtbot):
    t = window.table
    window.tabs.setCurrentIndex(0)
    idx = t.view_index(t.model.row_of(Q), C_SCHEME)
    t.view.scrollTo(idx)
    # a double-click on the scheme cell opens the editor with its grouped list shown
    pos = t.view.visualRect(idx).center()
    qtbot.mouseClick(t.view.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    assert t.view.findChild(QComboBox) is None      # one click only selects the row
    qtbot.mouseDClick(t.view.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    ed = t.view.findChild(QComboBox)
    assert ed is not None
    qtbot.waitUntil(lambda: ed.view().isVisible(), timeout=3000)
    ed.hidePopup()
    qtbot.waitUntil(lambda: not ed.view().isVisible(), timeout=3000)
    # and a double-click in the editor's text field opens it again (not only Alt+Down)
    qtbot.mouseDClick(ed.lineEdit(), Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: ed.view().isVisible(), timeout=3000)
    ed.hidePopup()


def test_dragged_cards_stay_selected_after_the_drop(window):
    from PySide6.QtCore import QModelIndex
    from app.tier_placement import NAME_ROLE
    doc, board = window.doc, window.tiers
    src, dst = board.columns[1], board.columns[2]
    moved = [Q, "lm_head.weight"]
    rows = [src.model.names.index(n) for n in moved]
    for r in rows:
        src.view.selectionModel().select(src.model.index(r),
                                         src.view.selectionModel().SelectionFlag.Select)
    mime = src.model.mimeData([src.model.index(r) for r in rows])
    dst.model.dropMimeData(mime, Qt.DropAction.MoveAction, -1, -1, QModelIndex())
    assert doc.scheme_of(Q) == "int4-g128"
    picked = {i.data(NAME_ROLE) for i in dst.view.selectionModel().selectedIndexes()}
    assert picked == set(moved)
    assert dst.view.currentIndex().data(NAME_ROLE) in moved
    assert doc.current in moved


def test_table_last_column_fits_at_1600x1000(window, qtbot):
    from PySide6.QtCore import QSize
    from PySide6.QtGui import QResizeEvent
    t = window.table
    window.tabs.setCurrentIndex(0)
    for size in ((1600, 1000), (1920, 1080)):
        window.resize(*size)           # as `screenshot --size 1600x1000` lays the window out
        window.fit_layout()
        qtbot.waitUntil(lambda: window.width() == size[0])
        hdr = t.view.horizontalHeader()
        last = max(c for c in range(hdr.count()) if not hdr.isSectionHidden(c))
        vp = t.view.viewport().width()
        # the last column (Note) starts inside the viewport with room for its header text,
        # and ends at its right edge: nothing is cut off, no sideways scrolling
        right = hdr.sectionViewportPosition(last) + hdr.sectionSize(last)
        assert right <= vp, (size, right, vp)
        label = t.model.headerData(last, Qt.Orientation.Horizontal)
        assert hdr.sectionSize(last) >= hdr.fontMetrics().horizontalAdvance(label) + 16
        assert t.view.horizontalScrollBar().maximum() == 0
        # the name column keeps a readable width
        assert hdr.sectionSize(0) >= 160


def test_tier_box_and_summary_agree(window):
    from PySide6.QtCore import QModelIndex
    from app import commands
    from app.tier_placement import members
    doc, board = window.doc, window.tiers
    col = board.columns[3]                       # "3-bit and less", int3-g128, empty
    assert members(doc, 3) == [] and col.scheme.currentText() == "int3-g128"
    # a plan puts int3-g64 there (nearest in bits): the box shows what the cards have, and
    # the summary does not contradict it ("all int3-g64" under a box reading int3-g128)
    window.push(commands.assign(doc, [Q], "int3-g64"))
    assert members(doc, 3) == [Q]
    assert col.scheme.currentText() == "int3-g64"
    assert col.summary.text().startswith("1 tensor") and "int3" not in col.summary.text()
    # a drop assigns the scheme the box shows
    src = board.columns[1].model
    mime = src.mimeData([src.index(src.names.index("lm_head.weight"))])
    col.model.dropMimeData(mime, Qt.DropAction.MoveAction, -1, -1, QModelIndex())
    assert doc.scheme_of("lm_head.weight") == "int3-g64"
    assert col.scheme.currentText() == "int3-g64" and col.summary.text().startswith("2 tensors")
    # choosing the tier's own scheme in the box assigns it to every card
    col.scheme.setCurrentText("int3-g128")
    col._scheme_chosen()
    assert {doc.scheme_of(n) for n in members(doc, 3)} == {"int3-g128"}
    assert col.scheme.currentText() == "int3-g128" and "mixed" not in col.summary.text()
    # mixed members: the box shows the tier's scheme, the summary says how many schemes
    window.push(commands.assign(doc, [Q], "int2-g64"))
    assert col.scheme.currentText() == "int3-g128" and "mixed: 2 schemes" in col.summary.text()
    # a tier of kept tensors shows "keep" in its box (the registry's list has no keep)
    window.push(commands.assign(doc, members(doc, 3), "keep"))
    fp16 = board.columns[0]
    assert {doc.scheme_of(n) for n in members(doc, 0)} == {"keep"}
    assert fp16.scheme.currentText() == "keep" and "all" not in fp16.summary.text()

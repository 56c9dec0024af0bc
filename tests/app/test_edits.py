"""Edits: assign in the table (model value, totals = evaluate_tensor), tiers drag, undo/redo."""

import json
import math
import subprocess
import sys

import pytest
from PySide6.QtCore import QMimeData, QModelIndex, Qt

from workbench.quant.evaluate import evaluate_tensor, totals_of
from workbench.formats.loaders import open_model

from app.table_model import C_BYTES, C_SCHEME, C_SQNR
from app.tier_placement import MIME, members

from apphelpers import DEMO, wait_idle

Q = "model.layers.0.self_attn.q_proj.weight"


def expected_totals(doc):
    m = open_model(DEMO)
    return totals_of([evaluate_tensor(m, n, s) for n, s in doc.plan.resolve(m).items()])


def test_assign_in_table_updates_value_and_totals(window, qtbot):
    tm = window.table.model
    row = tm.row_of(Q)
    changed = []
    tm.dataChanged.connect(lambda a, b: changed.append((a.row(), b.row())))
    assert tm.setData(tm.index(row, C_SCHEME), "int4-g64")
    assert tm.index(row, C_SCHEME).data(Qt.ItemDataRole.EditRole) == "int4-g64"
    assert (row, row) in changed  # dataChanged for the edited row only
    assert all(a == b == row for a, b in changed)
    wait_idle(qtbot, window)
    r = evaluate_tensor(open_model(DEMO), Q, "int4-g64")
    assert tm.value(Q, C_BYTES) == r.bytes
    assert tm.value(Q, C_SQNR) == pytest.approx(r.error.sqnr_db)
    assert tm.index(row, C_SQNR).data() == f"{r.error.sqnr_db:.2f}"
    t = window.doc.totals()
    exp = expected_totals(window.doc)
    assert t.bytes_after == exp.bytes_after and t.pending == 0
    assert t.sqnr_db == pytest.approx(exp.sqnr_db)
    assert window.totals.sqnr.value.text() == f"{exp.sqnr_db:.2f} dB"
    assert window.undo_action.text() == "&Undo Assign int4-g64 to L0 self_attn.q_proj"


def test_scheme_editor_lists_only_eligible_schemes(window):
    from app.commands import schemes_for
    from workbench.schemes import get_scheme
    info = window.doc.model.info(Q)
    names = schemes_for(info)
    assert names[0] == "keep" and "int4-g128" in names
    assert all(get_scheme(s).ineligible_reason(info.shape) is None for s in names[1:])
    vec = window.doc.model.info("model.norm.weight")
    assert all(get_scheme(s).block_size is None or 256 % get_scheme(s).block_size == 0
               for s in schemes_for(vec)[1:])


def test_assign_to_multi_selection_is_one_undoable_edit(window, qtbot):
    from PySide6.QtCore import QItemSelectionModel
    t = window.table
    names = [f"model.layers.{i}.mlp.up_proj.weight" for i in range(3)]
    sel = t.view.selectionModel()
    sel.clearSelection()
    for n in names:
        idx = t.view_index(t.model.row_of(n), 0)
        sel.select(idx, QItemSelectionModel.SelectionFlag.Select | QItemSelectionModel.SelectionFlag.Rows)
    assert t.selected_names() == names
    t.assign_combo.setCurrentText("nf4-g64")
    count = window.undo_stack.count()
    t.assign_selection()
    assert window.undo_stack.count() == count + 1
    assert all(window.doc.scheme_of(n) == "nf4-g64" for n in names)
    window.undo_stack.undo()
    assert all(window.doc.scheme_of(n) == "int8-channel" for n in names)


def test_drag_to_tier_then_undo_redo(window, qtbot):
    doc = window.doc
    tiers = window.tiers
    assert [c.model.tier for c in tiers.columns] == [0, 1, 2, 3]
    int8 = members(doc, 1)
    assert Q in int8 and members(doc, 2) == []
    # drop two cards on the 4-bit column through the model/view drop API
    src = tiers.columns[1].model
    rows = [src.names.index(Q), src.names.index("lm_head.weight")]
    mime = src.mimeData([src.index(r) for r in rows])
    assert mime.hasFormat(MIME)
    dst = tiers.columns[2].model
    assert dst.canDropMimeData(mime, Qt.DropAction.MoveAction, -1, -1, QModelIndex())
    dst.dropMimeData(mime, Qt.DropAction.MoveAction, -1, -1, QModelIndex())
    assert doc.scheme_of(Q) == doc.scheme_of("lm_head.weight") == "int4-g128"
    assert set(dst.names) == {Q, "lm_head.weight"}
    assert Q not in src.names
    assert "Move 2 tensors to 4-bit" in window.undo_action.text()
    # the table follows
    tm = window.table.model
    assert tm.index(tm.row_of(Q), C_SCHEME).data(Qt.ItemDataRole.EditRole) == "int4-g128"
    wait_idle(qtbot, window)
    assert doc.totals().bytes_after == expected_totals(doc).bytes_after
    # undo with the keyboard (Ctrl+Z), redo with Ctrl+Shift+Z
    window.activateWindow()
    window.undo_action.trigger() if not window.isActiveWindow() else qtbot.keyClick(
        window, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier)
    assert doc.scheme_of(Q) == "int8-channel" and Q in src.names and dst.names == []
    assert "Move 2 tensors to 4-bit" in window.redo_action.text()
    window.redo_action.trigger()
    assert doc.scheme_of(Q) == "int4-g128"
    assert window.undo_action.shortcut().toString() == "Ctrl+Z"
    assert window.redo_action.shortcut().toString() == "Ctrl+Shift+Z"


def test_tier_scheme_change_reassigns_members(window, qtbot):
    doc = window.doc
    window.tiers.set_scheme(1, "int8-g64")
    assert doc.tiers[1].scheme == "int8-g64"
    assert all(doc.scheme_of(n) == "int8-g64" for n in members(doc, 1))
    assert len(members(doc, 1)) == 23
    window.undo_stack.undo()
    assert doc.tiers[1].scheme == "int8-channel"
    assert doc.scheme_of(Q) == "int8-channel"


def test_rule_commands_and_comparison(window, qtbot):
    from app import commands
    window.push(commands.add_rule(window.doc, r"re:\.mlp\.", "int4-g128"))
    mlp = [n for n in window.doc.names() if ".mlp." in n]
    assert all(window.doc.scheme_of(n) == "int4-g128" for n in mlp)
    assert window.table.rules_button.text() == "Rules (1)"
    window.push(commands.remove_rule(window.doc, 0))
    assert all(window.doc.scheme_of(n) == "int8-channel" for n in mlp)
    # comparison: every eligible scheme evaluated for the selected tensor
    name = "model.layers.0.self_attn.k_proj.weight"
    window.select(name)
    window.tabs.setCurrentIndex(2)
    wait_idle(qtbot, window, 120000)
    cm = window.comparison.model
    assert cm.name == name and len(cm.schemes) > 20
    r = evaluate_tensor(open_model(DEMO), name, "int4-g32")
    row = cm.schemes.index("int4-g32")
    from app.comparison_model import C_SQNR
    assert cm.value("int4-g32", C_SQNR) == pytest.approx(r.error.sqnr_db)
    window.comparison._assign(window.comparison.proxy.mapFromSource(cm.index(row, 0)))
    assert window.doc.scheme_of(name) == "int4-g32"


def test_commands_module_is_qt_free():
    code = ("import sys, app.commands, app.tiers, app.session, app.analysis, app.throughput, "
            "app.format; bad=[m for m in sys.modules if m.startswith(('PySide6','pyqtgraph'))]; "
            "print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_command_objects_do_undo_on_plain_document():
    from app import commands
    from app.tiers import DEFAULT_TIERS
    from workbench.quant.plan import Plan

    class Doc:
        model = open_model(DEMO)
        plan, tiers = Plan(), DEFAULT_TIERS

        def set_state(self, plan, tiers):
            self.plan, self.tiers = plan, tiers

    d = Doc()
    cmd = commands.assign(d, [Q, "model.norm.weight"], "q4_0")
    cmd.do(d)
    assert d.plan.scheme_for(Q) == "q4_0"
    cmd.undo(d)
    assert d.plan == Plan()
    assert commands.assign(d, ["model.layers.0.self_attn.k_proj.bias"], "int4-g256") is None

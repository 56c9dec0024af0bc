"""Tier setup edits: add / rename / remove tiers, undo / redo, sessions, the last tier refused."""

import json

from PySide6.QtWidgets import QDialog, QDialogButtonBox

from app import commands
from app.tier_board import TierDialog
from app.tier_placement import members
from app.tiers import DEFAULT_TIERS, Tier

Q = "model.layers.0.self_attn.q_proj.weight"
DEFAULT_NAMES = ["FP16", "INT8", "4-bit", "3-bit and less"]


def names(doc):
    return [t.name for t in doc.tiers]


def titles(board):
    return [c.title.text().split("<b>")[1].split("</b>")[0] for c in board.columns]


def answer(name, scheme=None, seen=None):
    """A `run_dialog` that fills the real dialog in and presses OK (never blocks)."""
    def run(dlg):
        if seen is not None:
            seen.append(dlg)
        dlg.name.setText(name)
        if scheme is not None:
            dlg.scheme.setCurrentText(scheme)
        ok = dlg.buttons.button(QDialogButtonBox.StandardButton.Ok)
        if not ok.isEnabled():
            return QDialog.DialogCode.Rejected
        return QDialog.DialogCode.Accepted
    return run


def test_add_tier_through_dialog_then_undo_redo(window, qtbot):
    doc, board = window.doc, window.tiers
    q6 = members(doc, 1)[:2]
    window.push(commands.assign(doc, q6, "int6-g128"))
    # 6.125 bits/weight: nearer INT8 (8.0) than 4-bit (4.125), so the cards stay in INT8
    assert all(n in members(doc, 1) for n in q6)
    plan = doc.plan
    seen = []
    board.run_dialog = answer("INT6", "int6-g128", seen)
    assert Q in q6
    window.select(members(doc, 1)[0])  # current tensor is in INT8: the new tier goes after it
    assert board.add_tier() is True
    assert names(doc) == ["FP16", "INT8", "INT6", "4-bit", "3-bit and less"]
    assert doc.tiers[2] == Tier("INT6", "int6-g128", 6.0)
    assert doc.plan == plan  # tiers are a view: no scheme changed
    assert len(board.columns) == 5 and titles(board)[2] == "INT6"
    assert board.columns[2].scheme.currentText() == "int6-g128"
    assert sorted(board.columns[2].model.names) == sorted(q6)  # assigned its scheme -> member
    assert not any(n in board.columns[3].model.names for n in q6)
    assert window.undo_action.text() == "&Undo Add tier 'INT6'"
    # the dialog lists the registry's schemes
    from workbench.schemes import list_schemes
    combo = seen[0].scheme
    assert [combo.itemText(i) for i in range(combo.count())] == list_schemes()
    window.undo_action.trigger()
    assert names(doc) == DEFAULT_NAMES and len(board.columns) == 4
    assert all(n in board.columns[1].model.names for n in q6)  # nearest: INT8
    assert window.redo_action.text() == "&Redo Add tier 'INT6'"
    window.redo_action.trigger()
    assert names(doc) == ["FP16", "INT8", "INT6", "4-bit", "3-bit and less"]
    assert titles(board)[2] == "INT6"


def test_add_tier_from_header_menu_after_that_tier(window):
    board = window.tiers
    menu = board.columns[0].tier_menu()
    labels = [a.text() for a in menu.actions()]
    assert labels == ["Add Tier After 'FP16'…", "Rename Tier 'FP16'…", "Remove Tier 'FP16'"]
    board.run_dialog = answer("BF16", "bf16")
    menu.actions()[0].trigger()
    assert names(window.doc)[:2] == ["FP16", "BF16"]
    # min_bits stays in order (highest first) even for a scheme above its neighbour
    board.run_dialog = answer("FP32", "fp32")
    board.columns[2].tier_menu().actions()[0].trigger()  # after INT8
    t = window.doc.tiers
    assert names(window.doc)[3] == "FP32" and t[3].min_bits == t[2].min_bits == 8
    assert all(a.min_bits >= b.min_bits for a, b in zip(t, t[1:]))


def test_add_tier_cancelled_or_duplicate_name_changes_nothing(window):
    board, doc = window.tiers, window.doc
    count = window.undo_stack.count()
    board.run_dialog = lambda dlg: QDialog.DialogCode.Rejected
    assert board.add_tier(1) is False
    board.run_dialog = answer("int8", "int6-g64")  # duplicate (case-insensitive): OK disabled
    assert board.add_tier(1) is False
    assert names(doc) == DEFAULT_NAMES and window.undo_stack.count() == count
    # given directly (no dialog), a duplicate is a message, not a crash
    assert board.add_tier(1, "INT8", "int6-g64") is False
    assert window.messages.errors[-1] == ("Cannot add tier", "there is already a tier named 'INT8'")
    dlg = TierDialog(doc.tiers, "Add", "", "fp16")
    assert not dlg.buttons.button(QDialogButtonBox.StandardButton.Ok).isEnabled()
    assert dlg.problem.text() == "a tier needs a name"
    dlg.name.setText("W6")
    assert dlg.buttons.button(QDialogButtonBox.StandardButton.Ok).isEnabled()
    assert dlg.values() == ("W6", "fp16")


def test_rename_tier_then_undo_redo(window):
    board, doc = window.tiers, window.doc
    plan = doc.plan
    board.run_dialog = answer("W8")
    menu = board.columns[1].tier_menu()
    menu.actions()[1].trigger()
    assert names(doc) == ["FP16", "W8", "4-bit", "3-bit and less"]
    assert doc.tiers[1].scheme == "int8-channel" and doc.plan == plan
    assert titles(board)[1] == "W8" and Q in board.columns[1].model.names
    assert window.undo_action.text() == "&Undo Rename tier 'INT8' to 'W8'"
    window.undo_stack.undo()
    assert names(doc) == DEFAULT_NAMES and titles(board)[1] == "INT8"
    window.undo_stack.redo()
    assert titles(board)[1] == "W8"
    # moving cards names the renamed tier
    board.drop([Q], 2)
    assert window.undo_action.text().endswith("to 4-bit")
    # renaming to another tier's name is refused
    count = window.undo_stack.count()
    assert board.rename_tier(0, "4-BIT") is False
    assert window.messages.errors[-1][0] == "Cannot rename tier"
    assert window.undo_stack.count() == count and names(doc)[0] == "FP16"


def test_remove_tier_members_rebin_then_undo_redo(window):
    board, doc = window.tiers, window.doc
    plan = doc.plan
    int8 = members(doc, 1)
    assert Q in int8 and len(int8) == 23
    window.select(Q)
    assert board.current_tier() == 1
    assert board.remove_tier() is True
    assert names(doc) == ["FP16", "4-bit", "3-bit and less"] and len(board.columns) == 3
    assert doc.plan == plan and doc.scheme_of(Q) == "int8-channel"  # schemes kept
    # 8 bits/weight: nearer 4-bit (4.125) than FP16 (16) → the 4-bit tier (app.tiers.tier_index)
    assert sorted(board.columns[1].model.names) == sorted(int8)
    assert window.undo_action.text() == "&Undo Remove tier 'INT8'"
    window.undo_stack.undo()
    assert names(doc) == DEFAULT_NAMES and sorted(board.columns[1].model.names) == sorted(int8)
    assert board.columns[2].model.names == []
    window.undo_stack.redo()
    assert names(doc) == ["FP16", "4-bit", "3-bit and less"]
    # removing the last column: its members fall to the new last tier
    window.push(commands.assign(doc, [Q], "int3-g128"))
    assert Q in board.columns[2].model.names
    board.remove_tier(2)
    assert Q in board.columns[1].model.names and doc.scheme_of(Q) == "int3-g128"


def test_removing_the_last_tier_is_refused(window):
    board, doc = window.tiers, window.doc
    for _ in range(3):
        assert board.remove_tier(0) is True
    assert names(doc) == ["3-bit and less"] and len(board.columns) == 1
    # every card is in the only tier
    assert len(board.columns[0].model.names) == sum(
        1 for i in doc.model.tensors.values() if i.ndim >= 2 and i.is_float)
    assert not board.columns[0].tier_menu().actions()[2].isEnabled()
    count = window.undo_stack.count()
    assert board.remove_tier(0) is False
    assert window.messages.errors[-1] == (
        "Cannot remove tier", "'3-bit and less' is the only tier; the board needs at least one")
    assert names(doc) == ["3-bit and less"] and window.undo_stack.count() == count


def test_edit_menu_has_tier_actions(window):
    edit = next(a.menu() for a in window.menuBar().actions() if a.text() == "&Edit")
    acts = {a.text(): a for a in edit.actions()}
    window.tiers.run_dialog = answer("Q6", "q6_k")
    window.select(Q)
    acts["Add &Tier…"].trigger()
    assert names(window.doc)[2] == "Q6"
    window.tiers.run_dialog = answer("Eight")
    acts["Rena&me Tier…"].trigger()
    assert names(window.doc)[1] == "Eight"
    acts["Remo&ve Tier"].trigger()
    assert "Eight" not in names(window.doc)
    assert window.undo_action.text() == "&Undo Remove tier 'Eight'"


def test_tier_setup_round_trips_through_session(make_window, qtbot, tmp_path):
    win = make_window()
    doc = win.doc
    win.push(commands.add_tier(doc, 1, "INT6", "int6-g64"))
    win.push(commands.rename_tier(doc, 0, "Half"))
    win.push(commands.remove_tier(doc, 4))
    expected = (Tier("Half", "fp16", 16.0), Tier("INT8", "int8-channel", 8.0),
                Tier("INT6", "int6-g64", 6.0), Tier("4-bit", "int4-g128", 4.0))
    assert doc.tiers == expected
    path = tmp_path / "s.json"
    assert win.save_session(path=str(path)) == str(path)
    data = json.loads(path.read_text())
    assert [t["name"] for t in data["tiers"]] == ["Half", "INT8", "INT6", "4-bit"]
    other = make_window(path=None)
    other.open_session(str(path))
    qtbot.waitUntil(lambda: other.doc.model is not None, timeout=30000)
    assert other.doc.tiers == expected
    assert titles(other.tiers) == ["Half", "INT8", "INT6", "4-bit"]
    assert [c.scheme.currentText() for c in other.tiers.columns] == [
        "fp16", "int8-channel", "int6-g64", "int4-g128"]
    # and back to the defaults with undo in the first window
    for _ in range(3):
        win.undo_stack.undo()
    assert doc.tiers == DEFAULT_TIERS


def test_tier_commands_on_plain_document():
    from workbench.core.errors import WorkbenchError
    from workbench.quant.plan import Plan

    class Doc:
        model = None
        plan, tiers = Plan(), DEFAULT_TIERS

        def set_state(self, plan, tiers):
            self.plan, self.tiers = plan, tiers

    d = Doc()
    cmd = commands.add_tier(d, -1, " FP32 ", "fp32")
    assert cmd.label == "Add tier 'FP32'"
    cmd.do(d)
    assert d.tiers[0] == Tier("FP32", "fp32", 32.0) and len(d.tiers) == 5
    cmd.undo(d)
    assert d.tiers == DEFAULT_TIERS
    assert commands.rename_tier(d, 1, "INT8") is None
    for bad in (lambda: commands.add_tier(d, 0, "  ", "fp16"),
                lambda: commands.add_tier(d, 0, "X", "no-such-scheme"),
                lambda: commands.rename_tier(d, 2, "fp16")):
        try:
            bad()
        except WorkbenchError:
            pass
        else:
            raise AssertionError("expected WorkbenchError")
    d.tiers = DEFAULT_TIERS[:1]
    try:
        commands.remove_tier(d, 0)
    except WorkbenchError as exc:
        assert "only tier" in str(exc)
    else:
        raise AssertionError("removing the last tier must be refused")

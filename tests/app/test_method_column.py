"""The plan table's Method column: shows each tensor's method from the plan, edits it as an
undoable command (exact-name rules keeping the scheme), and the plan JSON carries it."""

from PySide6.QtCore import Qt

from app.table_model import C_METHOD, C_SCHEME

from apphelpers import wait_idle

Q = "model.layers.0.self_attn.q_proj.weight"
NORM = "model.layers.0.input_layernorm.weight"


def test_method_column_edit_undo(window, qtbot):
    tm = window.table.model
    row = tm.row_of(Q)
    assert tm.index(row, C_METHOD).data() == "rtn"
    assert tm.index(tm.row_of(NORM), C_METHOD).data() == "—"          # 1-D: no method
    assert not (tm.flags(tm.index(tm.row_of(NORM), C_METHOD)) & Qt.ItemFlag.ItemIsEditable)
    assert tm.flags(tm.index(row, C_METHOD)) & Qt.ItemFlag.ItemIsEditable
    scheme = tm.index(row, C_SCHEME).data(Qt.ItemDataRole.EditRole)
    changed = []
    tm.dataChanged.connect(lambda a, b: changed.append((a.row(), b.row(), b.column())))
    assert tm.setData(tm.index(row, C_METHOD), "gptq")
    assert tm.index(row, C_METHOD).data() == "gptq"
    assert any(a == row == b and col >= C_METHOD for a, b, col in changed)  # repainted
    assert window.doc.plan.method_for(Q) == "gptq"
    assert window.doc.plan.scheme_for(Q) == scheme                     # the scheme is kept
    assert window.doc.plan.to_dict()["rules"][-1] == {"match": Q, "scheme": scheme,
                                                      "method": "gptq"}
    assert window.undo_action.text() == "&Undo Method gptq for L0 self_attn.q_proj"
    window.undo_action.trigger()
    assert tm.index(row, C_METHOD).data() == "rtn"
    # an assignment of another scheme keeps the tensor's method
    assert tm.setData(tm.index(row, C_METHOD), "awq")
    assert tm.setData(tm.index(row, C_SCHEME), "int4-g64")
    wait_idle(qtbot, window)
    assert window.doc.plan.method_for(Q) == "awq"
    assert tm.index(row, C_METHOD).data() == "awq"

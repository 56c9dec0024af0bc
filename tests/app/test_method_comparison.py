"""The comparison view compares methods as well as schemes (issue 12): ticking methods adds a
row per (scheme, method) whose figures are workbench.running.methods_compare's for that tensor, the
plot shows one series per method with the Pareto front across all, a click assigns scheme and
method as one undoable edit, and without a runnable model the method boxes say why not."""

import shutil

import pytest
from PySide6.QtCore import Qt

from app import commands
from app.comparison_model import C_METHOD, C_OUT, C_SCHEME, C_SQNR
from app.plots.scheme_points import METHOD_SYMBOLS
from workbench.formats.loaders import open_model
from workbench.running.methods_compare import evaluate_method, tensor_stats
from workbench.core.progress import run
from workbench.planning.scheme_choice import pareto_front

from apphelpers import DEMO, wait_idle

Q = "model.layers.0.self_attn.q_proj.weight"
METHODS = ("rtn", "imatrix", "gptq", "awq")


def test_method_rows_match_workbench_and_click_assigns_both(window, qtbot, tmp_path):
    doc, cmp = window.doc, window.comparison
    start = (doc.scheme_of(Q), doc.method_of(Q))
    assert start[1] == "rtn"
    window.push(commands.assign(doc, [Q], "int4-g128"))
    window.select(Q)
    window.tabs.setCurrentIndex(2)
    wait_idle(qtbot, window, 300000)
    assert all(b.isEnabled() for b in cmp.method_boxes.values())
    assert cmp.view.isColumnHidden(C_OUT) and cmp.view.isColumnHidden(C_METHOD)
    cmp.set_methods(["imatrix", "gptq", "awq"], scope="current")
    cm = cmp.model
    # long work shows in the work queue with Cancel, as other long work does (once: the
    # status bar does not repeat it)
    qtbot.waitUntil(lambda: window.progress.task is not None
                    and window.progress.task.name.startswith("Calibration inputs of"), timeout=60000)
    queue = window.work_queue

    def row():
        return next((r for r in queue.rows if r.task is not None and r.isVisible()
                     and r.task.name.startswith("Calibration inputs of")), None)
    qtbot.waitUntil(lambda: row() is not None, timeout=5000)   # listed after 250 ms
    assert not window.progress.isVisible()
    qtbot.mouseClick(row().cancel, Qt.MouseButton.LeftButton)
    wait_idle(qtbot, window, 300000)
    assert cm.value("int4-g128", C_OUT, "gptq") is None
    assert cm.index(cm.rows.index(("int4-g128", "gptq")), C_OUT).data() == "…"
    qtbot.mouseClick(cmp.run_button, Qt.MouseButton.LeftButton)     # computes what is missing
    wait_idle(qtbot, window, 300000)
    assert cm.scope == ["int4-g128"] and not cmp.view.isColumnHidden(C_OUT)
    for m in METHODS[1:]:
        assert ("int4-g128", m) in cm.rows
    row = cm.rows.index(("int4-g128", "gptq"))
    assert cm.index(row, C_SCHEME).data().startswith("int4-g128 · gptq")   # (◆: Pareto)
    assert cm.index(row, C_METHOD).data() == "gptq"

    # the numbers are the headless workbench function's for that tensor / scheme / method
    model = open_model(DEMO)
    stats = run(tensor_stats(model, [Q], cmp.comparer.calib()))
    peers = cmp.comparer.peers(Q)
    got = {}
    for m in METHODS:
        mr = run(evaluate_method(model, Q, "int4-g128", m, stats, peers))
        got[m] = mr
        assert cm.value("int4-g128", C_OUT, m) == pytest.approx(mr.out_sqnr_db, rel=1e-6)
        assert cm.value("int4-g128", C_SQNR, m) == pytest.approx(mr.result.error.sqnr_db,
                                                                rel=1e-6)
        assert mr.result.method == m
    # GPTQ beats RTN on the layer output error at 4 bits (by more than 2 dB here)
    assert got["gptq"].out_rel < got["rtn"].out_rel
    assert cm.value("int4-g128", C_OUT, "gptq") > cm.value("int4-g128", C_OUT, "rtn") + 2.0

    # the plot: one series per method (own marker), Pareto across all, layer output SQNR
    cmp.refresh_plot()
    plot = cmp.plot
    assert plot.methods_mode and plot.getPlotItem().getAxis("left").labelText == \
        "layer output SQNR dB"
    assert {(p.scheme, p.method) for p in plot.points} == {("int4-g128", m) for m in METHODS}
    spots = plot.scatter.data
    assert {str(s) for s in spots["symbol"]} == {METHOD_SYMBOLS[m] for m in METHODS}
    front = pareto_front((p.label, p.bits_per_weight, p.sqnr_db) for p in plot.points)
    assert {p.label for p in plot.points if p.pareto} == front
    assert "int4-g128 · gptq" in front

    # a different current scheme joins the scope (rows already made stay)
    window.push(commands.assign(doc, [Q], start[0]))
    wait_idle(qtbot, window, 300000)
    assert cm.scope == sorted({"int4-g128", start[0]}, key=cm.schemes.index)
    assert (start[0], "gptq") in cm.rows
    assert plot.current == (start[0], "rtn")

    # a click on the int4-g128 · gptq point assigns scheme and method as one edit
    cmp.refresh_plot()
    i = plot.index_of("int4-g128", "gptq")
    assert i is not None
    count = window.undo_stack.count()
    qtbot.mouseClick(plot.viewport(), Qt.MouseButton.LeftButton,
                     pos=plot.mapFromScene(plot.scene_pos(i)))
    assert (doc.scheme_of(Q), doc.method_of(Q)) == ("int4-g128", "gptq")
    assert window.undo_stack.count() == count + 1
    assert window.undo_action.text() == "&Undo Assign int4-g128 · gptq to L0 self_attn.q_proj"
    assert plot.current == ("int4-g128", "gptq")
    assert cm.index(row, C_SCHEME).data().startswith("● int4-g128 · gptq")
    window.undo_stack.undo()
    assert (doc.scheme_of(Q), doc.method_of(Q)) == start
    # a row activation does the same
    cmp.view.activated.emit(cmp.proxy.mapFromSource(cm.index(cm.rows.index(
        ("int4-g128", "awq")), 0)))
    assert (doc.scheme_of(Q), doc.method_of(Q)) == ("int4-g128", "awq")
    window.undo_stack.undo()
    assert (doc.scheme_of(Q), doc.method_of(Q)) == start

    # a fold peer's method change: the pairs are measured again in the new plan
    before = cm.value("int4-g128", C_OUT, "awq")
    window.push(commands.set_method(doc, ["model.layers.0.self_attn.k_proj.weight"], "awq"))
    assert cm.value("int4-g128", C_OUT, "awq") is None
    wait_idle(qtbot, window, 300000)
    assert cm.value("int4-g128", C_OUT, "awq") == pytest.approx(before, rel=1e-6)  # v: no fold

    # a calibration file that is gone disables the methods, saying why
    window.effects.calib = str(tmp_path / "gone.txt")
    cmp.update_method_boxes()
    assert not cmp.method_boxes["gptq"].isEnabled()
    assert "gone.txt does not exist" in cmp.method_boxes["gptq"].toolTip()


def test_methods_disabled_without_a_runnable_model(make_window, qtbot, tmp_path):
    weights_only = tmp_path / "model.safetensors"
    shutil.copy(DEMO, weights_only)                       # no config.json beside it
    win = make_window(weights_only)
    win.select(Q)
    win.tabs.setCurrentIndex(2)
    wait_idle(qtbot, win, 300000)
    cmp = win.comparison
    for b in cmp.method_boxes.values():
        assert not b.isEnabled()
        assert "not runnable" in b.toolTip() and "config.json" in b.toolTip()
    cmp.set_methods(["gptq"])
    assert not cmp.model.methods_on and cmp.view.isColumnHidden(C_OUT)
    assert all(m == "rtn" for _s, m in cmp.model.rows)


def test_method_scope_is_the_pareto_front_of_every_result_in_hand(window, qtbot):
    """The default scope (the RTN Pareto schemes + the current one) comes from every
    evaluated scheme, not from the Pareto marks of the last plot refresh (at most every
    150 ms while results stream in): methods started right after the comparison had a
    scope of 30-49 instead of 49 schemes on MiniLM, varying from run to run."""
    from workbench.running.methods_compare import applies
    cmp = window.comparison
    window.select(Q)
    window.tabs.setCurrentIndex(2)
    wait_idle(qtbot, window, 300000)
    cmp._replot.stop()
    cm = cmp.model
    pts = cm._rtn_points()
    assert len(pts) == len(cm.schemes) > 20           # every scheme evaluated
    front = pareto_front((p.scheme, p.bits_per_weight, p.sqnr_db) for p in pts)
    cm.pareto = set()                                  # marks as a late plot refresh leaves them
    methods = ["gptq"]
    want = [s for s in cm.schemes if applies("gptq", s) is None
            and (s in front or s == window.doc.scheme_of(Q))]
    assert len(want) > 5
    assert cmp._scope(methods) == want
    assert cm.pareto == front

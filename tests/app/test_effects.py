"""Issue 11 in the window: end-to-end check figures (stale while re-running), the sensitivity
views, the budget control and the frontier plot, on the demo model (a runnable causal LM)."""

import shutil

import numpy as np
import pytest
from PySide6.QtCore import QSettings, Qt

from apphelpers import DEMO, wait_idle

pytest.importorskip("transformers")

SLOW = 180000
SEVEN = ("q4_0", "q5_0", "q8_0", "q3_k", "q4_k", "q5_k", "q6_k")
WINDOW_CHECK = True   # these windows run the end-to-end check, as a user's does


def _linear(win):
    return [n for n in win.doc.model.tensors if n.endswith("proj.weight")]


def _headless_check(win):
    from workbench.core.progress import run
    from workbench.running.runner_jobs import check
    fx = win.effects
    return run(check(win.doc.model, win.doc.plan, fx.calib, fx.samples))


def _plan_totals(win):
    from workbench.quant.evaluate import evaluate
    from workbench.core.progress import run
    return run(evaluate(win.doc.model, win.doc.plan)).totals


def test_check_goes_stale_then_fresh_with_the_figures_check_computes(make_window, qtbot):
    from app import commands
    win = make_window()
    fx = win.effects
    qtbot.waitUntil(lambda: fx.check_state == "fresh", timeout=SLOW)
    before = dict(fx.figures)
    assert before["model_kind"] == "causal-lm" and before["samples"] == fx.samples
    assert "KL" in win.check_panel.value.text() and win.check_panel.badge.text() == "CURRENT"
    runs = fx.check_runs

    assert win.push(commands.assign(win.doc, _linear(win), "q3_k"))
    assert fx.check_state == "stale"
    assert win.check_panel.badge.text().startswith("STALE")
    # a second edit while the first check is queued or running: the first result is dropped
    qtbot.waitUntil(lambda: fx._check_task is not None, timeout=SLOW)
    assert win.push(commands.assign(win.doc, _linear(win)[:3], "q8_0"))
    assert fx.check_state == "stale"
    qtbot.waitUntil(lambda: fx.check_state == "fresh", timeout=SLOW)
    wait_idle(qtbot, win, SLOW)
    assert fx.check_runs == runs + 1
    after = fx.figures
    assert win.check_panel.badge.text() == "CURRENT"
    assert f"{after['kl_mean']:.4f}" in win.check_panel.value.text()
    # q3_k on most weights moves the outputs much more than the demo plan's int8-channel
    assert after["kl_mean"] > 3 * before["kl_mean"]
    headless = _headless_check(win)
    for k in ("kl_mean", "kl_p99", "top1_agree", "ppl", "ppl_base"):
        assert after[k] == pytest.approx(headless[k], rel=1e-6, abs=1e-9)


def test_the_check_models_llama_cpp_rounding_for_a_plan_of_llama_cpp_types():
    """A plan of GGML block types is planned for llama.cpp: the end-to-end check asks for its
    activation rounding (check_job's emulate, issue 49); a plan of a type llama.cpp has no
    tensor type for, or of float types alone, is not."""
    from app.effects_jobs import llama_bound
    from workbench.api.plans import Plan
    from workbench.formats.loaders import open_model
    model = open_model(DEMO)
    lin = [n for n in model.tensors if n.endswith("proj.weight")]
    assert llama_bound(model, Plan(default="q4_k"))
    assert llama_bound(model, Plan(default="fp16").with_assignments({lin[0]: "q6_k"}))
    assert not llama_bound(model, Plan(default="int8-channel"))
    assert not llama_bound(model, Plan(default="q4_k").with_assignments({lin[0]: "int8-channel"}))
    assert not llama_bound(model, Plan(default="fp16"))


def test_check_toggle_is_remembered_and_stops_the_runs(make_window, qtbot, tmp_path):
    from app import commands
    from app.effects import PlanEffects
    win = make_window()
    fx = win.effects
    qtbot.waitUntil(lambda: fx.check_state == "fresh", timeout=SLOW)
    win.check_panel.enabled_box.setChecked(False)
    assert fx.check_state == "off" and not fx.check_enabled
    runs = fx.check_runs
    assert win.push(commands.assign(win.doc, _linear(win), "q4_0"))
    wait_idle(qtbot, win, SLOW)
    qtbot.wait(DEBOUNCE_WAIT)
    wait_idle(qtbot, win, SLOW)
    assert fx.check_runs == runs and fx.check_state == "off"
    again = PlanEffects(win.doc, win.runner, win.settings, win.push)
    assert again.check_enabled is False
    win.check_panel.enabled_box.setChecked(True)
    assert fx.check_state == "stale"
    qtbot.waitUntil(lambda: fx.check_state == "fresh", timeout=SLOW)
    assert fx.check_runs == runs + 1


DEBOUNCE_WAIT = 900


def test_calibration_file_is_used_and_remembered(make_window, qtbot, tmp_path):
    win = make_window()
    fx = win.effects
    calib = tmp_path / "mine.txt"
    calib.write_text("the cat sat on the mat\nhello world again\nnumbers 1 2 3 4\n")
    fx.set_calib(str(calib))
    qtbot.waitUntil(lambda: fx.check_state == "fresh" and fx.figures["samples"] == 3,
                    timeout=SLOW)
    assert win.settings.value("effects/calib") == str(calib)
    assert win.check_panel.calib_button.text() == "mine.txt"
    from app.effects import PlanEffects
    assert PlanEffects(win.doc, win.runner, win.settings, win.push).calib == str(calib)


def test_unrunnable_model_shows_the_runner_message_and_the_rest_works(make_window, qtbot,
                                                                       tmp_path):
    lone = tmp_path / "model.safetensors"
    shutil.copy(DEMO, lone)       # no config.json beside it
    win = make_window(lone)
    fx = win.effects
    qtbot.waitUntil(lambda: fx.check_state == "error", timeout=SLOW)
    assert "not runnable" in win.check_panel.value.text()
    assert "config.json" in win.check_panel.value.text()
    wait_idle(qtbot, win, SLOW)
    assert win.doc.totals().sqnr_db is not None           # weight-only figures still there
    win.tabs.setCurrentIndex(win.effects_tab_index)
    qtbot.waitUntil(lambda: bool(fx.frontier), timeout=SLOW)   # weight measure needs no run


def _open_tab(win, qtbot):
    win.tabs.setCurrentIndex(win.effects_tab_index)
    qtbot.waitUntil(lambda: win.effects.table() is not None and bool(win.effects.frontier),
                    timeout=SLOW)
    wait_idle(qtbot, win, SLOW)


#: the weight measure over seven K-quant and legacy schemes (the window's default is the API's:
#: auto, over the runtime's candidates; test_budget_api.py)
WEIGHT_TABLE = {"effects/measure": "weight", "effects/schemes": ",".join(SEVEN)}


def test_sensitivity_heat_map_and_selected_tensor(make_window, qtbot):
    from workbench.quant.evaluate import evaluate_tensor
    win = make_window(values=WEIGHT_TABLE)
    fx = win.effects
    _open_tab(win, qtbot)
    table = fx.table()
    heat = win.sensitivity_view.heat
    assert sorted(heat.names) == sorted(n for n, i in win.doc.model.tensors.items()
                                        if i.ndim >= 2)
    n, s = "model.layers.0.mlp.down_proj.weight", "q4_k"
    assert table.value(n, s) == pytest.approx(evaluate_tensor(win.doc.model, n, s).error.sse)
    # most sensitive first (mean log10 over the schemes)
    logs = [np.nanmean(np.log10(table.row(x))) for x in heat.names]
    assert logs == sorted(logs, reverse=True)
    # a click on a row selects that tensor; its sensitivity shows beside the plots
    row = 4
    vb = heat.getPlotItem().vb
    from PySide6.QtCore import QPointF
    pos = heat.mapFromScene(vb.mapViewToScene(QPointF(1.5, row + 0.5)))
    qtbot.mouseClick(heat.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    assert win.doc.current == heat.names[row]
    from app.commands import _short
    assert _short(heat.names[row]) in win.tensor_sensitivity.summary.text()
    xs, ys = win.tensor_sensitivity.curve.getData()
    assert len(xs) == len(table.schemes)
    # sorted bars: shares of the plan's predicted error, largest first, summing to 100 %
    win.sensitivity_view.view_combo.setCurrentIndex(1)
    share = win.sensitivity_view.bars.share
    assert share.sum() == pytest.approx(100.0) and list(share) == sorted(share, reverse=True)


def test_activation_measure_differs_from_weight(make_window, qtbot):
    win = make_window(values=WEIGHT_TABLE)
    fx = win.effects
    _open_tab(win, qtbot)
    w = fx.table("weight")
    win.sensitivity_view.measure_combo.setCurrentText("activation")
    qtbot.waitUntil(lambda: fx.table("activation") is not None, timeout=SLOW)
    a = fx.table("activation")
    n = "model.layers.1.self_attn.q_proj.weight"
    assert a.value(n, "q4_0") is not None and a.value(n, "q4_0") != pytest.approx(w.value(n, "q4_0"))
    assert win.settings.value("effects/measure") == "activation"


def test_fisher_measure_in_the_window_equals_the_headless_table(make_window, qtbot):
    from workbench.planning.sensitivity import sensitivity_table
    win = make_window(values={"effects/schemes": ",".join(SEVEN),
                              "effects/sensitivity_samples": 8})
    fx = win.effects
    _open_tab(win, qtbot)
    combo = win.sensitivity_view.measure_combo
    assert [combo.itemText(i) for i in range(combo.count())] == \
        ["auto", "weight", "activation", "fisher", "output"]
    assert combo.currentText() == "auto" and fx.table().measure == "fisher"   # the API's
    combo.setCurrentText("fisher")
    qtbot.waitUntil(lambda: fx.table("fisher") is not None, timeout=SLOW)
    f = fx.table("fisher")
    ref = sensitivity_table(win.doc.model, SEVEN, "fisher", None, None, 8)
    n = "model.layers.1.mlp.down_proj.weight"
    for s in SEVEN:
        assert f.value(n, s) == pytest.approx(ref.value(n, s), rel=1e-9)
    # the output-change estimate grows as the scheme gets coarser
    assert f.value(n, "q3_k") > f.value(n, "q8_0") > 0


def test_budget_control_applies_one_undoable_edit_within_budget(make_window, qtbot):
    win = make_window()
    fx = win.effects
    _open_tab(win, qtbot)
    panel = win.budget_panel
    before = win.doc.plan
    depth = win.undo_stack.count()
    panel.unit.setCurrentIndex(0)
    panel.spin.setValue(5.0)           # debounced re-solve + apply
    qtbot.waitUntil(lambda: win.undo_stack.count() == depth + 1, timeout=SLOW)
    wait_idle(qtbot, win, SLOW)
    assert win.undo_stack.count() == depth + 1
    assert "5.000 bits/weight" in win.undo_stack.undoText()
    t = _plan_totals(win)
    assert 4.8 < t.bits_per_weight <= 5.0
    assert "allocated" in panel.result.text()
    win.undo_stack.undo()
    assert win.doc.plan == before

    # bytes, with a pinned tensor kept at its scheme
    pinned = "model.layers.0.self_attn.q_proj.weight"
    win.select(pinned)
    panel.pin_button.click()
    assert fx.pins == {pinned: win.doc.scheme_of(pinned)}
    qtbot.waitUntil(lambda: bool(fx.frontier), timeout=SLOW)
    panel.unit.setCurrentIndex(1)
    budget = int(1.1e6)
    panel.spin.setValue(budget / 1e6)
    panel.apply_budget()
    qtbot.waitUntil(lambda: "MB" in win.undo_stack.undoText(), timeout=SLOW)
    wait_idle(qtbot, win, SLOW)
    t = _plan_totals(win)
    assert budget - 40000 < t.bytes_after <= budget
    assert win.doc.scheme_of(pinned) == "int8-channel"


def test_clicking_a_frontier_point_applies_its_plan(make_window, qtbot):
    win = make_window()
    fx = win.effects
    _open_tab(win, qtbot)
    plot = win.budget_panel.plot
    allocated = [p for p in plot.points if p.kind == "allocated"]
    assert len(allocated) >= 6
    # the uniform plans and the allocated curve share the axes; allocation never loses
    for u in (p for p in plot.points if p.kind == "uniform"):
        fits = [p for p in allocated if p.bits_per_weight <= u.bits_per_weight + 1e-9]
        if fits:
            assert min(p.predicted for p in fits) <= u.predicted * (1 + 1e-9)
    target = allocated[len(allocated) // 2]
    before = win.doc.plan
    qtbot.mouseClick(plot.viewport(), Qt.MouseButton.LeftButton, pos=plot.widget_pos(target))
    wait_idle(qtbot, win, SLOW)
    assert "frontier" in win.undo_stack.undoText()
    for n, s in target.assignment.items():
        assert win.doc.scheme_of(n) == s
    t = _plan_totals(win)
    assert t.bytes_after == target.bytes
    cur = fx.current_point()
    assert cur.bits_per_weight == pytest.approx(target.bits_per_weight)
    assert cur.predicted == pytest.approx(target.predicted)
    win.undo_stack.undo()
    assert win.doc.plan == before


@pytest.mark.parametrize("exclusive,quick_exclusive", [(True, True), (True, False),
                                                      (False, False)])
def test_exclusive_tasks_are_not_interleaved(qtbot, exclusive, quick_exclusive):
    """A job that swaps weights in the shared network (the check, activation tables) is never
    interleaved with another such job; any job yields to interactive work that does not touch
    the network (a selected tensor's statistics: issue 33) between progress steps."""
    import threading
    from app.workers import BACKGROUND, INTERACTIVE, Runner
    from workbench.core.progress import Progress
    runner = Runner()
    order = []
    started = threading.Event()
    go = threading.Event()

    def long_job():
        started.set()
        go.wait(10)
        for i in range(3):
            order.append(f"long{i}")
            yield Progress(i, 3)
        return "long"

    t1 = runner.submit(long_job, "long", BACKGROUND, exclusive=exclusive)
    started.wait(10)
    runner.submit(lambda: order.append("interactive"), "quick", INTERACTIVE,
                  exclusive=quick_exclusive)
    go.set()
    qtbot.waitUntil(runner.idle, timeout=10000)
    runner.shutdown()
    assert t1.state == "done"
    if exclusive and quick_exclusive:
        assert order == ["long0", "long1", "long2", "interactive"]
    else:
        assert order.index("interactive") < order.index("long2")


def test_the_badge_never_reads_off_while_the_box_is_ticked(make_window, qtbot):
    """Before any model (or any check) the ticked box read "OFF" beside it."""
    win = make_window(path=None, check=True)
    panel = win.check_panel
    assert panel.enabled_box.isChecked()
    assert panel.badge.text() != "OFF" and panel.badge.text().startswith("ON")
    panel.enabled_box.setChecked(False)
    assert panel.badge.text() == "OFF"
    panel.enabled_box.setChecked(True)
    assert panel.badge.text() != "OFF"

"""Issue 21 in the window: the Sensitivity & Budget tab works on the real MiniLM (a real
frontier, a budget, an enabled slider); panels follow every open, undo and edit; an "open
failed" message clears; opening a model over unsaved edits asks (save / discard / cancel)."""

from __future__ import annotations

import pytest

from apphelpers import DEMO, minilm_path, wait_idle

SLOW = 600000


def _budget_ready(win):
    fx = win.effects
    return fx.table() is not None and bool(fx.frontier)


#: MiniLM in the window: a few candidates, calibration lines and samples of the measure (the
#: same on the window's side and the API's), enough for a real frontier around 5 bits/weight;
#: rtn, imatrix and GPTQ are weighed for each (tensor, candidate) as with the defaults (every
#: scheme the runtime runs, the whole shipped text: the demo model's tests, test_budget_api.py),
#: at a fraction of the work (the methods are weighed and fitted on the whole calibration text)
MINILM_SAMPLES = 4
MINILM_SCHEMES = "q4_0,int4-g128,q8_0"
MINILM_CALIB_LINES = 32


@pytest.mark.slow
def test_budget_tab_on_minilm_shows_a_real_frontier_budget_and_slider(make_window, qtbot,
                                                                       tmp_path):
    """Also the window's MiniLM allocation is allocate's (qw.allocate_plan with the same
    candidates, calibration text and samples), methods included: MiniLM is an encoder,
    --methods auto weighs rtn, imatrix and gptq."""
    import workbench as qw
    from workbench.running.calibration import DEFAULT_CALIB
    calib = tmp_path / "calib.txt"
    calib.write_text("\n".join(DEFAULT_CALIB.read_text().splitlines()[:MINILM_CALIB_LINES])
                     + "\n")
    # yes to "Quantize tensors a runtime keeps?": allocate's plan quantizes the position
    # embeddings (llama.cpp never re-types them); the window asks first, as for every such edit
    win = make_window(minilm_path(), answer=True,
                      values={"effects/sensitivity_samples": MINILM_SAMPLES,
                              "effects/schemes": MINILM_SCHEMES, "effects/calib": str(calib)})
    assert win.effects.calib_arg() == str(calib)
    fx, panel = win.effects, win.budget_panel
    win.tabs.setCurrentIndex(win.effects_tab_index)
    qtbot.waitUntil(lambda: _budget_ready(win) or fx.table_error(), timeout=SLOW)
    assert not fx.table_error()
    wait_idle(qtbot, win, SLOW)
    assert fx.table().candidates == MINILM_SCHEMES.split(",")
    kinds = {k: sum(1 for p in fx.frontier if p.kind == k) for k in ("allocated", "uniform")}
    assert kinds["uniform"] == len(fx.table().candidates) and kinds["allocated"] >= 5
    assert panel.slider.isEnabled() and panel.spin.isEnabled()
    lo, hi = panel._range
    # MiniLM's uniform plans over the candidates span 4-bit .. 8-bit types, the budget of 5
    # bits/weight inside
    assert lo < 5.0 < hi
    assert lo <= panel.budget_bpw() <= hi
    assert f"{kinds['allocated']} allocated, {kinds['uniform']} uniform" in panel.result.text()
    # the budget control allocates on MiniLM too: one undoable edit within the budget
    panel.unit.setCurrentIndex(0)
    panel.set_value_bpw(5.0)
    task = panel.apply_budget()
    qtbot.waitUntil(lambda: task.finished, timeout=SLOW)
    wait_idle(qtbot, win, SLOW)
    assert task.state == "done", fx.allocation_error
    assert fx.preview is not None and 8.0 * fx.preview[2] / win.doc.model.total_params <= 5.0
    assert win.undo_stack.count() == 1
    assert any("a runtime keeps" in q for q, _ in win.messages.questions)
    # the plan is allocate's, rule for rule (scheme and method per tensor), and its bytes
    ref = qw.allocate_plan(qw.open_model(str(minilm_path())), qw.Budget.bits_per_weight(5.0),
                           schemes=MINILM_SCHEMES, calib=str(calib), samples=MINILM_SAMPLES)
    assert set(ref.methods_weighed["methods"]) == {"rtn", "imatrix", "gptq"}
    assert win.doc.plan == ref.plan
    assert fx.preview[2] == ref.evaluation.totals.bytes_after
    assert "methods:" in panel.choice.text()


#: the demo model's panels on a few samples and candidates: what is shown is the point here
QUICK = {"effects/sensitivity_samples": 4, "effects/schemes": "q4_0,int4-g128,q8_0"}


def test_panels_drop_an_allocation_that_undo_took_back(make_window, qtbot):
    win = make_window(values=QUICK)
    fx, panel = win.effects, win.budget_panel
    win.tabs.setCurrentIndex(win.effects_tab_index)
    qtbot.waitUntil(lambda: _budget_ready(win), timeout=SLOW)
    wait_idle(qtbot, win, SLOW)
    lo, hi = panel._range
    panel.set_value_bpw((lo + hi) / 2)
    task = panel.apply_budget()
    qtbot.waitUntil(lambda: task.finished, timeout=SLOW)
    wait_idle(qtbot, win, SLOW)
    assert fx.preview is not None and panel.result.text().startswith("allocated")
    win.undo_stack.undo()
    wait_idle(qtbot, win, SLOW)
    assert fx.preview is None
    assert not panel.result.text().startswith("allocated")
    win.undo_stack.redo()                      # the plan is the allocation again: no preview
    wait_idle(qtbot, win, SLOW)               # needed, but nothing stale is shown
    assert not panel.result.text().startswith("allocated") or fx.preview is not None


def test_opening_another_model_resets_the_budget_panel(make_window, qtbot, tmp_path):
    import shutil
    win = make_window(values=QUICK)
    fx, panel = win.effects, win.budget_panel
    win.tabs.setCurrentIndex(win.effects_tab_index)
    qtbot.waitUntil(lambda: _budget_ready(win), timeout=SLOW)
    wait_idle(qtbot, win, SLOW)
    old_range = panel._range
    fx.allocation_error = "an old failure"
    fx.allocationChanged.emit()
    assert "an old failure" in panel.result.text()
    other = tmp_path / "other"
    shutil.copytree(DEMO.parent, other)
    win.open_model(str(other / DEMO.name))
    qtbot.waitUntil(lambda: win.doc.model is not None and str(other) in str(win.doc.model.path),
                    timeout=SLOW)
    assert fx.allocation_error is None and fx.preview is None and fx.frontier == []
    assert "an old failure" not in panel.result.text()
    qtbot.waitUntil(lambda: _budget_ready(win), timeout=SLOW)
    wait_idle(qtbot, win, SLOW)
    assert panel.slider.isEnabled() and panel._range == old_range     # the same weights


def test_open_failed_clears_on_the_next_action(make_window, qtbot, tmp_path):
    win = make_window()
    bad = tmp_path / "broken.safetensors"
    bad.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}")
    task = win.open_model(str(bad))
    qtbot.waitUntil(lambda: task.finished, timeout=SLOW)
    wait_idle(qtbot, win)
    assert win.status_label.text().startswith("open failed: broken.safetensors")
    assert win.messages.errors and "broken.safetensors" in win.messages.errors[-1][1]
    assert str(DEMO.name) in str(win.doc.model.path)              # the open model stays
    first = next(n for n in win.doc.model.tensors if n.endswith("proj.weight"))
    win.select(first)
    assert win.status_label.text() == win.model_status()
    # and by itself after a while
    task = win.open_model(str(bad))
    qtbot.waitUntil(lambda: task.finished, timeout=SLOW)
    assert win.status_label.text().startswith("open failed")
    win._status_timer.setInterval(50)
    win._status_timer.start()
    qtbot.waitUntil(lambda: win.status_label.text() == win.model_status(), timeout=5000)


def test_opening_over_unsaved_edits_asks_save_discard_cancel(make_window, qtbot, tmp_path):
    from app import commands
    win = make_window()
    names = [n for n in win.doc.model.tensors if n.endswith("proj.weight")][:2]
    assert win.push(commands.assign(win.doc, names, "q8_0"))
    assert not win.undo_stack.isClean()
    before = win.doc.model
    # cancel: nothing happens, the edit stays
    win.messages.save_answer = "cancel"
    assert win.open_model(str(DEMO)) is None
    assert win.messages.questions[-1][0] == "Save changes?"
    assert win.doc.model is before and win.doc.scheme_of(names[0]) == "q8_0"
    # save: the session is written first (to the session's file), then the model opens
    session = tmp_path / "s.json"
    win.session_path = str(session)
    win.messages.save_answer = "save"
    n_questions = len(win.messages.questions)
    task = win.open_model(str(DEMO))
    assert task is not None and len(win.messages.questions) == n_questions + 1
    assert session.is_file() and "q8_0" in session.read_text()
    qtbot.waitUntil(lambda: win.doc.model is not before, timeout=SLOW)
    wait_idle(qtbot, win)
    assert win.undo_stack.isClean() and win.doc.scheme_of(names[0]) != "q8_0"
    # discard: opens without saving; a clean window does not ask at all
    assert win.push(commands.assign(win.doc, names, "q4_0"))
    win.messages.save_answer = "discard"
    mtime = session.stat().st_mtime_ns
    task = win.open_model(str(DEMO))
    qtbot.waitUntil(lambda: task.finished, timeout=SLOW)
    wait_idle(qtbot, win)
    assert session.stat().st_mtime_ns == mtime and win.undo_stack.isClean()
    n_questions = len(win.messages.questions)
    task = win.open_model(str(DEMO))
    qtbot.waitUntil(lambda: task.finished, timeout=SLOW)
    assert len(win.messages.questions) == n_questions

"""Issue 33 (the app): the work queue is visible and cancellable, the user's action goes first,
and no panel shows a placeholder ("…", "0.000", empty axes) while it waits: it says what it
waits for and how far that is."""

import re
import threading
import time

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractSpinBox, QLabel

from app import commands
from app.work_queue import WorkQueuePanel
from app.workers import BACKGROUND, FOREGROUND, INTERACTIVE, Runner
from workbench.export.preflight import check_all
from workbench.core.progress import Progress

from apphelpers import DEMO as DEMO_PATH, wait_idle

Q = "model.layers.0.self_attn.q_proj.weight"


def _long_job(state, steps=100000, step_s=0.01):
    """A generator job standing in for a whole-model sweep: yields progress until stopped."""
    def job():
        state["started"] = True
        try:
            for i in range(steps):
                if state.get("stop"):
                    return i
                time.sleep(step_s)
                state["steps"] = i + 1
                yield Progress(i + 1, steps, f"tensor {i}")
            return steps
        finally:
            state["closed"] = True
    return job


def _blocker(runner, name="Blocking job", priority=INTERACTIVE):
    """A plain (not a generator) job that holds its lane until released: nothing can park it."""
    go = threading.Event()
    started = threading.Event()

    def job():
        started.set()
        go.wait(60)
        return None
    task = runner.submit(job, name, priority)
    assert started.wait(10)
    return task, go


def _labels(widget):
    return [w for w in widget.findChildren(QLabel) if w.isVisible()]


PLACEHOLDER = re.compile(r"^(…|\.\.\.|0\.000|running…|pending|GB/s pending|statistics…|grid…)$")


def _placeholders(win):
    """Visible labels and spin boxes that show a bare placeholder value."""
    bad = [w.text() for w in _labels(win) if PLACEHOLDER.match(w.text().strip())]
    bad += [w.text() for w in win.findChildren(QAbstractSpinBox)
            if w.isVisible() and PLACEHOLDER.match(w.text().strip())]
    bad += [w.text() for w in _labels(win) if "…" in w.text() and ("pending" in w.text()
                                                                   or "running…" in w.text())]
    return bad


def test_export_dialog_answers_first_while_a_long_sweep_holds_the_compute_thread(
        window, qtbot):
    state = {}
    # a sweep driving the shared network (as an activation sensitivity table does): exclusive
    sweep = window.runner.submit(_long_job(state), "Sensitivity (activation)", BACKGROUND,
                                 visible=True, exclusive=True)
    qtbot.waitUntil(lambda: state.get("steps", 0) > 2, timeout=10000)
    t0 = time.monotonic()
    dlg = window.export_dialog()
    # until the check is done: Export is disabled and the dialog says how far the check is
    assert dlg.checking() and not dlg.export_button.isEnabled()
    assert dlg.verdicts.text().startswith("checking which formats can write this plan: ")
    assert dlg.start() is None and dlg.task is None
    qtbot.waitUntil(lambda: dlg.checks is not None, timeout=300000)
    answered = time.monotonic() - t0
    assert not sweep.finished and state["steps"] > 2, "the check waited for the sweep"
    assert answered < 300.0      # a hang guard: the sweep (1000 s) is still running
    qtbot.waitUntil(lambda: not dlg.pending, timeout=60000)     # onnx, when checked behind
    expected = check_all(window.doc.model, window.doc.plan)
    assert {f: c.ok for f, c in dlg.checks.items()} == {f: c.ok for f, c in expected.items()}
    # formats the plan cannot be written to are not offered: disabled, the reason as tooltip
    model = dlg.format.model()
    for i, e in enumerate(dlg.exporters):
        c = dlg.checks[e.name]
        assert model.item(i).isEnabled() == c.ok, e.name
        if not c.ok:
            assert c.reason in dlg.format.itemData(i, Qt.ItemDataRole.ToolTipRole)
    assert not dlg.checks["gguf"].ok          # int8-channel: llama.cpp has no type for it
    assert dlg.check().ok and dlg.export_button.isEnabled()
    # selecting a tensor is answered while the exclusive sweep is still going
    name = "model.layers.1.mlp.down_proj.weight"
    window.select(name)
    scheme = window.doc.scheme_of(name)
    qtbot.waitUntil(lambda: (name, scheme) in window.doc.details, timeout=15000)
    assert not sweep.finished
    dlg.close()
    sweep.cancel()
    qtbot.waitUntil(lambda: sweep.state == "cancelled", timeout=5000)
    # the parked generator is closed on the compute thread once it gets there (a busy
    # machine: later than the state change): wait for it, not a race
    qtbot.waitUntil(lambda: state.get("closed", False), timeout=15000)


def test_a_default_the_plan_cannot_be_written_to_is_never_kept(make_window, qtbot):
    win = make_window()
    # the user's last format was gguf, which cannot write int8-channel: not the default
    win.settings.setValue("export_format", "gguf")
    dlg = win.export_dialog()
    qtbot.waitUntil(lambda: dlg.checks is not None, timeout=15000)
    assert dlg.exporter().name != "gguf" and dlg.check().ok
    dlg.close()


def test_work_queue_lists_each_job_and_cancelling_a_queued_one_stops_it(qtbot):
    runner = Runner()
    panel = WorkQueuePanel(runner)
    qtbot.addWidget(panel)
    panel.show()
    try:
        state = {}
        running = runner.submit(_long_job(state), "Computing statistics", BACKGROUND,
                                visible=True)
        qtbot.waitUntil(lambda: state.get("steps", 0) > 0, timeout=10000)
        made = []
        queued = runner.submit(lambda: made.append(1), "End-to-end check", BACKGROUND)
        qtbot.waitUntil(lambda: len(panel.shown) == 2, timeout=5000)
        rows = {r.task.name: r for r in panel.rows if r.task is not None and r.isVisible()}
        assert set(rows) == {"Computing statistics", "End-to-end check"}
        run_row, q_row = rows["Computing statistics"], rows["End-to-end check"]
        assert run_row.state.text() == "running" and q_row.state.text() == "queued"
        assert re.fullmatch(r"\d+/100000", run_row.count.text())       # i/N
        assert "tensor" in run_row.detail.text()                          # its stage
        assert q_row.detail.text() == "queued behind Computing statistics"
        assert panel.header.text() == "WORK QUEUE · 1 running · 1 waiting"
        # Cancel on the queued row: it leaves the queue at once and never runs
        qtbot.mouseClick(q_row.cancel, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: queued.state == "cancelled", timeout=2000)
        assert made == [] and not running.finished
        assert [t.name for t, _ in runner.snapshot()] == ["Computing statistics"]
        qtbot.waitUntil(lambda: panel.shown == [running], timeout=2000)
        # Cancel on the running row: its generator is closed at its next step
        qtbot.mouseClick(run_row.cancel, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: running.state == "cancelled", timeout=5000)
        assert state["closed"]
        qtbot.waitUntil(lambda: not panel.isVisible(), timeout=2000)
    finally:
        runner.shutdown()


def test_cancelling_a_parked_job_closes_it(qtbot):
    """A started job set aside for one of higher priority ('paused') is cancelled too: its
    generator is closed on the compute thread, and it is never resumed."""
    runner = Runner()
    try:
        state = {}
        low = runner.submit(_long_job(state), "Sensitivity (weight)", BACKGROUND)
        qtbot.waitUntil(lambda: state.get("steps", 0) > 0, timeout=10000)
        high, go = _blocker(runner, "Analysing q_proj", INTERACTIVE)
        snap = dict((t.name, st) for t, st in runner.snapshot())
        assert snap == {"Analysing q_proj": "running", "Sensitivity (weight)": "paused"}
        steps = state["steps"]
        low.cancel()
        # it leaves the queue at once; its generator is closed on the compute thread
        qtbot.waitUntil(lambda: low.state == "cancelled", timeout=2000)
        assert [t.name for t, _ in runner.snapshot()] == ["Analysing q_proj"]
        go.set()
        qtbot.waitUntil(lambda: high.state == "done" and runner.idle(), timeout=5000)
        assert state["closed"] and state["steps"] == steps      # closed, never resumed
    finally:
        runner.shutdown()


def test_waiting_panels_say_what_they_wait_for(make_window, qtbot):
    # the demo, statistics and errors done; the check off; the (auto: fisher) table on few
    # calibration samples
    win = make_window(values={"effects/sensitivity_samples": 4})
    fx = win.effects
    blocker, go = _blocker(win.runner, "Blocking job")
    try:
        # an edit (errors to evaluate), the check switched on, the budget tab opened: all wait
        names = [n for n, i in win.doc.model.tensors.items() if i.ndim >= 2][:3]
        win.push(commands.assign(win.doc, names, "q4_0"))
        fx.set_check_enabled(True)
        win.tabs.setCurrentIndex(win.effects_tab_index)
        qtbot.waitUntil(lambda: fx._check_task is not None and fx.table_running(), timeout=5000)
        # totals: how far the error evaluation is and what it waits for
        n = len(win.doc.model.tensors)
        assert win.totals.sqnr.value.text() == f"{n - len(names)}/{n} measured"
        assert "waiting for the error evaluation: queued behind Blocking job" in \
            win.totals.sqnr.value.toolTip()
        # the end-to-end check: queued, behind what
        assert win.check_panel.badge.text() == "QUEUED"
        assert win.check_panel.value.text().startswith("queued behind Blocking job")
        # the budget tab: a waiting page in place of empty axes, "—" in place of 0.000
        panel = win.budget_panel
        assert panel.stack.currentWidget() is panel.waiting and not panel.plot.isVisible()
        assert panel.waiting.headline.text() == "Computing the auto sensitivity table · queued"
        assert "Sensitivity (auto): queued behind Blocking job" in panel.waiting.detail.text()
        assert panel.spin.text() == "—" and not panel.spin.isEnabled()
        view = win.sensitivity_view
        assert not view.heat.isVisible() and view.waiting.isVisible()
        assert view.waiting.text() == ("computing the auto sensitivity table: queued behind "
                                       "Blocking job")
        assert win.tensor_sensitivity.summary.text().startswith(
            "waiting for the auto sensitivity table: queued behind Blocking job")
        # the work queue lists every job, the blocker running first
        want = {"Blocking job", "Evaluating error", "End-to-end check", "Sensitivity (auto)"}
        qtbot.waitUntil(lambda: want <= {t.name for t in win.work_queue.shown}, timeout=10000)
        listed = [t.name for t in win.work_queue.shown]
        assert listed[0] == "Blocking job"
        assert _placeholders(win) == []
    finally:
        go.set()
    # once running, the table's page says "running" with its progress
    qtbot.waitUntil(lambda: fx.table() is not None or "running" in
                    panel.waiting.detail.text(), timeout=60000)
    qtbot.waitUntil(lambda: bool(fx.frontier) and fx.check_state == "fresh", timeout=600000)
    wait_idle(qtbot, win, 600000)
    assert panel.stack.currentWidget() is panel.plot and panel.plot.isVisible()
    assert re.fullmatch(r"\d+\.\d{3}", panel.spin.text()) and panel.spin.value() > 0
    assert re.fullmatch(r"-?\d+(\.\d+)? dB", win.totals.sqnr.value.text())
    assert win.check_panel.badge.text() == "CURRENT"
    assert _placeholders(win) == []
    assert not win.work_queue.isVisible()


def test_a_cancelled_table_offers_compute_and_the_check_says_cancelled(make_window, qtbot):
    win = make_window(values={"effects/sensitivity_samples": 4})     # a quick table once asked
    fx = win.effects
    blocker, go = _blocker(win.runner, "Blocking job")
    try:
        fx.set_check_enabled(True)
        win.tabs.setCurrentIndex(win.effects_tab_index)
        qtbot.waitUntil(lambda: fx._check_task is not None and fx.table_running(), timeout=5000)
        qtbot.waitUntil(lambda: len(win.work_queue.shown) >= 3, timeout=5000)
        for name in ("Sensitivity (auto)", "End-to-end check"):
            # the rows are re-filled after each cancel: look the row up each time
            rows = {r.task.name: r for r in win.work_queue.rows if r.task is not None}
            qtbot.mouseClick(rows[name].cancel, Qt.MouseButton.LeftButton)
            assert name not in [t.name for t in win.work_queue.shown]
        panel = win.budget_panel
        qtbot.waitUntil(lambda: panel.waiting.compute.isVisible(), timeout=5000)
        assert panel.waiting.headline.text() == "The auto sensitivity table is not computed"
        qtbot.waitUntil(lambda: fx.check_state == "cancelled", timeout=5000)
        assert win.check_panel.badge.text() == "CANCELLED"
        assert win.check_panel.value.text().startswith("cancelled")
    finally:
        go.set()
    wait_idle(qtbot, win)
    assert fx.table() is None                          # cancelled: not computed behind it
    qtbot.mouseClick(panel.waiting.compute, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: fx.table() is not None and bool(fx.frontier), timeout=120000)
    assert panel.stack.currentWidget() is panel.plot


def test_the_last_progress_event_of_a_burst_is_shown_while_a_long_step_runs(qtbot):
    """Events closer together than the GUI's 50 ms refresh are one delivery, and the last one
    shows: the export check read "checking llama-tensor-types" through the 40 s of its onnx
    step on a busy machine (that step's event came within 50 ms of the one before)."""
    runner = Runner()
    go = threading.Event()
    try:
        def job():
            yield Progress(2, 6, "checking llama-tensor-types")
            yield Progress(3, 6, "checking onnx")       # at once: inside the 50 ms window
            go.wait(30)                                  # a long step
            yield Progress(6, 6, "checked")
            return "ok"
        task = runner.submit(job, "Checking export formats", FOREGROUND, visible=True)
        qtbot.waitUntil(lambda: task.message == "checking onnx", timeout=5000)
        assert not task.finished and (task.done, task.total) == (3.0, 6.0)
        assert task.progress_text() == "3/6"
        go.set()
        qtbot.waitUntil(lambda: task.state == "done" and runner.idle(), timeout=5000)
    finally:
        go.set()
        runner.shutdown()


def test_whether_the_model_can_run_is_decided_off_the_gui_thread(make_window, qtbot,
                                                                  monkeypatch):
    """The comparison's method boxes ask whether transformers can run the model; that imports
    transformers and torch (25 s under load, during which the window did not repaint). It is
    a job on the compute thread, listed in the work queue; the boxes say they wait for it."""
    import app.method_compare as mc
    go = threading.Event()
    threads = []
    real = mc._kind_verdict

    def verdict(model):
        threads.append(threading.current_thread().name)
        go.wait(30)
        return real(model)
    monkeypatch.setattr(mc, "transformers_ready", lambda: False)   # as before transformers loads
    monkeypatch.setattr(mc, "_kind_verdict", verdict)
    win = make_window(path=None)
    try:
        win.open_model(str(DEMO_PATH))
        qtbot.waitUntil(lambda: bool(threads), timeout=20000)
        assert threads == ["workbench-compute"]
        boxes = win.comparison.method_boxes.values()
        qtbot.waitUntil(lambda: win.doc.model is not None, timeout=10000)
        assert not any(b.isEnabled() for b in boxes)
        tip = win.comparison.methods_label.toolTip()
        assert "waiting for the check that the model can run: " in tip, tip
        qtbot.waitUntil(lambda: mc.RUNNABLE_JOB in {t.name for t in win.work_queue.shown},
                        timeout=5000)
    finally:
        go.set()
    wait_idle(qtbot, win)
    assert all(b.isEnabled() for b in boxes)            # the demo runs: the verdict arrived
    assert threads == ["workbench-compute"]             # asked once, never on the GUI thread


def test_the_export_dialog_answers_before_the_onnx_check_loads_transformers(
        window, qtbot, monkeypatch):
    """Until transformers is loaded, onnx (whose check imports it with torch: 40 s on a busy
    machine) is checked behind the other formats: the dialog answers for those first, lists
    onnx as still being checked and does not offer it until its verdict is in."""
    import app.method_compare as mc
    import workbench.api.plans as pf          # the name the app reads (its export checks)
    monkeypatch.setattr(mc, "transformers_ready", lambda: False)
    go = threading.Event()
    real = pf.check

    def check(model, plan, fmt):
        if fmt == "onnx":
            go.wait(30)                     # transformers loading
        return real(model, plan, fmt)
    monkeypatch.setattr(pf, "check", check)
    dlg = window.export_dialog()
    try:
        qtbot.waitUntil(lambda: dlg.checks is not None, timeout=15000)
        assert dlg.pending == {"onnx"} and "onnx" not in dlg.checks
        assert dlg.check().ok and dlg.export_button.isEnabled()       # the default is writable
        assert dlg.exporter().name != "onnx"
        i = [e.name for e in dlg.exporters].index("onnx")
        assert not dlg.format.model().item(i).isEnabled()
        assert "still checking" in dlg.format.itemText(i)
        assert "still checking" in dlg.verdicts.text()
        listed = {t.name for t in window.runner.tasks()}
        assert "Checking export formats: onnx (loads transformers)" in listed
        chosen = dlg.exporter().name
    finally:
        go.set()
    qtbot.waitUntil(lambda: not dlg.pending, timeout=60000)
    expected = check_all(window.doc.model, window.doc.plan)
    assert {f: c.ok for f, c in dlg.checks.items()} == {f: c.ok for f, c in expected.items()}
    assert dlg.format.model().item(i).isEnabled() == expected["onnx"].ok
    assert dlg.exporter().name == chosen          # the offered format is kept
    assert "still checking" not in dlg.verdicts.text()
    dlg.close()


def test_a_plot_waiting_for_its_data_says_so_instead_of_empty_axes(window, qtbot):
    """The per-channel error plot of a tensor just re-assigned, while its evaluation waits
    behind another job: a label over the whole plot names the job and where it is (the axes
    were drawn empty, 0..1, under a busy window); it goes when the error is drawn."""
    window.select(Q)
    wait_idle(qtbot, window)
    plots = window.plots
    over = plots.waiting[plots.errors].label
    assert not over.isVisible() and plots.errors.err.size > 0
    blocker, go = _blocker(window.runner, "Blocking job")
    try:
        window.push(commands.assign(window.doc, [Q], "q4_0"))
        qtbot.waitUntil(lambda: window.doc.result(Q) is None or over.isVisible(), timeout=5000)
        assert window.doc.result(Q) is None
        assert over.isVisible() and over.geometry() == plots.errors.rect()
        assert "queued behind Blocking job" in over.text(), over.text()
        assert over.text().startswith("waiting for the error")
        # the statistics are known: those plots show their data, no label over them
        assert not plots.waiting[plots.histogram].label.isVisible()
        assert not plots.waiting[plots.ranges].label.isVisible()
        assert _placeholders(window) == []
    finally:
        go.set()
    qtbot.waitUntil(lambda: window.doc.result(Q) is not None, timeout=30000)
    wait_idle(qtbot, window)
    assert not over.isVisible()
    assert plots.errors.scheme == "q4_0" and plots.errors.err.size > 0


def test_the_layout_stays_put_when_the_queue_comes_and_goes(make_window, qtbot):
    """The plots jumped in height when the work queue closed: it floats over the corner."""
    import threading
    win = make_window()
    wait_idle(qtbot, win)
    plots_h, table_h = win.plots.height(), win.tabs.height()
    go = threading.Event()

    def blocker():
        go.wait(30)
        return 1
    win.runner.submit(blocker, "Blocking job", visible=True)
    try:
        qtbot.waitUntil(lambda: win.work_queue.isVisible(), timeout=10000)
        assert (win.plots.height(), win.tabs.height()) == (plots_h, table_h)
        q = win.work_queue.geometry()
        central = win.centralWidget().rect()
        assert central.contains(q) and q.bottom() >= central.bottom() - 2 * win.work_queue.MARGIN
    finally:
        go.set()
    qtbot.waitUntil(lambda: not win.work_queue.isVisible(), timeout=30000)
    assert (win.plots.height(), win.tabs.height()) == (plots_h, table_h)


def test_progress_is_shown_once(make_window, qtbot):
    """Progress appeared in five places at once: the work queue is the overview, the status
    bar does not repeat it, and the panels beside the one doing the work say only its state."""
    from app.work_queue import task_line
    win = make_window()
    wait_idle(qtbot, win)
    state = {}
    task = win.runner.submit(_long_job(state), "Sensitivity (weight)", BACKGROUND, visible=True)
    try:
        qtbot.waitUntil(lambda: state.get("steps", 0) > 3 and win.work_queue.isVisible(),
                        timeout=20000)
        qtbot.wait(400)                           # past the status bar's own delay
        assert task in win.work_queue.shown and not win.progress.isVisible()
        full, short = task_line(task, "running"), task_line(task, "running", figures=False)
        assert "/" in full and "/" not in short and "%" not in short
        assert "budget panel" in short
    finally:
        task.cancel()
    qtbot.waitUntil(lambda: task.finished, timeout=10000)

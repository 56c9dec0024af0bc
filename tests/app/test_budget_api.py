"""The Sensitivity & Budget view allocates through the public API (workbench.api) with its
defaults: for the same model, budget and options the window's plan is the one
`qw.allocate_plan` (and so `quant-workbench allocate`) gives, rule for rule and byte for byte,
and the view says what the API chose (the measure, its reason, the methods)."""

from __future__ import annotations

import pytest

from apphelpers import DEMO, wait_idle

pytest.importorskip("transformers")

SLOW = 600000
SAMPLES = 4          # calibration samples of the measure: quick, and the same on both sides


def _ready(win):
    fx = win.effects
    return (fx.table() is not None and bool(fx.frontier)) or bool(fx.table_error())


def _budget_view(make_window, qtbot, path=DEMO, answer=False):
    win = make_window(path, answer=answer, values={"effects/sensitivity_samples": SAMPLES})
    win.tabs.setCurrentIndex(win.effects_tab_index)
    qtbot.waitUntil(lambda: _ready(win), timeout=SLOW)
    assert not win.effects.table_error()
    wait_idle(qtbot, win, SLOW)
    return win


def _apply(win, qtbot, bpw):
    panel = win.budget_panel
    panel.unit.setCurrentIndex(0)
    panel.set_value_bpw(bpw)
    task = panel.apply_budget()
    qtbot.waitUntil(lambda: task.finished, timeout=SLOW)
    wait_idle(qtbot, win, SLOW)
    assert task.state == "done", win.effects.allocation_error


def test_budget_apply_gives_the_plan_allocate_writes(make_window, qtbot, tmp_path):
    import workbench as qw
    from workbench.quant.evaluate import evaluate
    from workbench.core.progress import run
    win = _budget_view(make_window, qtbot)
    fx, panel = win.effects, win.budget_panel
    table = fx.table()
    # the API's defaults: the best measure the model allows over the runtime's candidates
    choice = qw.resolve_measure(win.doc.model, samples=SAMPLES)
    assert fx.measure == "auto" and table.measure == choice.measure == "fisher"
    assert len(table.candidates) == len(qw.parse_schemes("auto")) > 20
    assert "measure fisher (the model is runnable" in panel.choice.text()
    # the frontier's sizes are the table's bytes: what evaluate counts (a lattice i-quant, a
    # K-quant, a legacy block and an integer group scheme checked against evaluate itself)
    from app.effects_jobs import plan_bytes
    uniform = {p.label: p for p in fx.frontier if p.kind == "uniform"}
    picked = [s for s in ("iq2_xxs", "q4_k", "q5_0", "int4-g32") if s in uniform]
    assert len(picked) >= 3, sorted(uniform)
    for s in picked:
        assert plan_bytes(win.doc.model, uniform[s].assignment) == uniform[s].bytes, s
    bpw = 5.0
    depth = win.undo_stack.count()
    _apply(win, qtbot, bpw)
    assert win.undo_stack.count() == depth + 1
    model = qw.open_model(str(DEMO))
    ref = qw.allocate_plan(model, qw.Budget.bits_per_weight(bpw), samples=SAMPLES)
    # the same rules (scheme and method per tensor), the same bytes
    assert win.doc.plan == ref.plan
    assert win.doc.plan.resolve(win.doc.model) == ref.plan.resolve(model)
    mine = run(evaluate(win.doc.model, win.doc.plan)).totals
    assert mine.bytes_after == ref.evaluation.totals.bytes_after <= bpw * model.total_params / 8
    assert fx.preview[2] == ref.evaluation.totals.bytes_after
    # the CLI writes the same plan
    from workbench.cli import main
    out = tmp_path / "plan.json"
    assert main(["allocate", str(DEMO), "--budget-bpw", str(bpw), "--samples", str(SAMPLES),
                 "-o", str(out)]) == 0
    assert qw.make_plan(path=out) == win.doc.plan
    # the view says what the API chose: the measure (and why), the methods
    text = panel.choice.text()
    assert "measure fisher" in text and "methods: rtn" in text
    assert "methods: rtn" in panel.choice.toolTip()
    win.undo_stack.undo()
    assert win.doc.plan != ref.plan


# MiniLM's allocation in the window equals allocate's, methods included:
# tests/app/test_first_minutes.py::test_budget_tab_on_minilm_shows_a_real_frontier_budget_and_slider


def test_an_api_call_reports_progress_and_stops_when_cancelled(qtbot):
    """app.api_jobs: the API's stages run on the compute thread, their Progress reaches the
    task, and a cancel stops the call at its next stage (its helper thread ends)."""
    import threading
    import workbench as qw
    from app.api_jobs import api_job
    from app.workers import BACKGROUND, Runner
    model = qw.open_model(str(DEMO))
    runner = Runner()
    try:
        seen, threads = [], set()

        def progress(ev):
            seen.append(ev.fraction)

        def job():
            def call(driver):
                def spy(stage):
                    threads.add(threading.current_thread().name)
                    return driver(stage)
                return qw.measure_sensitivity(model, "q4_0,q8_0", measure="weight", driver=spy)
            return api_job(call)
        done = runner.submit(job, "table", BACKGROUND, on_progress=progress)
        qtbot.waitUntil(lambda: done.finished, timeout=SLOW)
        assert done.state == "done" and seen and threads == {"workbench-api"}
        # cancelled while a stage runs: the stage is closed, the call gets Cancelled at once
        # and never reaches its next stage; its helper thread ends
        import time
        from workbench.core.errors import Cancelled
        from workbench.core.progress import Progress
        calls = []

        def endless():
            while True:               # until the cancel closes it
                yield Progress(1, 2, "waiting")
                time.sleep(0.01)

        def call(driver):
            try:
                driver(endless())
            except Cancelled:
                calls.append("cancelled")
                raise
            calls.append("next stage")    # never reached

        box = {}
        task = runner.submit(lambda: api_job(call), "endless", BACKGROUND,
                             on_progress=lambda ev: box["t"].cancel())
        box["t"] = task
        qtbot.waitUntil(lambda: task.finished, timeout=SLOW)
        assert task.state == "cancelled" and calls == ["cancelled"]
        qtbot.waitUntil(lambda: not any(t.name == "workbench-api" for t in threading.enumerate()),
                        timeout=10000)
    finally:
        runner.shutdown()


def test_heat_map_column_labels_never_run_together(qtbot):
    """The runtime's candidates (dozens of columns): every k-th column is labelled, none
    overlapping the next; all of them when the map is wide enough."""
    import numpy as np
    import workbench as qw
    from PySide6.QtGui import QFontMetrics
    from app.sensitivity_view import HeatMap
    schemes = qw.parse_schemes("auto")
    heat = HeatMap()
    qtbot.addWidget(heat)
    heat.resize(420, 300)
    heat.show()
    qtbot.waitExposed(heat)
    names = [f"model.layers.{i}.mlp.up_proj.weight" for i in range(6)]
    heat.set_table(names, schemes, np.ones((len(names), len(schemes))))
    axis = heat.getPlotItem().getAxis("bottom")
    ticks = axis._tickLevels[0] if getattr(axis, "_tickLevels", None) else None
    assert ticks, "the column labels are set"
    w = heat.getPlotItem().getViewBox().width()
    fm = QFontMetrics(heat.small)
    px_per_col = w / len(schemes)
    gaps = [(b[0] - a[0]) * px_per_col for a, b in zip(ticks, ticks[1:])]
    assert 1 < len(ticks) < len(schemes)
    assert min(gaps) >= max(fm.horizontalAdvance(t) for _, t in ticks)
    heat.resize(4000, 300)
    qtbot.waitUntil(lambda: len(axis._tickLevels[0]) == len(schemes))

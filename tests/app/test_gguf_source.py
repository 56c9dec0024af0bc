"""A published GGUF (quantized, no config.json beside it) in the window as on the command
line: its default plan keeps every tensor as stored (no bigger than the file), the end-to-end
check runs it converted on the fly (the CLI's workbench.export.convert.live), the
Sensitivity & Budget view measures and allocates on it as `allocate MODEL.gguf` does, and a
check message that does not fit wraps instead of being cut."""

from __future__ import annotations

import pytest

from apphelpers import wait_idle

pytest.importorskip("transformers")

SLOW = 600000
SAMPLES = 4


@pytest.fixture(scope="module")
def q4_gguf(tiny_arch, tmp_path_factory):
    from tests.tiny_gguf import write_llama_gguf
    return write_llama_gguf(tiny_arch("llama"), tmp_path_factory.mktemp("gguf-src"), "q4_0")


def _totals(win):
    from workbench.core.progress import run
    from workbench.quant.evaluate import evaluate
    return run(evaluate(win.doc.model, win.doc.plan)).totals


def test_gguf_opens_at_its_own_size_and_the_check_runs_it(make_window, qtbot, q4_gguf):
    from workbench.core.progress import run
    from workbench.export.convert.live import open_live
    from workbench.quant.plan import Plan
    from workbench.running.runner_jobs import check
    from app.check_panel import EMULATED
    win = make_window(q4_gguf, check=True)
    fx = win.effects
    t = _totals(win)
    assert t.bytes_after == t.bytes_before        # the default plan keeps the stored tensors
    assert win.table.default_combo.currentText() == "keep"     # and says so
    qtbot.waitUntil(lambda: fx.check_state in ("fresh", "error"), timeout=SLOW)
    assert fx.check_state == "fresh", fx.check_message
    assert fx.figures["kl_mean"] == pytest.approx(0.0, abs=1e-9)   # as stored: no change
    # an edit: the figures are those of the CLI's model (the GGUF converted on the fly)
    win.doc.set_state(Plan(default="q8_0"), win.doc.tiers)
    qtbot.waitUntil(lambda: fx.check_state == "fresh" and fx.figures["kl_mean"] > 0,
                    timeout=SLOW)
    live = run(open_live(str(q4_gguf)))
    try:     # a GGUF is planned for llama.cpp: its activation rounding modelled (issue 49)
        ref = run(check(live, Plan(default="q8_0"), fx.calib, fx.samples, emulate="llama.cpp"))
        plain = run(check(live, Plan(default="q8_0"), fx.calib, fx.samples))
    finally:
        live.close()
    assert fx.figures["emulate"] == "llama.cpp"
    assert fx.figures["kl_mean"] == pytest.approx(ref["kl_mean"], rel=1e-6)
    assert fx.figures["kl_mean"] != pytest.approx(plain["kl_mean"], rel=1e-6)
    assert EMULATED in win.check_panel.caption.toolTip()
    assert "llama.cpp's CPU dot products" in win.check_panel.value.toolTip()
    assert "not runnable" not in win.check_panel.value.text()


def test_budget_view_allocates_a_gguf_as_allocate_does(make_window, qtbot, q4_gguf):
    import workbench as qw
    from workbench.core.progress import run
    from workbench.export.convert.live import open_live
    from workbench.formats.llama_names import gguf_names
    win = make_window(q4_gguf, values={"effects/sensitivity_samples": SAMPLES})
    fx = win.effects
    win.tabs.setCurrentIndex(win.effects_tab_index)
    qtbot.waitUntil(lambda: (fx.table() is not None and bool(fx.frontier))
                    or bool(fx.table_error()), timeout=SLOW)
    assert not fx.table_error()
    wait_idle(qtbot, win, SLOW)
    table = fx.table()
    assert table.measure == "fisher"                    # runnable, as on the command line
    assert set(table.names) <= set(win.doc.model.tensors)   # the GGUF's own names
    panel = win.budget_panel
    panel.unit.setCurrentIndex(0)
    panel.set_value_bpw(5.0)
    task = panel.apply_budget()
    qtbot.waitUntil(lambda: task.finished, timeout=SLOW)
    wait_idle(qtbot, win, SLOW)
    assert task.state == "done", fx.allocation_error
    live = run(open_live(str(q4_gguf)))      # what `allocate MODEL.gguf` opens
    try:
        ref = qw.allocate_plan(live, qw.Budget.bits_per_weight(5.0), samples=SAMPLES)
        want = {gguf_names(live)[h]: s for h, s in ref.plan.resolve(live).items()
                if h in gguf_names(live)}
    finally:
        live.close()
    mine = win.doc.plan.resolve(win.doc.model)
    assert {n: mine[n] for n in want} == want
    assert fx.preview[2] == ref.evaluation.totals.bytes_after


def test_a_check_message_that_does_not_fit_wraps(make_window, qtbot, tmp_path):
    from tests.tiny_gguf import write_weights_only_gguf
    path = write_weights_only_gguf(tmp_path / "w.gguf")   # cannot run (the CLI says why too)
    win = make_window(path, check=True)
    fx = win.effects
    qtbot.waitUntil(lambda: fx.check_state == "error", timeout=SLOW)
    win.resize(1280, 800)
    value = win.check_panel.value
    qtbot.waitUntil(lambda: value.width() > 0)
    assert value.text() == fx.check_message and len(value.text()) > 60
    fm = value.fontMetrics()
    assert fm.horizontalAdvance(value.text()) > value.width()    # longer than one line
    assert value.wordWrap() and value.shown_text() == value.text()   # whole, wrapped
    assert value.toolTip() == fx.check_message

"""Sessions (save/reopen, autosave and crash restore), export, screenshot, report commands."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from workbench.formats.loaders import open_model
from workbench.quant.plan import Plan

from app import commands
from app.session import Session

from apphelpers import DEMO, wait_idle

ROOT = Path(__file__).resolve().parents[2]
Q = "model.layers.0.self_attn.q_proj.weight"


def test_save_and_reopen_session(make_window, qtbot, tmp_path):
    win = make_window()
    win.tiers.set_scheme(2, "q4_k")
    win.push(commands.assign(win.doc, [Q], "nf4-g64"))
    win.select("model.layers.2.mlp.down_proj.weight")
    win.browser.filter_edit.setText("layers.2")
    win.plots.log_box.setChecked(True)
    win.tabs.setCurrentIndex(1)
    path = tmp_path / "s.json"
    assert win.save_session(path=str(path)) == str(path)
    data = json.loads(path.read_text())
    assert data["format"] == "quant-workbench-session" and data["model"] == str(DEMO)
    assert data["tiers"][2]["scheme"] == "q4_k"

    other = make_window(path=None)
    other.open_session(str(path))
    wait_idle(qtbot, other)
    assert other.doc.plan == win.doc.plan
    assert other.doc.tiers == win.doc.tiers
    assert other.doc.scheme_of(Q) == "nf4-g64"
    assert other.doc.current == "model.layers.2.mlp.down_proj.weight"
    assert other.browser.filter_edit.text() == "layers.2"
    assert other.plots.log_box.isChecked() and other.tabs.currentIndex() == 1
    # a broken session file is an error message, not a crash
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "quant-workbench-session", "version": 99}')
    other.open_session(str(bad))
    assert "unsupported session version" in other.messages.errors[-1][1]


def test_autosave_and_restore_after_crash(make_window, qtbot):
    win = make_window(autosave=True)
    win.push(commands.assign(win.doc, [Q], "int3-g64"))
    win.autosave()
    assert win.autosave_path().exists()
    win.marker_path().write_text("999999999")  # as if the previous run had been killed
    # the next launch opens a model and autosaves *before* the user answers: the crashed
    # session was set aside at start-up, so that autosave cannot overwrite it
    again = make_window(answer=True, autosave=True)
    again.push(commands.assign(again.doc, [Q], "q8_0"))
    again.autosave()
    assert again.start_session_guard() is True
    assert again.messages.questions and "Restore" in again.messages.questions[0][0]
    wait_idle(qtbot, again)
    assert again.doc.scheme_of(Q) == "int3-g64"          # the crashed session, not q8_0
    assert again.session_path is None                   # Save asks where, not the autosave
    # a clean close removes the marker: no question next time
    again.messages.save_answer = "discard"
    again.close()
    assert not again.marker_path().exists()
    third = make_window(path=None, answer=True)
    assert third.start_session_guard() is False and not third.messages.questions
    third.close()


def test_quit_with_unsaved_edits_asks(make_window, qtbot, tmp_path):
    win = make_window()
    win.push(commands.assign(win.doc, [Q], "int3-g64"))
    win.messages.save_answer = "cancel"
    assert win.close() is False and win.isVisible()        # Cancel: nothing lost
    assert "unsaved" in win.messages.questions[-1][1]
    win.messages.save_answer = "save"
    win.session_path = str(tmp_path / "kept.json")
    assert win.close() is True
    assert Session.load(tmp_path / "kept.json").plan.scheme_for(Q) == "int3-g64"


def test_ctrl_c_in_the_terminal_closes_the_window_as_its_close_button_does(make_window, qtbot,
                                                                           tmp_path):
    """SIGINT (Ctrl-C where the app was started) asks about unsaved edits as a close does, and
    Cancel keeps the window: no KeyboardInterrupt reported as a crash."""
    import os
    import signal
    from app.main import install_interrupt
    win = make_window()
    win.push(commands.assign(win.doc, [Q], "int3-g64"))
    before = signal.getsignal(signal.SIGINT)
    hooked = sys.excepthook
    try:
        install_interrupt(win)
        win.messages.save_answer = "cancel"
        os.kill(os.getpid(), signal.SIGINT)
        qtbot.waitUntil(lambda: len(win.messages.questions) == 1, timeout=5000)
        assert "unsaved" in win.messages.questions[-1][1] and win.isVisible()
        win.messages.save_answer = "save"
        win.session_path = str(tmp_path / "kept.json")
        os.kill(os.getpid(), signal.SIGINT)
        qtbot.waitUntil(lambda: not win.isVisible(), timeout=5000)
    finally:
        signal.signal(signal.SIGINT, before)
    assert sys.excepthook is hooked and not win.messages.errors
    assert Session.load(tmp_path / "kept.json").plan.scheme_for(Q) == "int3-g64"


def test_export_dialog_asks_before_overwriting_and_remembers_folder(make_window, qtbot,
                                                                   tmp_path):
    win = make_window()
    dlg = win.export_dialog()
    qtbot.waitUntil(lambda: not dlg.checking(), timeout=60000)   # Export waits for its check
    # never defaults into the installation (the bundled demo model's folder)
    assert "resources" not in dlg.path.text()
    out = tmp_path / "plan.json"
    out.write_text("precious")
    win.messages.answer = False
    assert dlg.start("plan", str(out)) is None
    assert out.read_text() == "precious" and "Replace" in win.messages.questions[-1][0]
    win.messages.answer = True
    task = dlg.start("plan", str(out))
    qtbot.waitUntil(lambda: task.finished, timeout=10000)
    assert json.loads(out.read_text())["format"] == "quant-workbench-plan"
    assert win.export_dir() == str(tmp_path)
    # the model's own file is refused even when the user says "replace"
    assert dlg.start("safetensors", str(DEMO)) is None
    assert "input of the open model" in dlg.error


def test_export_dialog_lists_registry_and_writes_reopenable_files(window, qtbot, tmp_path):
    from workbench.export import list_exporters
    window.push(commands.assign(window.doc, [Q], "int4-g128"))
    dlg = window.export_dialog()
    qtbot.waitUntil(lambda: not dlg.checking(), timeout=60000)   # Export waits for its check
    names = [dlg.format.itemData(i) for i in range(dlg.format.count())]
    assert names == [e.name for e in list_exporters()]
    assert {"plan", "safetensors"} <= set(names)
    out = tmp_path / "q.safetensors"
    dlg.start("safetensors", str(out))
    qtbot.waitUntil(lambda: bool(dlg.result_info is not None or dlg.error), timeout=60000)
    assert dlg.error is None, dlg.error
    assert dlg.result_info is not None and out.exists(), (dlg.result_info, dlg.path.text())
    m = open_model(out)
    assert set(m.tensors) == set(window.doc.model.tensors)
    ref = open_model(DEMO)
    w, wq = ref.read_matrix(Q), m.read_matrix(Q)
    assert w.shape == wq.shape and not np.array_equal(w, wq)
    assert np.abs(w - wq).max() < 0.2 * np.abs(w).max()
    plan_out = tmp_path / "plan.json"
    dlg.start("plan", str(plan_out))
    qtbot.waitUntil(lambda: bool(dlg.result_info is not None or dlg.error), timeout=30000)
    assert Plan.load(plan_out) == window.doc.plan
    dlg.close()


def test_screenshot_has_size_and_content(window, qtbot, tmp_path):
    from PySide6.QtGui import QImage
    from app.screenshot import grab_png
    window.resize(1280, 800)
    window.select(Q)
    wait_idle(qtbot, window)
    out = tmp_path / "shot.png"
    grab_png(window, out)
    img = QImage(str(out))
    assert (img.width(), img.height()) == (1280, 800)
    colours = {img.pixel(x, y) for x in range(0, 1280, 7) for y in range(0, 800, 7)}
    assert len(colours) > 100


def _cli(*args, timeout=240):
    return subprocess.run([sys.executable, str(ROOT / "main.py"), *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT,
                          env={**__import__("os").environ, "QT_QPA_PLATFORM": "offscreen"})


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("plan") / "plan.json"
    Plan("int4-g128", [{"match": "re:embed|lm_head", "scheme": "int8-channel"}]).save(p)
    return p


def test_screenshot_command(tmp_path, plan_file):
    from PySide6.QtGui import QImage
    out = tmp_path / "cli.png"
    res = _cli("screenshot", "--plan", str(plan_file), "--layer", "lm_head.weight",
               "--size", "1000x700", "--tab", "tiers", "-o", str(out))
    assert res.returncode == 0, res.stderr
    img = QImage(str(out))
    assert (img.width(), img.height()) == (1000, 700)
    colours = {img.pixel(x, y) for x in range(0, 1000, 5) for y in range(0, 700, 5)}
    assert len(colours) > 100
    bad = _cli("screenshot", "--layer", "nope", "-o", str(tmp_path / "x.png"))
    assert bad.returncode == 2 and "nope" in bad.stderr
    assert not (tmp_path / "x.png").exists()


def test_a_screenshot_of_no_such_layer_fails_before_the_window_opens(tmp_path, monkeypatch):
    """The layer is checked on the model's header first: no window is built, no job runs
    (the window had loaded the model and run its checks for 8 s before the error)."""
    from workbench.core.errors import WorkbenchError
    from app import main as app_main
    from app import screenshot

    def no_window(*a, **k):
        raise AssertionError("a window was built for a layer the model does not have")
    monkeypatch.setattr(app_main, "build_window", no_window)
    out = tmp_path / "x.png"
    with pytest.raises(WorkbenchError) as e:
        screenshot.render(DEMO, out, layer="model.layers.9.nope.weight")
    assert "no such tensor or expert group" in str(e.value) and str(DEMO) in str(e.value)
    assert not out.exists()
    with pytest.raises(AssertionError, match="a window was built"):  # a real layer goes on
        screenshot.render(DEMO, out, layer=Q)


def test_report_command(tmp_path, plan_file):
    out = tmp_path / "report.html"
    res = _cli("report", "--plan", str(plan_file), "-o", str(out))
    assert res.returncode == 0, res.stderr
    html = out.read_text()
    assert html.startswith("<!DOCTYPE html>")
    assert "lm_head.weight" in html and "int4-g128" in html and "MODEL SQNR" in html
    assert html.count("data:image/png;base64,") >= 2 * 22 + 2  # 22 matrices x 2 plots + overview
    assert "http://" not in html and "https://" not in html  # reads offline


def test_crash_handler_logs_and_tells_where(window, tmp_path, monkeypatch):
    from app import main as app_main
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    old = sys.excepthook
    try:
        app_main.install_crash_handler(window)
        try:
            raise RuntimeError("boom in a slot")
        except RuntimeError:
            sys.excepthook(*sys.exc_info())
    finally:
        sys.excepthook = old
    logs = list((tmp_path / "cache" / "quant-workbench" / "logs").glob("crash-*.log"))
    assert len(logs) == 1 and "boom in a slot" in logs[0].read_text()
    title, text = window.messages.errors[-1]
    assert title == "Unexpected error" and str(logs[0]) in text


def test_save_dialogs_refuse_the_inputs_by_any_link(make_window, qtbot, tmp_path):
    """Issue 20 class 1 in the GUI: a link to the model's file or to the session the window
    came from is refused by Export, Save screenshot / report; nothing is written."""
    import os
    win = make_window()
    session = tmp_path / "s.json"
    win.save_session(path=str(session))
    before = session.read_bytes()
    (tmp_path / "model-link.safetensors").symlink_to(DEMO)
    os.link(session, tmp_path / "session-hard.json")
    dlg = win.export_dialog()
    qtbot.waitUntil(lambda: not dlg.checking(), timeout=60000)   # Export waits for its check
    win.messages.answer = True
    assert dlg.start("safetensors", str(tmp_path / "model-link.safetensors")) is None
    assert "input of the open model" in dlg.error
    assert dlg.start("plan", str(tmp_path / "session-hard.json")) is None
    assert "the session" in dlg.error and session.read_bytes() == before
    assert win.refuse_input_target(tmp_path / "model-link.safetensors", "report") is True
    assert win.refuse_input_target(session, "screenshot") is True
    assert win.refuse_input_target(session, "session", session_ok=True) is False
    assert win.refuse_input_target(tmp_path / "new.png", "screenshot") is False
    assert session.read_bytes() == before

"""Issue 10, point 6 (and the export part of point 5): the Export dialog says per format
whether the current plan can be written and why not, before Export; defaults to a format the
plan can produce; its error is shown whole and cleared when the format changes."""

from app import commands
from workbench.export.preflight import check_all
from workbench.quant.plan import Plan

from apphelpers import wait_idle

Q = "model.layers.0.self_attn.q_proj.weight"


def _dialog(window, qtbot):
    dlg = window.export_dialog()
    # every format: the onnx check may follow the others (while transformers loads)
    qtbot.waitUntil(lambda: dlg.checks is not None and not dlg.pending, timeout=60000)
    return dlg


def _names(dlg):
    return [dlg.format.itemData(i) for i in range(dlg.format.count())]


def test_dialog_checks_each_format_and_defaults_to_a_writable_one(window, qtbot):
    # the demo plan is int8-channel everywhere: llama.cpp has no type for it
    dlg = _dialog(window, qtbot)
    expected = check_all(window.doc.model, window.doc.plan)
    assert {f: c.ok for f, c in dlg.checks.items()} == {f: c.ok for f, c in expected.items()}
    assert not dlg.checks["gguf"].ok and dlg.checks["safetensors"].ok
    # the registry's first format (compressed-tensors) can write it; gguf is never the default
    assert dlg.exporter().name == "compressed-tensors" and dlg.export_button.isEnabled()
    texts = {dlg.format.itemData(i): dlg.format.itemText(i) for i in range(dlg.format.count())}
    assert texts["gguf"].endswith("✗ cannot write this plan")
    assert texts["safetensors"].endswith("✓")
    verdicts = dlg.verdicts.text()
    assert "llama.cpp has no tensor type for int8-channel" in verdicts
    # onnx can write it too where the optional extra is installed; MLX runs its own schemes only
    assert not expected["mlx"].ok
    assert verdicts.count("✓") == 3 + int(expected["onnx"].ok) and verdicts.count("✗") == 3
    # choosing a format that cannot write the plan disables Export and says so
    dlg.format.setCurrentIndex(_names(dlg).index("gguf"))
    assert not dlg.export_button.isEnabled()
    assert "cannot write this plan" in dlg.status.text()
    assert dlg.start() is None and "llama.cpp has no tensor type" in dlg.error
    dlg.close()


def test_dialog_defaults_to_gguf_for_a_ggml_plan(window, qtbot):
    window.push(commands.replace_plan(window.doc, Plan(default="q4_k")))
    wait_idle(qtbot, window)
    dlg = _dialog(window, qtbot)
    assert dlg.exporter().name == "gguf" and dlg.checks["gguf"].ok
    assert dlg.path.text().endswith(".gguf")
    # vLLM cannot express q4_k: writable, but the list says nothing would be quantized
    assert "no tensor can be quantized as the plan asks" in dlg.verdicts.text()
    dlg.close()


def test_dialog_defaults_to_mlx_for_an_mlx_plan(window, qtbot):
    """An MLX plan: mlx and safetensors both write it as asked; the runtime's folder first."""
    window.push(commands.replace_plan(window.doc, Plan(default="mlx-q4-g64")))
    wait_idle(qtbot, window)
    dlg = _dialog(window, qtbot)
    assert dlg.checks["mlx"].ok and dlg.checks["safetensors"].ok and not dlg.checks["gguf"].ok
    assert dlg.exporter().name == "mlx"
    dlg.close()


def test_dialog_prefers_the_last_format_used_when_it_can_write(make_window, qtbot, tmp_path):
    win = make_window()
    win.settings.setValue("export_format", "safetensors")
    dlg = _dialog(win, qtbot)
    assert dlg.exporter().name == "safetensors"
    dlg.close()
    win.settings.setValue("export_format", "gguf")      # cannot write int8-channel
    dlg = _dialog(win, qtbot)
    assert dlg.exporter().name == "compressed-tensors"
    dlg.close()


def test_fused_group_conflict_is_reported_before_export(window, qtbot):
    window.push(commands.assign(window.doc, [Q], "int4-g128"))
    wait_idle(qtbot, window)
    dlg = _dialog(window, qtbot)
    ct = dlg.checks["compressed-tensors"]
    assert not ct.ok and "fused" in ct.reason and Q in ct.reason
    assert dlg.exporter().name == "safetensors"          # still writable there
    dlg.close()


def test_export_error_is_whole_and_cleared_on_format_change(window, qtbot, tmp_path):
    dlg = _dialog(window, qtbot)
    dlg.format.setCurrentIndex(_names(dlg).index("safetensors"))
    task = dlg.start(None, str(tmp_path / "missing" / "folder" / "x.safetensors"))
    if task is not None:
        qtbot.waitUntil(lambda: task.finished, timeout=60000)
    assert dlg.error
    # the whole message, word-wrapped (nothing cut at 120 characters)
    assert dlg.error_label.text() == dlg.error and dlg.error_label.wordWrap()
    assert dlg.error_label.isVisibleTo(dlg)
    assert dlg.error_label.height() >= dlg.error_label.heightForWidth(dlg.error_label.width())
    dlg.format.setCurrentIndex(_names(dlg).index("plan"))
    assert dlg.error_label.text() == "" and not dlg.error_label.isVisibleTo(dlg)
    dlg.close()


def test_export_into_an_existing_model_folder_asks_first(window, qtbot, tmp_path):
    """The export door in the window: an existing model folder is replaced only after the user
    says so (then with overwrite); a folder holding the open model is refused without a
    question; nothing is touched before the answer."""
    import hashlib
    import shutil
    from pathlib import Path

    from app.messages import RecordedMessages
    demo = Path(window.doc.model.path).parent

    def digest(folder):
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}
    other = tmp_path / "float-folder"
    shutil.copytree(demo, other)
    before = digest(other)
    dlg = _dialog(window, qtbot)
    dlg.format.setCurrentIndex(_names(dlg).index("compressed-tensors"))
    dlg.messages = RecordedMessages(answer=False)
    assert dlg.start(None, str(other)) is None
    assert dlg.messages.questions[0][0] == "Replace folder?"
    assert "existing folder is kept" in dlg.status.text() and digest(other) == before
    dlg.messages.answer = True
    task = dlg.start(None, str(other))
    qtbot.waitUntil(lambda: task.finished, timeout=120000)
    assert dlg.error is None and digest(other) != before
    assert "quantization_config" in (other / "config.json").read_text()
    dlg.messages = RecordedMessages(answer=True)
    assert dlg.start(None, str(demo)) is None
    assert dlg.error and "input" in dlg.error and not dlg.messages.questions
    dlg.close()


def test_a_dense_write_is_a_warning_not_a_success(window, qtbot, tmp_path):
    """compressed-tensors writes a GGML-only plan dense: the dialog marks it ⚠ with the reason,
    before and after the export, never a green ✓."""
    linear = [n for n in window.doc.model.tensors if n.endswith("proj.weight")]
    cmd = commands.assign(window.doc, linear, "q4_0")
    assert cmd is not None
    window.push(cmd)
    wait_idle(qtbot, window)
    assert window.doc.scheme_of(Q) == "q4_0"
    dlg = _dialog(window, qtbot)
    ct = dlg.checks["compressed-tensors"]
    assert ct.ok and ct.level == "warning" and "written dense" in ct.warning
    i = _names(dlg).index("compressed-tensors")
    assert "⚠" in dlg.format.itemText(i) and "✓" not in dlg.format.itemText(i)
    row = dlg.verdicts.text().split("<b>compressed-tensors</b>")[0].rsplit("<tr>", 1)[1]
    assert "⚠" in row and "#d29922" in row
    dlg.format.setCurrentIndex(i)
    task = dlg.start(None, str(tmp_path / "dense"))
    qtbot.waitUntil(lambda: task.finished, timeout=120000)
    assert dlg.error is None and "⚠" in dlg.status.text() and "written dense" in dlg.status.text()
    assert dlg.status.wordWrap()
    dlg.close()


def test_the_window_exports_what_the_command_line_exports(window, qtbot, tmp_path):
    """The dialog exports through the API: a plan's methods (here GPTQ on one tensor) are
    fitted and applied as `quant-workbench export` applies them (the window wrote plain
    rounding for them before), byte for byte."""
    import workbench as qw
    cmd = commands.set_method(window.doc, [Q], "gptq")
    assert cmd is not None
    window.push(cmd)
    wait_idle(qtbot, window)
    assert window.doc.plan.method_for(Q) == "gptq"
    dlg = _dialog(window, qtbot)
    dlg.format.setCurrentIndex(_names(dlg).index("safetensors"))
    task = dlg.start(None, str(tmp_path / "window.safetensors"))
    qtbot.waitUntil(lambda: task.finished, timeout=300000)
    assert dlg.error is None, dlg.error
    dlg.close()
    qw.export_plan(window.doc.model, window.doc.plan, "safetensors", tmp_path / "cli.safetensors",
                   progress=False)
    a, b = (tmp_path / "window.safetensors").read_bytes(), (tmp_path / "cli.safetensors").read_bytes()
    assert a == b
    rtn = Plan(default=window.doc.plan.default)          # the same schemes, no method rule
    qw.export_plan(window.doc.model, rtn, "safetensors", tmp_path / "rtn.safetensors",
                   progress=False)
    assert (tmp_path / "rtn.safetensors").read_bytes() != a        # GPTQ changed the bytes

"""Render the real window offscreen with a given state and save it as a PNG."""

from __future__ import annotations

import time

from workbench.core.atomic import atomic_write
from workbench.core.errors import WorkbenchError

TABS = {"table": 0, "tiers": 1, "comparison": 2}


def wait_idle(app, win, timeout: float = 600.0) -> None:
    """Process events until the compute thread has nothing left to do."""
    deadline = time.monotonic() + timeout
    quiet = 0
    while time.monotonic() < deadline:
        app.processEvents()
        if win.runner.idle():
            quiet += 1
            if quiet > 3:
                return
        else:
            quiet = 0
        time.sleep(0.01)
    raise WorkbenchError(f"the window was still busy after {timeout:.0f} s")


def wait_for_frontier(app, win, timeout: float = 900.0) -> None:
    """The budget tab: wait until the sensitivity table and the frontier are computed (each is
    its own task, so the compute thread can be idle between them), or the table failed."""
    fx = win.effects
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        app.processEvents()
        if fx.table_error():
            return                       # the panel says why
        if fx.table() is not None and fx.frontier and win.runner.idle():
            app.processEvents()
            return
        if fx.table() is None and not fx.table_running() and win.runner.idle():
            fx.request_table()
        time.sleep(0.02)
    raise WorkbenchError(f"the frontier was not ready after {timeout:.0f} s")


def png_bytes(widget) -> bytes:
    from PySide6.QtCore import QBuffer, QIODevice
    pix = widget.grab()
    buf = QBuffer()
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    if not pix.save(buf, "PNG"):
        raise WorkbenchError("could not encode the screenshot as PNG")
    return bytes(buf.data())


def grab_png(widget, path) -> None:
    data = png_bytes(widget)
    with atomic_write(path, "wb") as fh:
        fh.write(data)


def parse_size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise WorkbenchError(f"bad --size '{text}' (expected WIDTHxHEIGHT, e.g. 1600x1000)") from None
    if not (320 <= w <= 8000 and 240 <= h <= 8000):
        raise WorkbenchError(f"--size {text} is out of range (320x240 .. 8000x8000)")
    return w, h


def render(model_path, out_path, plan_path=None, layer=None, size=(1600, 1000), tab="table",
           compare: bool = False, methods=(), scope: str = "pareto") -> None:
    """Open the window offscreen on a model (+ plan), select a layer, wait, save a PNG.
    `methods` (imatrix, gptq, awq): ticked in the comparison tab, rows per method in `scope`
    (pareto | current | all)."""
    from .main import create_app, build_window
    from .messages import RecordedMessages
    app = create_app(offscreen=True)
    msgs = RecordedMessages()
    win = build_window(model_path, plan_path, messages=msgs, autosave=False)
    win.resize(*size)
    win.fit_layout()
    win.show()
    win.analyzer.warmup(jit=False)
    try:
        wait_idle(app, win)
        if msgs.errors:
            raise WorkbenchError(msgs.errors[0][1].split("\n")[0])
        if layer:
            from workbench.running.moe import expert_groups
            groups = expert_groups(win.doc.model)
            if layer in groups:   # an expert group ('layer 1 experts down'): its spread
                win.select(groups[layer][0])
                wait_idle(app, win)
                if not win.browser.show_group(layer):
                    win.select_expert_group(layer)
            elif layer not in win.doc.model.tensors:
                raise WorkbenchError("no such tensor or expert group in this model",
                                     path=str(model_path), tensor=layer)
            else:
                win.select(layer)
        win.tabs.setCurrentIndex(win.effects_tab_index if tab == "budget" else
                                 win.map_tab_index if tab == "map" else TABS.get(tab, 0))
        wait_idle(app, win)
        if tab == "budget":
            wait_for_frontier(app, win)
        if methods:
            cmp = win.comparison
            why = cmp.comparer.unavailable() or cmp.comparer.tensor_unavailable(cmp.model.name)
            if why:
                raise WorkbenchError(f"--methods: {why}", path=str(model_path))
            cmp.set_methods(list(methods), scope)
            wait_idle(app, win, timeout=900.0)
            if msgs.errors:
                raise WorkbenchError(msgs.errors[0][1].split("\n")[0])
        if tab == "comparison":
            # the plot redraws at most every 150 ms while results stream in: the last batch
            # may still be waiting for that timer when the compute thread goes idle
            win.comparison._replot.stop()
            win.comparison.refresh_plot()
        win.resize(*size)
        win.fit_layout()
        app.processEvents()
        grab_png(win, out_path)
    finally:
        win.autosave_enabled = False
        win.runner.shutdown()
        win.deleteLater()
        app.processEvents()

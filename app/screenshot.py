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


def wait_busy(app, win, tab: str, timeout: float = 180.0) -> None:
    """--busy: wait until the work queue lists jobs and the one the tab waits for (the budget
    tab: the sensitivity table; else any) has started and reported progress, or `timeout`."""
    deadline = time.monotonic() + timeout
    fx = win.effects
    while time.monotonic() < deadline:
        app.processEvents()
        if tab == "budget":
            t = fx._table_tasks.get(fx._key(fx.measure))
            if fx.table() is not None and win.runner.idle():
                return                      # it was quicker than the screenshot
            ok = t is not None and t.started and t.fraction > 0.02
        else:
            ok = any(t.started and t.fraction > 0.02 for t in win.work_queue.shown)
        if ok and win.work_queue.isVisible():
            for _ in range(3):              # the queue redraws on its timer
                app.processEvents()
                time.sleep(0.05)
            win.work_queue.refresh()
            return
        time.sleep(0.02)


def export_dialog_png(app, win, out_path) -> None:
    """The window with the Export dialog over it, once the dialog's format check is done."""
    from PySide6.QtCore import QPoint
    from PySide6.QtGui import QColor, QPainter
    dlg = win.export_dialog()
    deadline = time.monotonic() + 120.0
    while dlg.checks is None and time.monotonic() < deadline:
        app.processEvents()
        time.sleep(0.02)
    dlg._fit()
    win.work_queue.refresh()
    app.processEvents()
    pix = win.grab()
    over = dlg.grab()
    painter = QPainter(pix)
    painter.fillRect(pix.rect(), QColor(0, 0, 0, 110))
    at = QPoint((pix.width() - over.width()) // 2, max(40, (pix.height() - over.height()) // 3))
    painter.drawPixmap(at, over)
    from PySide6.QtGui import QPen
    painter.setPen(QPen(QColor("#4c9aff"), 2))    # the dialog's frame (offscreen: no title bar)
    painter.drawRect(at.x() - 1, at.y() - 1, over.width() + 1, over.height() + 1)
    painter.end()
    from PySide6.QtCore import QBuffer, QIODevice
    buf = QBuffer()
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    if not pix.save(buf, "PNG"):
        raise WorkbenchError("could not encode the screenshot as PNG")
    with atomic_write(out_path, "wb") as fh:
        fh.write(bytes(buf.data()))
    dlg.close()


def _check_layer(model_path, layer: str) -> None:
    """A WorkbenchError unless `layer` names a tensor or an expert group of the model (its
    header read, no tensor)."""
    from workbench.api import open_model
    from workbench.api.models import expert_groups
    model = open_model(str(model_path))
    if layer not in model.tensors and layer not in expert_groups(model):
        raise WorkbenchError("no such tensor or expert group in this model",
                             path=str(model_path), tensor=layer)


def render(model_path, out_path, plan_path=None, layer=None, size=(1600, 1000), tab="table",
           compare: bool = False, methods=(), scope: str = "pareto", busy: bool = False,
           dialog: str | None = None) -> None:
    """Open the window offscreen on a model (+ plan), select a layer, wait, save a PNG.
    `methods` (imatrix, gptq, awq): ticked in the comparison tab, rows per method in `scope`
    (pareto | current | all). `busy`: the window while its jobs still run (the work queue,
    the panels' waiting states) instead of once idle. `dialog="export"`: the Export dialog over
    the window, once its format check is done."""
    from .main import create_app, build_window
    from .messages import RecordedMessages
    if layer:
        _check_layer(model_path, layer)      # before the window opens and starts its jobs
    app = create_app(offscreen=True)
    msgs = RecordedMessages()
    win = build_window(model_path, plan_path, messages=msgs, autosave=False)
    win.resize(*size)
    win.fit_layout()
    win.show()
    # --busy shows the window as `gui` starts it: the kernel compilation queued too (IDLE)
    win.analyzer.warmup(jit=busy)
    try:
        if busy:
            while win.doc.model is None and not msgs.errors:   # the model opened, no more
                app.processEvents()
                time.sleep(0.02)
            if msgs.errors:
                raise WorkbenchError(msgs.errors[0][1].split("\n")[0])
            if layer and layer in win.doc.model.tensors:
                win.select(layer)
            win.tabs.setCurrentIndex(win.effects_tab_index if tab == "budget" else
                                     win.map_tab_index if tab == "map" else TABS.get(tab, 0))
            wait_busy(app, win, tab)
            _shoot(app, win, size, dialog, out_path, busy=True)
            return
        wait_idle(app, win)
        if msgs.errors:
            raise WorkbenchError(msgs.errors[0][1].split("\n")[0])
        if layer:
            from workbench.api.models import expert_groups
            groups = expert_groups(win.doc.model)
            if layer in groups:   # an expert group ('layer 1 experts down'): its spread
                win.select(groups[layer][0])
                wait_idle(app, win)
                if not win.browser.show_group(layer):
                    win.select_expert_group(layer)
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
        _shoot(app, win, size, dialog, out_path)
    finally:
        win.autosave_enabled = False
        win.runner.shutdown()
        win.deleteLater()
        app.processEvents()


def _shoot(app, win, size, dialog, out_path, busy: bool = False) -> None:
    """The window at `size` (or the export dialog over it) as a PNG; `busy`: its waiting panels
    and work queue drawn as of now, while jobs still run."""
    win.resize(*size)
    win.fit_layout()
    app.processEvents()
    if dialog == "export":
        export_dialog_png(app, win, out_path)
        return
    if busy:
        win.work_queue.refresh()      # the queue's figures as of the picture
        for page in (win.budget_panel, win.sensitivity_view):
            if page.isVisible() and page.fx.table() is None:
                page._show_waiting()
        win.tensor_sensitivity.refresh()
        app.processEvents()
    grab_png(win, out_path)

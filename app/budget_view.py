"""The budget control (re-solves the allocation over the cached sensitivity table and applies it
as one undoable edit) and the frontier plot (size vs predicted error of allocated plans over a
range of budgets, uniform plans and llama.cpp recipes; the current plan marked; a click applies
a point). The numbers come from workbench.planning.allocate / workbench.planning.frontier via app.effects."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, Qt, QTimer, Signal
from PySide6.QtWidgets import (QComboBox, QDoubleSpinBox, QHBoxLayout, QLabel, QPushButton,
                               QSlider, QStackedWidget, QVBoxLayout, QWidget)

from .commands import _short
from .format import fmt_bytes, fmt_float
from .fit_label import FitLabel, never_widens, thin_bar

STYLE = {"allocated": ("o", "#4c9aff", 8), "uniform": ("s", "#ffb454", 9),
         "recipe": ("t", "#9ece6a", 11), "current": ("star", "#ff5370", 18)}
PICK_PX = 14


class FrontierPlot(pg.PlotWidget):
    """x: bits per weight (as evaluate counts them); y: predicted error (log)."""

    pointClicked = Signal(object)     # an app.effects_jobs.Point
    hovered = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("FrontierPlot")
        self.points: list = []
        self.current = None
        item = self.getPlotItem()
        item.setMenuEnabled(False)
        item.hideButtons()
        item.setLogMode(x=False, y=True)
        item.showGrid(x=True, y=True, alpha=0.15)
        item.setLabel("bottom", "bits / weight")
        item.setLabel("left", "predicted error")
        self.legend = item.addLegend(offset=(-8, 8), labelTextSize="8pt")
        self.items = {}
        for kind, (sym, col, size) in STYLE.items():
            pen = pg.mkPen(col, width=1.5) if kind == "allocated" else None
            it = pg.PlotDataItem(pen=pen, symbol=sym, symbolSize=size, symbolBrush=col,
                                 symbolPen="#ffffff" if kind == "current" else None,
                                 name={"allocated": "allocated (budget)", "uniform": "uniform",
                                       "recipe": "llama.cpp recipe",
                                       "current": "current plan"}[kind])
            self.addItem(it)
            self.items[kind] = it
        self.budget_line = pg.InfiniteLine(angle=90, pen=pg.mkPen("#8a92a3", width=1,
                                                                  style=Qt.PenStyle.DashLine))
        self.budget_line.setVisible(False)
        self.addItem(self.budget_line)
        self.texts: list = []
        from .plots.labels import LabelPlacer
        self.placer = LabelPlacer(item)
        self.scene().sigMouseClicked.connect(self._click)
        self.scene().sigMouseMoved.connect(self._hover)

    def set_points(self, points, current=None, budget_bpw=None) -> None:
        self.points = list(points)
        self.current = current
        labelled = []
        for kind in ("allocated", "uniform", "recipe"):
            pts = sorted((p for p in self.points if p.kind == kind and p.predicted > 0),
                         key=lambda p: p.bits_per_weight)
            self.items[kind].setData([p.bits_per_weight for p in pts], [p.predicted for p in pts])
            if kind != "allocated":
                labelled += [(p, kind) for p in pts]
        if current is not None and current.predicted > 0:
            self.items["current"].setData([current.bits_per_weight], [current.predicted])
        else:
            self.items["current"].setData([], [])
        self.budget_line.setVisible(budget_bpw is not None)
        if budget_bpw is not None:
            self.budget_line.setValue(budget_bpw)
        xs = [p.bits_per_weight for p in self.points if p.predicted > 0]
        ys = [np.log10(p.predicted) for p in self.points if p.predicted > 0]
        if current is not None and current.predicted > 0:
            xs.append(current.bits_per_weight)
            ys.append(np.log10(current.predicted))
        if xs:   # room for the labels on the right and at the top
            span = max(max(xs) - min(xs), 0.5)
            self.setXRange(min(xs) - 0.04 * span, max(xs) + 0.10 * span, padding=0)
            yspan = max(max(ys) - min(ys), 0.5)
            self.setYRange(min(ys) - 0.05 * yspan, max(ys) + 0.12 * yspan, padding=0)
        else:
            self.getPlotItem().enableAutoRange()
        # labels after the ranges (placed in pixels): the recipes first, then the uniform
        # plans; none covers another label or a point (app.plots.labels)
        marks = [(p.bits_per_weight, float(np.log10(p.predicted)))
                 for p in self.points if p.predicted > 0]
        if current is not None and current.predicted > 0:
            marks.append((current.bits_per_weight, float(np.log10(current.predicted))))
        labelled.sort(key=lambda pk: pk[1] != "recipe")
        self.placer.set([(p.bits_per_weight, float(np.log10(p.predicted)), p.label,
                          STYLE[kind][1]) for p, kind in labelled], marks)
        self.texts = [t for t in self.placer.texts if t.isVisible()]

    def view_pos(self, p) -> QPointF:
        return QPointF(p.bits_per_weight, float(np.log10(p.predicted)))

    def widget_pos(self, p):
        """Where a point is drawn, in viewport coordinates (for tests and hit testing)."""
        scene = self.getPlotItem().vb.mapViewToScene(self.view_pos(p))
        return self.mapFromScene(scene)

    def point_at(self, scene_pos):
        best, best_d = None, PICK_PX
        vb = self.getPlotItem().vb
        for p in self.points:
            if p.predicted <= 0:
                continue
            s = vb.mapViewToScene(self.view_pos(p))
            d = float(np.hypot(s.x() - scene_pos.x(), s.y() - scene_pos.y()))
            if d <= best_d:
                best, best_d = p, d
        return best

    def _click(self, ev) -> None:
        if ev.button() != Qt.MouseButton.LeftButton:
            return
        p = self.point_at(ev.scenePos())
        if p is not None:
            self.pointClicked.emit(p)

    def _hover(self, pos) -> None:
        p = self.point_at(pos)
        if p is not None:
            self.hovered.emit(describe(p) + " · click to apply")


def describe(p) -> str:
    kinds = {}
    for s in p.assignment.values():
        kinds[s] = kinds.get(s, 0) + 1
    mix = ", ".join(f"{s}×{c}" for s, c in sorted(kinds.items(), key=lambda kv: -kv[1])[:4])
    return (f"{p.kind} {p.label}: {p.bits_per_weight:.3f} bits/weight · {fmt_bytes(p.bytes)} · "
            f"predicted error {fmt_float(p.predicted)} · {mix}")


class BudgetPanel(QWidget):
    SLIDER_STEPS = 1000

    def __init__(self, doc, effects, parent=None):
        super().__init__(parent)
        self.doc = doc
        self.fx = effects
        self.spin = QDoubleSpinBox()
        self.spin.setObjectName("BudgetSpin")
        self.spin.setMinimumWidth(95)
        self.spin.setKeyboardTracking(False)
        self.spin.setDecimals(3)
        self.spin.setSingleStep(0.05)
        self.spin.setToolTip("Size budget: the plan's bits per weight over every tensor (or "
                             "bytes) exactly as `evaluate` counts them, embeddings and norms "
                             "included (the command line's `allocate --budget-bpw X`; other "
                             "accountings: `--bpw-over linear`, `--budget-file-bytes`, "
                             "`--budget-of`); the allocation never exceeds it. Ctrl+B")
        self.unit = QComboBox()
        self.unit.setObjectName("BudgetUnit")
        self.unit.addItems(["bits/weight", "MB"])
        self.unit.currentIndexChanged.connect(self._unit_changed)
        self.unit.setMinimumWidth(70)
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setObjectName("BudgetSlider")
        self.slider.setRange(0, self.SLIDER_STEPS)
        self.slider.setMinimumWidth(30)
        self.apply_button = QPushButton("Apply")
        self.apply_button.setObjectName("ApplyBudget")
        self.apply_button.setToolTip("Allocate for this budget and apply it (one undoable edit)")
        self.pin_button = QPushButton("Pin tensor")
        self.pin_button.setObjectName("PinButton")
        self.pin_button.setCheckable(True)
        self.pin_button.setToolTip("Keep the selected tensor at its current scheme in every "
                                   "allocation (Ctrl+K)")
        self.pins_label = QLabel("")
        self.pins_label.setObjectName("Muted")
        # one line, elided to the width; the tooltip has it whole (and the plan's mix)
        self.result = FitLabel("")
        self.result.setObjectName("BudgetResult")
        never_widens(self.result)
        self.hover = QLabel(" ")
        self.hover.setObjectName("HoverReadout")
        never_widens(self.hover)
        # what the API chose (workbench.api: the measure, the candidates, the methods) and why
        self.choice = FitLabel("")
        self.choice.setObjectName("BudgetChoice")
        never_widens(self.choice)
        self.plot = FrontierPlot()
        self.waiting = WaitingPage()
        self.waiting.compute.clicked.connect(lambda: effects.request_table())
        self.stack = QStackedWidget()
        self.stack.addWidget(self.plot)
        self.stack.addWidget(self.waiting)
        row = QHBoxLayout()
        row.setSpacing(4)
        row.addWidget(QLabel("Budget"))
        row.addWidget(self.spin)
        row.addWidget(self.unit)
        row.addWidget(self.apply_button)
        row.addWidget(self.slider, 1)
        row2 = QHBoxLayout()
        row2.setSpacing(4)
        row2.addWidget(self.pin_button)
        row2.addWidget(self.pins_label)
        row2.addWidget(self.result, 1)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 2)
        lay.setSpacing(3)
        lay.addLayout(row)
        lay.addLayout(row2)
        lay.addWidget(self.choice)
        lay.addWidget(self.stack, 1)
        lay.addWidget(self.hover)
        self._range = (0.0, 0.0)   # bits/weight
        self._initialised = False
        self._debounce = QTimer(self, singleShot=True, interval=250)
        self._debounce.timeout.connect(self.apply_budget)
        self.spin.valueChanged.connect(self._spin_changed)
        self.slider.valueChanged.connect(self._slider_moved)
        self.slider.sliderReleased.connect(self.apply_budget)
        self.apply_button.clicked.connect(self.apply_budget)
        self.pin_button.clicked.connect(lambda: effects.toggle_pin(doc.current))
        self.plot.pointClicked.connect(effects.apply_point)
        self.plot.hovered.connect(self.hover.setText)
        effects.frontierChanged.connect(self.refresh)
        effects.allocationChanged.connect(self._show_result)
        effects.pinsChanged.connect(self._pins)
        effects.tableChanged.connect(lambda _m: self.refresh())
        doc.currentChanged.connect(lambda _n: self._pins())
        doc.modelChanged.connect(self._model_changed)
        runner = effects.runner
        for sig in (runner.taskStarted, runner.taskProgress):
            sig.connect(self._job_event)
        self.refresh()

    def _job_event(self, task) -> None:
        """The table's or the frontier's progress: the waiting page only (cheap)."""
        if self.stack.currentIndex() != 1:
            return
        mine = self._table_task() if self.fx.table() is None else self.fx._frontier_task
        if mine is not None and (task is mine or not mine.started):
            self._show_waiting()

    def _table_task(self):
        fx = self.fx
        return fx._table_tasks.get(fx._key(fx.measure)) if fx.doc.model is not None else None

    def _model_changed(self) -> None:
        """Another model: its own budget range and starting value, nothing of the last one's."""
        self._initialised = False
        self._range = (0.0, 0.0)
        self.result.setText("")
        self.result.setToolTip("")
        self.hover.setText(" ")
        self._pins()
        self.refresh()

    # ---- budget units ----------------------------------------------------------------------------
    def _params(self) -> int:
        return self.doc.model.total_params if self.doc.model is not None else 0

    def budget(self) -> tuple[float | None, int | None]:
        """(bits per weight, bytes): one of them set, as the unit says."""
        if self.unit.currentIndex() == 0:
            return float(self.spin.value()), None
        return None, int(round(self.spin.value() * 1e6))

    def budget_bpw(self) -> float:
        bpw, nb = self.budget()
        return bpw if bpw is not None else 8.0 * nb / max(self._params(), 1)

    def _to_unit(self, bpw: float) -> float:
        return bpw if self.unit.currentIndex() == 0 else bpw * self._params() / 8.0 / 1e6

    def _set_range(self, lo: float, hi: float) -> None:
        self._range = (lo, hi)
        self.spin.blockSignals(True)
        if self.unit.currentIndex() == 0:
            self.spin.setDecimals(3)
            self.spin.setSingleStep(0.05)
            self.spin.setSuffix("")
        else:
            self.spin.setDecimals(4)
            self.spin.setSingleStep(0.01)
            self.spin.setSuffix(" MB")
        self.spin.setRange(self._to_unit(lo), self._to_unit(hi) + 1e-9)
        self.spin.blockSignals(False)

    def _unit_changed(self, i: int) -> None:
        v = self.spin.value()          # still in the previous unit
        bpw = v if i == 1 else 8.0 * v * 1e6 / max(self._params(), 1)
        self._set_range(*self._range)
        self.set_value_bpw(bpw, apply=False)

    def set_value_bpw(self, bpw: float, apply: bool = False) -> None:
        self.spin.blockSignals(True)
        self.spin.setValue(self._to_unit(bpw))
        self.spin.blockSignals(False)
        self._sync_slider()
        if apply:
            self.apply_budget()

    def _sync_slider(self) -> None:
        lo, hi = self._range
        frac = (self.budget_bpw() - lo) / (hi - lo) if hi > lo else 0.0
        self.slider.blockSignals(True)
        self.slider.setValue(int(round(max(0.0, min(1.0, frac)) * self.SLIDER_STEPS)))
        self.slider.blockSignals(False)

    def _spin_changed(self, _v) -> None:
        self._sync_slider()
        self._debounce.start()

    def _slider_moved(self, v: int) -> None:
        lo, hi = self._range
        self.spin.blockSignals(True)
        self.spin.setValue(self._to_unit(lo + (hi - lo) * v / self.SLIDER_STEPS))
        self.spin.blockSignals(False)
        if not self.slider.isSliderDown():
            self._debounce.start()

    def apply_budget(self):
        """Solve for the budget shown and apply it as one undoable edit."""
        self._debounce.stop()
        bpw, nb = self.budget()
        return self.fx.solve(budget_bpw=bpw, budget_bytes=nb, apply=True)

    # ---- display ---------------------------------------------------------------------------------
    def _pins(self) -> None:
        n = len(self.fx.pins)
        self.pins_label.setText(f"{n} pinned" if n else "")
        self.pins_label.setToolTip("\n".join(f"{_short(k)} = {v}" for k, v in self.fx.pins.items()))
        self.pin_button.setChecked(self.doc.current in self.fx.pins)

    def _show_choice(self) -> None:
        """The API's choices, elided to the width; the tooltip has them whole."""
        text = self.fx.choice_text()
        self.choice.set_forms([text])
        self.choice.setToolTip(text.replace(" · ", "\n"))

    def _show_result(self) -> None:
        fx = self.fx
        self._show_choice()
        if fx.preview is None and not fx.allocation_error:
            self.result.setText("")          # refresh() below says what the frontier holds
            self.result.setToolTip("")
        if fx.allocation_error:
            self.result.setText(f"cannot allocate: {fx.allocation_error}")
            self.result.setToolTip(self.result.text())
        elif fx.preview is not None:
            label, a, nb, pred, budget = fx.preview
            bpw = 8.0 * nb / max(self._params(), 1)
            kinds = {}
            for s in a.values():
                kinds[s] = kinds.get(s, 0) + 1
            mix = ", ".join(f"{s}×{c}" for s, c in sorted(kinds.items(), key=lambda kv: -kv[1]))
            full = (f"allocated {bpw:.3f} bits/weight over every tensor ({nb:,d} of "
                    f"{budget:,d} bytes as evaluate counts them) · predicted error "
                    f"{fmt_float(pred)}")
            self.result.set_forms([full, f"allocated {bpw:.3f} bits/weight ({nb:,d} of "
                                         f"{budget:,d} bytes) · predicted {fmt_float(pred)}",
                                   f"allocated {bpw:.3f} bits/weight · predicted "
                                   f"{fmt_float(pred)}"])
            self.result.setToolTip(f"{full}\n{mix}")
        self.refresh()

    # ---- waiting (issue 33: never empty axes nor a 0.000 budget) ----------------------------
    def waiting_state(self) -> tuple[str, str, float | None, bool]:
        """(headline, detail, fraction or None, offer Compute) while there is no frontier."""
        from .work_queue import task_line
        fx = self.fx
        if fx.doc.model is None:
            return "Open a model", "", None, False
        table = fx.table()
        if table is None:
            err = fx.table_error()
            if err:
                return ("Cannot compute the sensitivity table", err, None, True)
            task = self._table_task()
            if task is None or task.finished:
                return (f"The {fx.measure} sensitivity table is not computed",
                        "it was cancelled or not asked for yet: Compute starts it (the work "
                        "queue below shows its progress)", None, True)
            what, ahead_of = f"the {fx.measure} sensitivity table", "the frontier follows"
        else:
            task = fx._frontier_task
            if task is not None and task.state in ("cancelled", "failed"):
                return (f"The frontier was {task.state}", "Compute runs it again", None, True)
            if task is None or task.finished:
                return ("Waiting for the plan's schemes in the sensitivity table",
                        "the frontier is computed once every scheme the plan uses has a "
                        "sensitivity", None, False)
            what, ahead_of = "the frontier", "allocations over a range of budgets"
        from .work_queue import state_of
        state, ahead = state_of(fx.runner, task)
        line = task_line(task, state, ahead)
        frac = task.fraction if task.started else None
        return (f"Computing {what} · {task.progress_text() or state}", f"{task.name}: {line} "
                f"({ahead_of})", frac, False)

    def _show_waiting(self) -> None:
        head, detail, frac, offer = self.waiting_state()
        self.waiting.fill(head, detail, frac, offer)
        self.result.setText("")          # the waiting page says it (once)

    def _set_waiting(self, on: bool) -> None:
        """No figures yet: the spin box shows "—", not a 0.000 budget; the plot gives way to
        what it waits for."""
        self.stack.setCurrentIndex(1 if on else 0)
        if on:
            self.spin.blockSignals(True)
            self.spin.setSpecialValueText("—")
            self.spin.setRange(0.0, 0.0)
            self.spin.setValue(0.0)
            self.spin.blockSignals(False)
            self._range = (0.0, 0.0)
            self._initialised = False
            self.hover.setText(" ")
            self._show_waiting()
        elif self.spin.specialValueText():
            self.spin.setSpecialValueText("")

    def refresh(self) -> None:
        fx = self.fx
        self._show_choice()
        table = fx.table()
        ready = table is not None and bool(fx.frontier)
        for w in (self.spin, self.slider, self.apply_button):
            w.setEnabled(ready)
        self._set_waiting(not ready)
        if not ready:
            return
        uni = [p.bits_per_weight for p in fx.frontier if p.kind in ("uniform", "allocated")]
        if uni:
            lo, hi = min(uni), max(uni)
            cur = fx.current_point()
            if (lo, hi) != self._range or (not self._initialised and cur is not None):
                keep = self.budget_bpw() if self._initialised else None
                self._set_range(lo, hi)
                start = keep if keep is not None else (cur.bits_per_weight if cur else (lo + hi) / 2)
                self.set_value_bpw(min(max(start, lo), hi))
                self._initialised = self._initialised or cur is not None
        self.plot.set_points(fx.frontier, fx.current_point(),
                             self.budget_bpw() if ready else None)
        if fx.preview is None and not fx.allocation_error:
            count = {k: sum(1 for p in fx.frontier if p.kind == k)
                     for k in ("allocated", "uniform", "recipe")}
            self.result.setText(f"{count['allocated']} allocated, {count['uniform']} uniform, "
                                f"{count['recipe']} recipe plans · set a budget or click a point")
            self.result.setToolTip(self.result.text())


class WaitingPage(QWidget):
    """In place of the frontier plot while it has nothing to show: what it waits for, that
    job's progress, and Compute when nothing is running."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("BudgetWaiting")
        self.headline = QLabel("")
        self.headline.setObjectName("WaitingHeadline")
        self.headline.setStyleSheet("font-size: 11pt; font-weight: bold; color: #c9ced8;")
        self.headline.setWordWrap(True)
        self.bar = thin_bar("WaitingBar", maximum=420)
        self.detail = QLabel("")
        self.detail.setObjectName("Muted")
        self.detail.setWordWrap(True)
        self.compute = QPushButton("Compute")
        self.compute.setObjectName("ComputeTable")
        self.compute.setToolTip("Compute the sensitivity table (then the frontier)")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(24, 24, 24, 24)
        lay.addStretch(1)
        for w in (self.headline, self.bar, self.detail):
            lay.addWidget(w)
        row = QHBoxLayout()
        row.addWidget(self.compute)
        row.addStretch(1)
        lay.addLayout(row)
        lay.addStretch(2)

    def fill(self, headline: str, detail: str, fraction: float | None, offer: bool) -> None:
        self.headline.setText(headline)
        self.detail.setText(detail)
        self.bar.setVisible(fraction is not None)
        if fraction is not None:
            self.bar.setValue(int(1000 * fraction))
        self.compute.setVisible(offer)

"""Sensitivity views: tensors × schemes heat map or sorted bars for the chosen measure, and the
selected tensor's size / sensitivity curve beside its plots. The numbers are the table of
:func:`app.effects_jobs.table_job` (workbench.planning.sensitivity; `quant-workbench sensitivity` prints them)."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QComboBox, QHBoxLayout, QLabel, QLineEdit,
                               QStackedWidget, QVBoxLayout, QWidget)

from workbench.core.errors import WorkbenchError
from workbench.api.choices import list_measures
from workbench.api.plans import KEEP

from .commands import _short
from .effects import MEASURES
from .format import fmt_float
from .fit_label import never_widens

MEASURE_TEXT = {"auto": "the API's choice (workbench.api.resolve_measure, as `allocate`): fisher "
                        "when the model runs on the calibration text, else weight",
                **{m.name: m.description for m in list_measures()}}


def _log(v: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.log10(np.where(v > 0, v, np.nan))
    return out


def row_order_key(m: np.ndarray) -> np.ndarray:
    """Mean log10 value per row (rows without any value last)."""
    logv = _log(m)
    ok = np.isfinite(logv)
    cnt = ok.sum(axis=1)
    tot = np.where(ok, logv, 0.0).sum(axis=1)
    return np.where(cnt > 0, tot / np.maximum(cnt, 1), -np.inf)


def label_rows(n: int, height: float, label_h: float, y0: float = 0.0,
               y1: float | None = None) -> list[int]:
    """The rows 0..n-1 to label on a left axis `height` px tall showing rows y0..y1 (default
    0..n): every k-th row so that labels `label_h` px tall never overlap, starting at the
    first row whose centre lies half a label below the top, ending at the last one half a
    label above the bottom, so that no label sticks out of the plot (the top one sat half off
    it at 1280×800, clipped by the widget's edge). Each label stays on its own row."""
    y1 = float(n) if y1 is None else y1
    if n <= 0 or height <= 0 or y1 <= y0:
        return []
    px = height / (y1 - y0)                      # pixels per row
    step = max(1, int(-(-(label_h + 1) // px)))  # rows per label, rounded up
    half = label_h / 2.0
    first = max(0, int(-(-(half / px - 0.5 + y0) // 1)))
    rows = []
    i = first
    while i < n and (i + 0.5 - y0) * px <= height - half:
        rows.append(i)
        i += step
    return rows


def _row_labels(plot_item, names, font=None) -> list:
    """Left-axis labels of rows 0..n-1: every row's when they fit the plot's height, else
    every k-th (a 1280x800 window drew 23 labels into 220 px, on top of each other), each
    whole inside the plot (label_rows)."""
    from PySide6.QtGui import QFontMetrics
    fm = QFontMetrics(font) if font is not None else QFontMetrics(pg.QtGui.QFont())
    vb = plot_item.getViewBox()
    h = vb.height()
    y0, y1 = vb.viewRange()[1]
    if h < 20:
        h = 28 * (fm.height() + 1)     # not laid out yet: the next resize sets them again
        y0, y1 = 0.0, float(len(names))
    return [(i + 0.5, _short(names[i])) for i in label_rows(len(names), h, fm.height(), y0, y1)]


class HeatMap(pg.PlotWidget):
    """Rows: tensors (most sensitive first), columns: candidate schemes; colour: log10 value."""

    clicked = Signal(str)
    hovered = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("SensitivityHeatMap")
        self.names: list[str] = []
        self.schemes: list[str] = []
        self.values = np.zeros((0, 0))
        item = self.getPlotItem()
        item.setMenuEnabled(False)
        item.hideButtons()
        self.setMouseEnabled(x=False, y=False)
        item.invertY(True)
        self.image = pg.ImageItem(axisOrder="row-major")
        self.image.setColorMap(pg.colormap.get("viridis"))
        item.getAxis("bottom").setHeight(26)
        small = pg.QtGui.QFont()
        small.setPointSizeF(7.5)
        item.getAxis("bottom").setStyle(tickFont=small)
        item.getAxis("left").setStyle(tickFont=small)
        self.small = small
        item.getViewBox().sigResized.connect(lambda *_: self._left_ticks())
        self.addItem(self.image)
        # the colour scale (issue 23): log10 of the value, beside the map
        self.colour_bar = pg.ColorBarItem(values=(0, 1), colorMap=pg.colormap.get("viridis"),
                                          label="log10 value", interactive=False, width=12)
        self.colour_bar.setImageItem(self.image, insert_in=item)
        self.colour_bar.getAxis("right").setStyle(tickFont=small)
        self.marker = pg.QtWidgets.QGraphicsRectItem(0, 0, 1, 1)
        self.marker.setPen(pg.mkPen("#ff5370", width=2))
        self.marker.setVisible(False)
        self.addItem(self.marker)
        self.assigned = pg.ScatterPlotItem(symbol="o", size=7, pen=pg.mkPen("#ffffff"),
                                           brush=pg.mkBrush(0, 0, 0, 0))
        self.addItem(self.assigned)
        self.scene().sigMouseClicked.connect(self._click)
        self.scene().sigMouseMoved.connect(self._hover)

    def set_table(self, names, schemes, values, current=None, assignment=None) -> None:
        self.names, self.schemes = list(names), list(schemes)
        self.values = np.asarray(values, np.float64).reshape(len(self.names), len(self.schemes))
        logv = _log(self.values)
        if logv.size and np.isfinite(logv).any():
            lo, hi = np.nanmin(logv), np.nanmax(logv)
            img = np.nan_to_num(logv, nan=lo)
            self.image.setImage(img, levels=(lo, hi if hi > lo else lo + 1))
            self.colour_bar.setLevels((lo, hi if hi > lo else lo + 1))
        else:
            self.image.clear()
        self.image.setRect(0, 0, max(len(self.schemes), 1), max(len(self.names), 1))
        item = self.getPlotItem()
        item.setXRange(0, max(len(self.schemes), 1), padding=0)
        item.setYRange(0, max(len(self.names), 1), padding=0)
        self._left_ticks()          # after the range: the labels are placed in it
        xs, ys = [], []
        for i, n in enumerate(self.names):
            s = (assignment or {}).get(n)
            if s in self.schemes:
                xs.append(self.schemes.index(s) + 0.5)
                ys.append(i + 0.5)
        self.assigned.setData(xs, ys)
        self.set_current(current)

    def _left_ticks(self) -> None:
        self.getPlotItem().getAxis("left").setTicks(
            [_row_labels(self.getPlotItem(), self.names, self.small), []])
        self._bottom_ticks()

    def _bottom_ticks(self) -> None:
        """Column labels (5 characters at most): every column's when they fit the plot's
        width, else every k-th (the runtime's 65 candidates ran together); hover names each."""
        from PySide6.QtGui import QFontMetrics
        fm = QFontMetrics(self.small)
        w = self.getPlotItem().getViewBox().width()
        if w < 20:
            w = 400                 # not laid out yet: the next resize sets them again
        step = max(1, -(-len(self.schemes) * (fm.horizontalAdvance("q4_k…") + 4) // int(w)))
        self.getPlotItem().getAxis("bottom").setTicks([[
            (j + 0.5, s if len(s) <= 5 else s[:4] + "…") for j, s in enumerate(self.schemes)
            if j % step == 0], []])

    def set_current(self, name) -> None:
        if name in self.names:
            i = self.names.index(name)
            self.marker.setRect(0, i, len(self.schemes), 1)
            self.marker.setVisible(True)
        else:
            self.marker.setVisible(False)

    def cell_at(self, scene_pos):
        if not self.names:
            return None
        p = self.getPlotItem().vb.mapSceneToView(scene_pos)
        i, j = int(np.floor(p.y())), int(np.floor(p.x()))
        if 0 <= i < len(self.names) and 0 <= j < len(self.schemes):
            return i, j
        return None

    def _click(self, ev) -> None:
        cell = self.cell_at(ev.scenePos())
        if cell is not None:
            self.clicked.emit(self.names[cell[0]])

    def _hover(self, pos) -> None:
        cell = self.cell_at(pos)
        if cell is not None:
            i, j = cell
            self.hovered.emit(f"{_short(self.names[i])} · {self.schemes[j]}: "
                              f"{fmt_float(float(self.values[i, j]))}")


class SortedBars(pg.PlotWidget):
    """Each tensor's share of the plan's predicted error (its sensitivity under its assigned
    scheme), largest first."""

    clicked = Signal(str)
    hovered = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("SensitivityBars")
        self.names: list[str] = []
        self.share = np.zeros(0)
        item = self.getPlotItem()
        item.setMenuEnabled(False)
        item.hideButtons()
        item.invertY(True)
        item.setLabel("bottom", "share of the plan's predicted error (%)")
        self.setMouseEnabled(x=False, y=False)
        item.getViewBox().sigResized.connect(lambda *_: self._left_ticks())
        self.bars = pg.BarGraphItem(x0=[], y=[], height=0.8, width=[], brush="#4c9aff")
        self.addItem(self.bars)
        self.scene().sigMouseClicked.connect(self._click)
        self.scene().sigMouseMoved.connect(self._hover)

    def set_values(self, names, values, current=None) -> None:
        v = np.nan_to_num(np.asarray(values, np.float64), nan=0.0)
        order = np.argsort(-v, kind="stable")
        self.names = [names[k] for k in order]
        total = v.sum()
        self.share = 100.0 * v[order] / total if total > 0 else v[order]
        brushes = [pg.mkBrush("#ff5370" if n == current else "#4c9aff") for n in self.names]
        self.bars.setOpts(x0=np.zeros(len(self.names)), y=np.arange(len(self.names)) + 0.5,
                          height=0.8, width=self.share, brushes=brushes)
        self.getPlotItem().setYRange(0, max(len(self.names), 1), padding=0.01)
        self.getPlotItem().setXRange(0, float(self.share.max()) if self.share.size else 1.0,
                                     padding=0.02)
        self._left_ticks()          # after the range: the labels are placed in it

    def _left_ticks(self) -> None:
        self.getPlotItem().getAxis("left").setTicks(
            [_row_labels(self.getPlotItem(), self.names), []])

    def _row(self, scene_pos):
        if not self.names:
            return None
        p = self.getPlotItem().vb.mapSceneToView(scene_pos)
        i = int(np.floor(p.y()))
        return i if 0 <= i < len(self.names) else None

    def _click(self, ev) -> None:
        i = self._row(ev.scenePos())
        if i is not None:
            self.clicked.emit(self.names[i])

    def _hover(self, pos) -> None:
        i = self._row(pos)
        if i is not None:
            self.hovered.emit(f"{_short(self.names[i])}: {self.share[i]:.2f}% of the predicted error")


class SensitivityView(QWidget):
    """Measure / view / candidate-scheme controls over a heat map or sorted bars."""

    def __init__(self, doc, effects, parent=None):
        super().__init__(parent)
        self.doc = doc
        self.fx = effects
        self.measure_combo = QComboBox()
        self.measure_combo.setObjectName("MeasureCombo")
        self.measure_combo.addItems(list(MEASURES))
        self.measure_combo.setCurrentText(effects.measure)
        self.measure_combo.setToolTip("\n".join(f"{k}: {v}" for k, v in MEASURE_TEXT.items()))
        self.measure_combo.currentTextChanged.connect(self._measure_chosen)
        self.view_combo = QComboBox()
        self.view_combo.addItems(["heat map", "sorted bars"])
        self.view_combo.currentIndexChanged.connect(self._view_chosen)
        for c in (self.measure_combo, self.view_combo):
            c.setMinimumWidth(70)
        self.schemes_edit = QLineEdit(",".join(effects.schemes))
        self.schemes_edit.setObjectName("CandidateSchemes")
        self.schemes_edit.setToolTip("Candidate schemes of the table, the allocator and the "
                                     "frontier (comma-separated); Enter recomputes")
        self.schemes_edit.returnPressed.connect(self._schemes_entered)
        from .fit_label import FitLabel
        self.status = FitLabel("")
        self.status.setObjectName("Muted")
        never_widens(self.status)
        self.hover = QLabel(" ")
        self.hover.setObjectName("HoverReadout")
        never_widens(self.hover)
        self.heat = HeatMap()
        self.bars = SortedBars()
        self.stack = QStackedWidget()
        self.stack.addWidget(self.heat)
        self.stack.addWidget(self.bars)
        # no table yet: what it waits for, in place of empty axes (issue 33)
        self.waiting = QLabel("")
        self.waiting.setObjectName("SensitivityWaiting")
        self.waiting.setWordWrap(True)
        self.waiting.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.waiting.setStyleSheet("color: #8a92a3; font-size: 10pt; padding: 16px;")
        self.stack.addWidget(self.waiting)
        for w in (self.heat, self.bars):
            w.clicked.connect(doc.set_current)
            w.hovered.connect(self.hover.setText)
        row = QHBoxLayout()
        row.setSpacing(4)
        for label, w in (("Measure", self.measure_combo), ("View", self.view_combo)):
            row.addWidget(QLabel(label))
            row.addWidget(w)
        row.addStretch(1)
        row2 = QHBoxLayout()
        row2.setSpacing(4)
        row2.addWidget(QLabel("Schemes"))
        row2.addWidget(self.schemes_edit, 1)
        self.schemes_edit.setMinimumWidth(60)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 2)
        lay.setSpacing(3)
        lay.addLayout(row)
        lay.addLayout(row2)
        lay.addWidget(self.status)
        lay.addWidget(self.stack, 1)
        lay.addWidget(self.hover)
        # redrawn when shown: an edit made with this tab hidden cost every edit a redraw
        self._stale = False
        effects.tableChanged.connect(lambda _m: self._changed())
        doc.stateChanged.connect(lambda _c: self._changed())
        doc.currentChanged.connect(self._current)
        for sig in (effects.runner.taskStarted, effects.runner.taskProgress):
            sig.connect(self._job_event)

    def _job_event(self, task) -> None:
        fx = self.fx
        if fx.doc.model is None or self.stack.currentIndex() != 2 or not self.isVisible():
            return
        mine = fx._table_tasks.get(fx._key(fx.measure))
        if mine is not None and (task is mine or not mine.started):
            self._show_waiting()

    def waiting_text(self) -> str:
        """What the table view waits for (no table yet)."""
        from .work_queue import state_of, task_line
        fx = self.fx
        err = fx.table_error()
        if err:
            return f"cannot compute the {fx.measure} sensitivity table: {err}"
        task = fx._table_tasks.get(fx._key(fx.measure)) if fx.doc.model is not None else None
        if task is None or task.finished:
            return (f"the {fx.measure} sensitivity table is not computed (cancelled or not asked "
                    "for yet): Compute in the budget panel starts it")
        state, ahead = state_of(fx.runner, task)
        # the progress itself is shown once, beside this, where the work is (the budget panel)
        return (f"computing the {fx.measure} sensitivity table: "
                f"{task_line(task, state, ahead, figures=False)}")

    def _show_waiting(self) -> None:
        self.status.setText("")          # the page below says it (once)
        self.waiting.setText(self.waiting_text())

    def _changed(self) -> None:
        if self.isVisible():
            self.refresh()
        else:
            self._stale = True

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if self._stale:
            self._stale = False
            self.refresh()

    def _measure_chosen(self, m: str) -> None:
        if m and m != self.fx.measure:
            self.fx.set_measure(m)

    def _view_chosen(self, i: int) -> None:
        self.refresh()

    def _schemes_entered(self) -> None:
        try:
            self.fx.set_schemes(self.schemes_edit.text().split(","))
        except WorkbenchError as exc:
            self.status.setText(str(exc))
            return
        self.schemes_edit.setText(",".join(self.fx.schemes))

    def _current(self, name: str) -> None:
        self.heat.set_current(name)
        if self.stack.currentIndex() == 1:
            self._changed()

    def refresh(self) -> None:
        fx = self.fx
        if self.measure_combo.currentText() != fx.measure:
            self.measure_combo.blockSignals(True)
            self.measure_combo.setCurrentText(fx.measure)
            self.measure_combo.blockSignals(False)
        table = fx.table()
        if table is None:
            self.stack.setCurrentIndex(2)
            self._show_waiting()
            self.heat.set_table([], [], np.zeros((0, 0)))
            self.bars.set_values([], [])
            return
        self.stack.setCurrentIndex(self.view_combo.currentIndex())
        m = table.matrix()
        order = np.argsort(-row_order_key(m), kind="stable")
        names = [table.names[k] for k in order]
        assignment = self.doc.assignment
        self.heat.set_table(names, table.schemes, m[order] if m.size else m,
                            self.doc.current, assignment)
        vals = [table.value(n, assignment.get(n, KEEP)) or 0.0 for n in table.names]
        self.bars.set_values(table.names, vals, self.doc.current)
        pred = sum(vals)
        size = f"{table.measure} · {len(table.names)} tensors × {len(table.schemes)} schemes"
        self.status.set_forms([f"{size} · plan's predicted error {fmt_float(pred)} · click a "
                               "row to select", f"{size} · predicted error {fmt_float(pred)}",
                               f"predicted error {fmt_float(pred)}"])
        self.status.setToolTip(f"{table.measure} ({table.reason}): "
                               + MEASURE_TEXT.get(table.measure, table.measure) + "; colour: log10 of the value; "
                               "circles: the scheme each tensor has now")


class TensorSensitivity(QWidget):
    """The selected tensor under each candidate scheme: bits per weight vs sensitivity (its own
    size / error curve, what the allocator trades), the assigned scheme marked."""

    def __init__(self, doc, effects, parent=None):
        super().__init__(parent)
        self.doc = doc
        self.fx = effects
        self.title = QLabel("Sensitivity")
        self.title.setObjectName("PanelTitle")
        self.summary = QLabel("")
        self.summary.setObjectName("TensorSensitivitySummary")
        self.summary.setWordWrap(True)
        self.summary.setMinimumWidth(1)
        self.plot = pg.PlotWidget()
        self.plot.setObjectName("TensorSensitivityPlot")
        item = self.plot.getPlotItem()
        item.setMenuEnabled(False)
        item.hideButtons()
        item.setLogMode(x=False, y=True)
        item.setLabel("bottom", "bits / weight")
        item.setLabel("left", "sensitivity")
        item.showGrid(x=True, y=True, alpha=0.15)
        self.curve = pg.PlotDataItem(pen=pg.mkPen("#4c9aff", width=1.5), symbol="o",
                                     symbolSize=6, symbolBrush="#4c9aff", symbolPen=None)
        self.mark = pg.PlotDataItem(pen=None, symbol="star", symbolSize=16,
                                    symbolBrush="#ff5370", symbolPen="#ffffff")
        self.plot.addItem(self.curve)
        self.plot.addItem(self.mark)
        self.placer = None      # app.plots.labels.LabelPlacer: scheme names, no overlaps
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 0, 0, 0)
        lay.setSpacing(2)
        lay.addWidget(self.title)
        lay.addWidget(self.summary)
        lay.addWidget(self.plot, 1)
        # without a table the empty log axis crowded its labels ("9 8 7 6 5 …"): the plot is
        # hidden (and not painted on each selection) until there is something to show
        self.blank = QWidget()
        lay.addWidget(self.blank, 1)
        self._show_plot(False)
        self.setMinimumWidth(200)
        doc.currentChanged.connect(lambda _n: self.refresh())
        doc.stateChanged.connect(lambda _c: self.refresh())
        effects.tableChanged.connect(lambda _m: self.refresh())
        for sig in (effects.runner.taskStarted, effects.runner.taskProgress):
            sig.connect(self._job_event)

    def _table_task(self):
        fx = self.fx
        return fx._table_tasks.get(fx._key(fx.measure)) if fx.doc.model is not None else None

    def _waiting(self) -> str:
        task = self._table_task()
        if task is None or task.finished:
            # a label, not a tab title: one "&" (a doubled one showed as "&&")
            return "open the Sensitivity & Budget tab (Ctrl+4) to compute"
        from .work_queue import state_of, task_line
        state, ahead = state_of(self.fx.runner, task)
        return f"waiting for the {self.fx.measure} sensitivity table: " \
               f"{task_line(task, state, ahead, stage=False, figures=False)}"

    def _job_event(self, task) -> None:
        mine = self._table_task()
        if self.fx.table() is None and mine is not None and self.isVisible() and (
                task is mine or not mine.started):
            self.summary.setText(self._waiting())

    def _show_plot(self, on: bool) -> None:
        if self.plot.isVisibleTo(self) != on or self.blank.isVisibleTo(self) == on:
            self.plot.setVisible(on)
            self.blank.setVisible(not on)

    def refresh(self) -> None:
        if self.placer is None:
            from .plots.labels import LabelPlacer
            self.placer = LabelPlacer(self.plot.getPlotItem())
        name = self.doc.current
        table = self.fx.table()
        self.title.setText(f"Sensitivity · {self.fx.measure}")
        if not name or table is None or name not in table.names:
            if not getattr(self, "_empty", False):   # cleared already: nothing to redraw
                self.curve.setData([], [])
                self.mark.setData([], [])
                self.placer.set([])
                self._show_plot(False)
                self._empty = True
            if table is None:
                self.summary.setText(self._waiting())
            else:
                self.summary.setText("not allocatable (kept)" if name else "")
            return
        self._show_plot(True)
        self._empty = False
        info = self.doc.model.info(name)
        pts = []
        for s in table.schemes:
            v, nb = table.value(name, s), table.nbytes.get((name, s))
            if v is not None and v > 0 and nb:
                pts.append((8.0 * nb / info.numel, v, s))
        pts.sort()
        self.curve.setData([p[0] for p in pts], [p[1] for p in pts])
        if pts:
            xs = [p[0] for p in pts]
            span = max(max(xs) - min(xs), 0.5)
            self.plot.setXRange(min(xs) - 0.05 * span, max(xs) + 0.18 * span, padding=0)
            ys = [np.log10(p[1]) for p in pts]
            yspan = max(max(ys) - min(ys), 0.5)
            self.plot.setYRange(min(ys) - 0.05 * yspan, max(ys) + 0.12 * yspan, padding=0)
        cur = self.doc.scheme_of(name)
        # the assigned scheme's label first, then the ends of the curve, then the rest; a
        # label that would cover another or a point is left out (hover the table for it)
        cands = sorted(pts, key=lambda p: (p[2] != cur, p not in (pts[0], pts[-1])))
        self.placer.set([(x, float(np.log10(v)), s, "#dfe3ea" if s == cur else "#8a92a3")
                         for x, v, s in cands],
                        [(x, float(np.log10(v))) for x, v, _s in pts])
        v = table.value(name, cur)
        ranked = sorted(((table.value(n, self.doc.scheme_of(n)) or 0.0), n) for n in table.names)
        rank = len(ranked) - [n for _, n in ranked].index(name)
        if v is not None and v > 0 and table.nbytes.get((name, cur)):
            self.mark.setData([8.0 * table.nbytes[(name, cur)] / info.numel], [v])
            self.summary.setText(f"{_short(name)} under {cur}: {fmt_float(v)} · rank {rank} of "
                                 f"{len(table.names)} in the plan (1 = largest)")
        else:
            self.mark.setData([], [])
            self.summary.setText(f"{_short(name)}: assigned {cur} (not a candidate scheme)")

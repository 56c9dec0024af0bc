"""One tensor across every scheme: bits per weight (log axis) against SQNR, one point per
scheme coloured by family, the Pareto front drawn as a step line with its points ringed,
the current scheme highlighted. Clicking a point emits `picked(scheme)`.

Given points that carry a ``method`` (app.comparison_model.MethodPoint: the comparison view with
methods ticked), the plot shows layer output SQNR, one series per method (its own colour and
marker, named in the legend line), the Pareto front across all of them, and a click emits
`pickedMethod(scheme, method)`."""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, Signal

from workbench.api.choices import FAMILIES

FAMILY_COLOURS = {"Float": "#7aa2f7", "Integer": "#9ece6a", "GGML legacy": "#ff9e64",
                  "K-quants": "#f7768e", "Codebooks": "#bb9af7", "MLX": "#e0af68",
                  "Other": "#c9ced8"}
METHOD_COLOURS = {"rtn": "#c9ced8", "imatrix": "#e0af68", "gptq": "#7dcfff", "awq": "#f7768e"}
METHOD_SYMBOLS = {"rtn": "o", "imatrix": "s", "gptq": "d", "awq": "star"}
METHOD_SIZES = {"rtn": 6, "imatrix": 9, "gptq": 10, "awq": 13}
METHOD_GLYPHS = {"rtn": "●", "imatrix": "■", "gptq": "◆", "awq": "★"}
CURRENT = "#ffffff"
PICK_RADIUS_PX = 12
RING_SIZE = 13          # the ring around a Pareto point, pixels
CURRENT_SIZE = 19       # the ring around the current scheme's point
TICKS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32)


class SchemePointsPlot(pg.PlotWidget):
    picked = Signal(str)
    pickedMethod = Signal(str, str)
    hovered = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("SchemePointsPlot")
        self.points = []                 # workbench.planning.scheme_choice.SchemePoint
        self.current: str | None = None
        self._xy = np.zeros((0, 2))      # plotted (bits, sqnr) per point (clipped at the top)
        self.top = math.inf
        item = self.getPlotItem()
        item.setLabel("bottom", "bits / weight")
        item.setLabel("left", "SQNR dB")
        item.getAxis("left").enableAutoSIPrefix(False)
        item.getAxis("bottom").enableAutoSIPrefix(False)
        item.setLogMode(x=True, y=False)
        # plain numbers on the log axis (not "2·10¹")
        item.getAxis("bottom").setTicks([[(math.log10(v), str(v)) for v in TICKS]])
        item.getViewBox().setDefaultPadding(0.04)
        item.showGrid(x=True, y=True, alpha=0.15)
        item.setMenuEnabled(False)
        self.methods_mode = False
        # the title's minimum width stays 0 whatever pyqtgraph sets it to (LabelItem.updateMin
        # on every setText: the plot item, a top-level graphics widget, then grew to the
        # unwrapped legend's width and stayed that wide, cut off at the pane's edge)
        lab = item.titleLabel
        own_update_min = lab.updateMin

        def update_min():
            own_update_min()
            lab.setMinimumWidth(0)
        lab.updateMin = update_min
        self._set_title()
        self.front = pg.PlotDataItem(pen=pg.mkPen("#e6e9ef", width=1,
                                                  style=pg.QtCore.Qt.PenStyle.DashLine),
                                     stepMode=None)
        self.scatter = pg.ScatterPlotItem(size=7, pen=pg.mkPen(None))
        self.rings = pg.ScatterPlotItem(size=RING_SIZE, brush=pg.mkBrush(None),
                                        pen=pg.mkPen("#e6e9ef", width=1.2))
        self.cur = pg.ScatterPlotItem(size=CURRENT_SIZE, brush=pg.mkBrush(None),
                                      pen=pg.mkPen(CURRENT, width=2.2))
        for it in (self.front, self.scatter, self.rings, self.cur):
            self.addItem(it)
        # the current scheme's name: placed clear of every marker (app.plots.labels)
        from .labels import LabelPlacer
        self.placer = LabelPlacer(item)
        self._half = np.zeros(0)         # half the drawn size of each point's marker, pixels
        item.getViewBox().sigRangeChanged.connect(lambda *_: self.placer.place())
        self.scene().sigMouseMoved.connect(self._hover)
        self.scene().sigMouseClicked.connect(self._click)

    def _set_title(self) -> None:
        item = self.getPlotItem()
        # entries joined by plain spaces (where a narrow plot wraps the line), each entry
        # held together by non-breaking ones
        if self.methods_mode:
            shown = {getattr(p, "method", None) for p in self.points} or set(METHOD_COLOURS)
            legend = " ".join(
                f"<span style='color:{METHOD_COLOURS[m]}'>{METHOD_GLYPHS[m]}&nbsp;{m}</span>"
                for m in METHOD_COLOURS if m in shown)
            item.setLabel("left", "layer output SQNR dB")
        else:
            legend = " ".join(
                f"<span style='color:{FAMILY_COLOURS[f]}'>●&nbsp;{f.replace(' ', '&nbsp;')}"
                "</span>" for f in FAMILIES)
            item.setLabel("left", "SQNR dB")
        item.setTitle(legend + " &nbsp;<span style='color:#e6e9ef'>◯&nbsp;Pareto "
                      "▲&nbsp;off&nbsp;the&nbsp;top</span>", size="8pt")
        self._fit_title()

    def _fit_title(self, width: float | None = None) -> None:
        """The legend line wraps onto a second line when the plot is narrower than it (a
        1280-pixel window with the table beside it) instead of widening the plot past its
        pane, where the right end of the axis and the legend were cut off. The label's
        minimum width never exceeds the plot's (a top-level graphics widget grows to its
        children's minimum, and stays that wide)."""
        item = getattr(self, "plotItem", None)
        if item is None:                    # a resize while pyqtgraph builds the widget
            return
        lab = item.titleLabel
        avail = max(120.0, (self.width() if width is None else width) - 24.0)
        doc = lab.item.document().clone()
        doc.setTextWidth(-1)
        lab.item.setTextWidth(avail if doc.idealWidth() > avail else -1)
        lab.updateMin()

    def resizeEvent(self, ev) -> None:     # noqa: N802 - Qt's name
        self._fit_title(ev.size().width() if ev is not None else None)
        super().resizeEvent(ev)

    # ---- data --------------------------------------------------------------------------------
    def set_points(self, points, current, methods: bool | None = None) -> None:
        """`current`: the current scheme, or (scheme, method) for method points; `methods`:
        whether these are method points (default: whether the points carry a method)."""
        self.points = list(points)
        self.current = current
        mode = any(hasattr(p, "method") for p in self.points) if methods is None else methods
        self.methods_mode = mode
        self._set_title()
        self._draw()

    def set_current(self, current: str | None) -> None:
        self.current = current
        self._draw_current()

    def _draw(self) -> None:
        pts = [p for p in self.points if p.bits_per_weight == p.bits_per_weight
               and p.bits_per_weight > 0 and not math.isnan(p.sqnr_db)]
        self.points = pts
        # the y axis covers the quantizing schemes (below 16 bits/weight); 16-bit floats and
        # exact stores sit on its top edge as triangles (their value in the tooltip), so they
        # do not squash the region where the choice is made
        low = [p.sqnr_db for p in pts if math.isfinite(p.sqnr_db) and p.bits_per_weight < 15.9]
        anyf = [p.sqnr_db for p in pts if math.isfinite(p.sqnr_db)]
        top = (max(low) + 8.0) if low else ((max(anyf) + 6.0) if anyf else 100.0)
        self.top = top
        xy = np.array([(p.bits_per_weight, min(p.sqnr_db, top)) for p in pts],
                      np.float64).reshape(-1, 2)
        self._xy = xy
        if self.methods_mode:
            spots = [{"pos": (math.log10(x), y), "data": i,
                      "brush": pg.mkBrush(METHOD_COLOURS.get(p.method, "#c9ced8")),
                      "symbol": "t1" if p.sqnr_db > top else METHOD_SYMBOLS.get(p.method, "o"),
                      "size": 10 if p.sqnr_db > top else METHOD_SIZES.get(p.method, 8)}
                     for i, ((x, y), p) in enumerate(zip(xy, pts))]
            # methods with near-equal figures overlap: the larger markers go underneath
            spots.sort(key=lambda d: -d["size"])
        else:
            spots = [{"pos": (math.log10(x), y), "data": p.scheme,
                      "brush": pg.mkBrush(FAMILY_COLOURS.get(p.family, "#c9ced8")),
                      "symbol": "t1" if p.sqnr_db > top else "o",
                      "size": 10 if p.sqnr_db > top else 7}
                     for (x, y), p in zip(xy, pts)]
        self.scatter.setData(spots)
        half = np.array([(10 if p.sqnr_db > top else (METHOD_SIZES.get(p.method, 8)
                                                      if self.methods_mode else 7)) / 2 + 1.0
                         for p in pts], np.float64)
        ringed = np.array([bool(p.pareto) for p in pts], bool)
        self._half = np.where(ringed, np.maximum(half, RING_SIZE / 2 + 1.0), half) \
            if len(pts) else np.zeros(0)
        front = sorted((x, y) for (x, y), p in zip(xy, pts) if p.pareto)
        if front:
            fx = np.array([f[0] for f in front])
            fy = np.array([f[1] for f in front])
            self.front.setData(np.repeat(fx, 2)[1:], np.repeat(fy, 2)[:-1])
            self.rings.setData(np.log10(fx), fy)
        else:
            self.front.setData([], [])
            self.rings.setData([], [])
        vb = self.getPlotItem().getViewBox()
        if len(xy):
            # explicit ranges with room for the end tick labels (32 was cut at the edge)
            x0, x1 = float(xy[:, 0].min()), float(xy[:, 0].max())
            y0, y1 = float(xy[:, 1].min()), float(xy[:, 1].max())
            vb.setRange(xRange=(math.log10(x0 * 0.9), math.log10(x1 * 1.12)),
                        yRange=(y0 - 0.05 * (y1 - y0 + 1), y1 + 0.08 * (y1 - y0 + 1)),
                        padding=0)
        else:
            vb.setRange(xRange=(math.log10(2), math.log10(32)), yRange=(0, 60), padding=0)
        self._draw_current()      # placed in the final view range

    @property
    def cur_label(self):
        """The current scheme's label (a pyqtgraph TextItem), or None before the first."""
        return self.placer.texts[0] if self.placer.texts else None

    def _draw_current(self) -> None:
        cur = self.current
        i = self.index_of(*cur) if isinstance(cur, tuple) else self.index_of(cur)
        if i is None:
            self.cur.setData([], [])
            self.placer.set([])
            return
        x, y = self._xy[i]
        self.cur.setData([math.log10(x)], [y])
        text = " · ".join(cur) if isinstance(cur, tuple) else f"{cur}"
        # clear of every other marker and of its own ring; never hidden (the name of what is
        # assigned), farther out when the points around it are crowded
        others = [(math.log10(px), py, h) for j, ((px, py), h)
                  in enumerate(zip(self._xy, self._half)) if j != i]
        self.placer.set([(math.log10(x), y, text, CURRENT, CURRENT_SIZE / 2 + 1.5, True)],
                        others)

    def index_of(self, scheme: str | None, method: str | None = None) -> int | None:
        """The point of `scheme` (and `method`, for method points; rtn when not given)."""
        for i, p in enumerate(self.points):
            if p.scheme == scheme and getattr(p, "method", "rtn") == (method or "rtn"):
                return i
        return None

    # ---- interaction ---------------------------------------------------------------------
    def scene_pos(self, i: int) -> QPointF:
        x, y = self._xy[i]
        return self.getPlotItem().vb.mapViewToScene(QPointF(math.log10(x), y))

    def nearest(self, scene_pos, radius: float = PICK_RADIUS_PX) -> int | None:
        best, best_d = None, radius
        for i in range(len(self.points)):
            q = self.scene_pos(i)
            d = math.hypot(q.x() - scene_pos.x(), q.y() - scene_pos.y())
            if d <= best_d:
                best, best_d = i, d
        return best

    def describe(self, i: int) -> str:
        p = self.points[i]
        sq = "exact" if math.isinf(p.sqnr_db) else f"{p.sqnr_db:.2f} dB"
        if p.sqnr_db > self.top:
            sq += " (above the plot's top edge)"
        if hasattr(p, "method"):
            cur = self.current == (p.scheme, p.method)
            return (f"{p.scheme} · {p.method}: {p.bits_per_weight:.3f} bits/weight, layer output "
                    f"SQNR {sq}, weight SQNR {p.weight_sqnr_db:.2f} dB"
                    f"{'  · Pareto' if p.pareto else ''}"
                    f"{'  · current' if cur else '  · click to assign scheme and method'}")
        return (f"{p.scheme} ({p.family}): {p.bits_per_weight:.3f} bits/weight, SQNR {sq}, "
                f"rel. RMSE {p.rel_rmse:.4g}{'  · Pareto' if p.pareto else ''}"
                f"{'  · current' if p.scheme == self.current else '  · click to assign'}")

    def _hover(self, pos) -> None:
        if not self.points or not self.sceneBoundingRect().contains(pos):
            return
        i = self.nearest(pos)
        text = self.describe(i) if i is not None else ""
        self.setToolTip(text)
        self.hovered.emit(text)

    def _click(self, ev) -> None:
        i = self.nearest(ev.scenePos())
        if i is not None:
            ev.accept()
            p = self.points[i]
            if hasattr(p, "method"):
                self.pickedMethod.emit(p.scheme, p.method)
            else:
                self.picked.emit(p.scheme)

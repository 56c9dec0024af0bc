"""Weight histogram (linear or log count) with the scheme's grid and the dequantized histogram."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Signal

from .. import perf as plots
from ..analysis import MAX_GRID_LINES
from ..format import fmt_float

ORIGINAL = "#4c9aff"
DEQUANT = "#ffb454"
GRID = (200, 205, 215, 30)
RUG = (230, 233, 240, 210)


class HistogramPlot(pg.PlotWidget):
    hovered = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("HistogramPlot")
        self.log = False
        self.edges = np.zeros(0)
        self.counts = np.zeros(0)
        self.deq_counts = None
        self.grid = None
        item = self.getPlotItem()
        item.setLabel("bottom", "weight value")
        item.setLabel("left", "count")
        from . import fix_axes, opaque
        opaque(self)
        fix_axes(item, "10000")
        from . import fast_grid
        fast_grid(item, 0.15)
        item.setMenuEnabled(False)
        # the legend is the plot's title line (as the channel plot's): a box inside the plot
        # covered the peak of a histogram whose range is lopsided
        self.legend = None
        item.setTitle(f"<span style='color:{ORIGINAL}'>▆ weights</span>&nbsp;&nbsp;"
                      f"<span style='color:{DEQUANT}'>━ dequantized</span>", size="8pt")
        item.titleLabel.setMinimumWidth(0)
        self.grid_item = pg.PlotCurveItem(pen=pg.mkPen(GRID, width=1), connect="pairs")
        self.rug_item = pg.PlotCurveItem(pen=pg.mkPen(RUG, width=1), connect="pairs")
        self.bars = pg.PlotDataItem(stepMode="center", fillLevel=0,
                                    brush=pg.mkBrush(76, 154, 255, 90),
                                    pen=pg.mkPen(ORIGINAL, width=1.2), name="weights")
        self.deq = pg.PlotDataItem(stepMode="center", pen=pg.mkPen(DEQUANT, width=1.4),
                                   name="dequantized")
        self.addItem(self.grid_item)
        self.addItem(self.rug_item)
        self.addItem(self.bars)
        self.addItem(self.deq)
        self.scene().sigMouseMoved.connect(self._hover)

    def set_log(self, on: bool) -> None:
        self.log = bool(on)
        # first a y range valid in both modes: the axis takes 10**range in log mode, and the
        # linear range of the counts (thousands) overflowed it (a RuntimeWarning)
        top = max(float(self.counts.max()), 1.0) if self.counts.size else 1.0
        self.getPlotItem().setYRange(0.0, np.log10(top) + 0.1, padding=0)
        self.getPlotItem().setLogMode(False, self.log)
        self.getPlotItem().setLabel("left", "count (log)" if self.log else "count")
        self._draw()
        if plots.FAST:
            self._fit_range()

    def set_data(self, edges, counts, deq_counts=None, grid=None, scheme: str = "") -> None:
        self.edges = np.asarray(edges, dtype=np.float64)
        self.counts = np.asarray(counts, dtype=np.float64)
        self.deq_counts = None if deq_counts is None else np.asarray(deq_counts, np.float64)
        self.grid = grid
        self.scheme = scheme
        self._draw()
        if plots.FAST:
            self._fit_range()
        else:
            self.getPlotItem().enableAutoRange()

    def _fit_range(self) -> None:
        """The view range from the data held (no auto-range pass at paint time, which moved
        the axes during the paint and painted the plot twice)."""
        vb = self.getPlotItem().vb
        if self.counts.size == 0 or self.edges.size < 2:
            vb.setRange(xRange=(0, 1), yRange=(0, 1), padding=0)
            self.getPlotItem().vb.updateMatrix()  # transform final before the paint
            return
        top = max(float(self.counts.max()), 1.0)
        if self.deq_counts is not None and self.deq_counts.size:
            top = max(top, float(self.deq_counts.max()))
        y = (0.0, np.log10(top) * 1.04 + 0.05) if self.log else (0.0, top * 1.04)
        vb.setRange(xRange=(float(self.edges[0]), float(self.edges[-1])), yRange=y,
                    padding=0.02)
        self.getPlotItem().vb.updateMatrix()  # transform final before the paint

    def clear_data(self) -> None:
        self.set_data(np.zeros(0), np.zeros(0))

    def _y(self, c):
        return np.maximum(c, 1.0) if self.log else c

    def _draw(self) -> None:
        # fast path (app.perf): the two step curves are drawn without antialiasing. Every
        # segment of a histogram's outline is horizontal or vertical, so the picture is the
        # same bars with crisp edges, and rasterizing the filled area antialiased was most of
        # this plot's paint (3-4 ms of a selection). Exports (pyqtgraph's exporters) still
        # antialias.
        for item in (self.bars, self.deq):
            item.opts["antialias"] = not plots.FAST
        if self.counts.size == 0:
            self.bars.setData([], [])
            self.deq.setData([], [])
            self.grid_item.setData([], [])
            self.rug_item.setData([], [])
            return
        self.bars.setData(self.edges, self._y(self.counts))
        self.bars.setFillLevel(0 if not self.log else 0)
        if self.deq_counts is not None:
            self.deq.setData(self.edges, self._y(self.deq_counts))
            self.deq.setVisible(True)
        else:
            self.deq.setData([], [])
        top = max(float(self.counts.max()), 1.0)
        if self.deq_counts is not None:
            top = max(top, float(self.deq_counts.max()))
        g = self.grid
        if g is not None and 0 < len(g) <= MAX_GRID_LINES:
            # faint full-height lines, plus bright ticks along the axis ("rug")
            xs = np.repeat(np.asarray(g, np.float64), 2)
            lo, hi = (0.0, np.log10(top)) if self.log else (0.0, top)
            if len(g) <= 64:
                self.grid_item.setData(xs, np.tile([lo, hi], len(g)))
            else:
                self.grid_item.setData([], [])
            self.rug_item.setData(xs, np.tile([lo, lo + 0.05 * (hi - lo)], len(g)))
        else:
            self.grid_item.setData([], [])
            self.rug_item.setData([], [])

    def grid_text(self) -> str:
        g = self.grid
        if g is None:
            return "no quantization grid (kept)"
        if len(g) > MAX_GRID_LINES:
            return f"{len(g)} representable values in range: grid too fine to draw"
        return f"{len(g)} grid levels for a block spanning the tensor's range"

    def _hover(self, pos) -> None:
        if self.counts.size == 0 or not self.sceneBoundingRect().contains(pos):
            return
        x = self.getPlotItem().vb.mapSceneToView(pos).x()
        i = int(np.searchsorted(self.edges, x, side="right") - 1)
        if 0 <= i < self.counts.size:
            text = (f"[{fmt_float(self.edges[i])}, {fmt_float(self.edges[i + 1])}):  "
                    f"{int(self.counts[i]):,d} weights")
            if self.deq_counts is not None:
                text += f", {int(self.deq_counts[i]):,d} after {self.scheme}"
            self.hovered.emit(text)

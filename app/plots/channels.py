"""Per-output-channel min / max / absmax ranges, sortable by range, outliers highlighted."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Signal

from ..analysis import outlier_channels
from ..format import fmt_float


MAX_POINTS = 2048


def envelope(x, lo, hi, ab, max_points: int = MAX_POINTS):
    """Peak-preserving reduction for drawing: per bucket of channels, the min of the minima
    and the max of the maxima (so no extreme channel disappears from the plot)."""
    n = x.size
    if n <= max_points:
        return x, lo, hi, ab
    step = -(-n // max_points)
    starts = np.arange(0, n, step)
    with np.errstate(invalid="ignore"):
        return (x[starts], np.fmin.reduceat(lo, starts), np.fmax.reduceat(hi, starts),
                np.fmax.reduceat(ab, starts))


class ChannelRangePlot(pg.PlotWidget):
    hovered = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("ChannelRangePlot")
        self.sort_by_range = False
        self.order = np.zeros(0, np.int64)
        self.ch_min = self.ch_max = self.ch_abs = np.zeros(0)
        self.outliers = np.zeros(0, bool)
        item = self.getPlotItem()
        item.setLabel("bottom", "output channel")
        item.setLabel("left", "value")
        # no "(x0.001)" SI prefix in the rotated label: in a short plot it was clipped
        item.getAxis("left").enableAutoSIPrefix(False)
        item.showGrid(x=True, y=True, alpha=0.15)
        item.setMenuEnabled(False)
        item.setClipToView(True)
        item.setDownsampling(auto=True, mode="peak")
        # the legend is the plot's title line: inside the plot it covered the outliers
        item.setTitle("<span style='color:#4c9aff'>━ min / max</span>&nbsp;&nbsp;"
                      "<span style='color:#9ece6a'>━ |max|</span>&nbsp;&nbsp;"
                      "<span style='color:#f85149'>● outliers</span>", size="8pt")
        self.max_curve = pg.PlotDataItem(pen=pg.mkPen("#4c9aff", width=1))
        self.min_curve = pg.PlotDataItem(pen=pg.mkPen("#4c9aff", width=1))
        self.fill = pg.FillBetweenItem(self.max_curve, self.min_curve,
                                       brush=pg.mkBrush(76, 154, 255, 70))
        self.abs_curve = pg.PlotDataItem(pen=pg.mkPen("#9ece6a", width=1))
        self.out_points = pg.ScatterPlotItem(size=6, brush=pg.mkBrush("#f85149"),
                                             pen=pg.mkPen(None))
        for it in (self.fill, self.max_curve, self.min_curve, self.abs_curve, self.out_points):
            self.addItem(it)
        self.scene().sigMouseMoved.connect(self._hover)

    def set_sorted(self, on: bool) -> None:
        self.sort_by_range = bool(on)
        self._draw()
        self.getPlotItem().enableAutoRange()

    def set_data(self, ch_min, ch_max, ch_absmax) -> None:
        self.ch_min = np.asarray(ch_min, np.float64)
        self.ch_max = np.asarray(ch_max, np.float64)
        self.ch_abs = np.asarray(ch_absmax, np.float64)
        self.outliers = outlier_channels(self.ch_abs)
        self._draw()
        self.getPlotItem().enableAutoRange()

    def _draw(self) -> None:
        n = self.ch_min.size
        if self.sort_by_range and n:
            rng = np.nan_to_num(self.ch_max - self.ch_min, nan=-1)
            self.order = np.argsort(-rng, kind="stable")
        else:
            self.order = np.arange(n)
        x = np.arange(n, dtype=np.float64)
        o = self.order
        xs, lo, hi, ab = envelope(x, self.ch_min[o], self.ch_max[o], self.ch_abs[o])
        self.max_curve.setData(xs, hi)
        self.min_curve.setData(xs, lo)
        self.abs_curve.setData(xs, ab)
        mask = self.outliers[o] if n else np.zeros(0, bool)
        self.out_points.setData(x[mask], self.ch_abs[o][mask])
        self.getPlotItem().setLabel(
            "bottom", "channels sorted by range" if self.sort_by_range else "output channel")

    def _hover(self, pos) -> None:
        n = self.ch_min.size
        if not n or not self.sceneBoundingRect().contains(pos):
            return
        x = int(round(self.getPlotItem().vb.mapSceneToView(pos).x()))
        if 0 <= x < n:
            c = int(self.order[x])
            flag = "  OUTLIER" if self.outliers[c] else ""
            self.hovered.emit(f"channel {c}: min {fmt_float(self.ch_min[c])}, "
                              f"max {fmt_float(self.ch_max[c])}, |max| {fmt_float(self.ch_abs[c])}{flag}")

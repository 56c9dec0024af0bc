"""Per-output-channel relative error under the assigned scheme."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Signal

from .. import perf as plots
from ..format import fmt_float
from .channels import MAX_POINTS, buckets_for


class ChannelErrorPlot(pg.PlotWidget):
    hovered = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("ChannelErrorPlot")
        self.err = np.zeros(0)
        self.order = np.zeros(0, np.int64)
        self.scheme = ""
        self._cache: dict = {}
        item = self.getPlotItem()
        item.setLabel("bottom", "output channel")
        item.setLabel("left", "rel. error")
        item.getAxis("left").enableAutoSIPrefix(False)
        from . import fix_axes, opaque
        opaque(self)
        fix_axes(item, short=True)
        from . import fast_grid
        fast_grid(item, 0.15)
        item.setMenuEnabled(False)
        if not plots.FAST:
            # the fast path draws data already reduced to the plot's pixel width: clipping
            # and downsampling it again re-ran on every range change for nothing
            item.setClipToView(True)
            item.setDownsampling(auto=True, mode="peak")
        self.curve = pg.PlotDataItem(pen=pg.mkPen("#ffb454", width=1), fillLevel=0,
                                     brush=pg.mkBrush(255, 180, 84, 50))
        self.mean_line = pg.InfiniteLine(angle=0, pen=pg.mkPen("#c9ced8", width=1,
                                                               style=pg.QtCore.Qt.PenStyle.DashLine))
        self.addItem(self.curve)
        self.addItem(self.mean_line)
        self.scene().sigMouseMoved.connect(self._hover)

    def _reduce(self, src, order, cap):
        """(x, shown, mean) to draw: the channels in order, decimated to `cap` buckets
        (peak-preserving); with the fast paths cached per result array, order and width."""
        key = (id(src), None if order is None else id(order), cap)
        hit = self._cache.get(key) if plots.FAST else None
        if hit is not None and hit[0] is src and hit[1] is order:
            return hit[2]
        n = self.err.size
        shown = np.nan_to_num(self.err[self.order], posinf=0.0) if n else self.err
        x = np.arange(n, dtype=np.float64)
        if n > cap:  # peak-preserving: the worst channel of each bucket
            starts = np.arange(0, n, -(-n // cap))
            x, shown = x[starts], np.maximum.reduceat(shown, starts)
        finite = self.err[np.isfinite(self.err)]
        out = (x, shown, float(finite.mean()) if finite.size else None)
        if plots.FAST:
            self._cache[key] = (src, order, out)
            while len(self._cache) > 16:
                self._cache.pop(next(iter(self._cache)))
        return out

    def set_data(self, channel_rel_err, order=None, scheme: str = "") -> None:
        self.err = np.asarray(channel_rel_err, np.float64) if channel_rel_err is not None \
            else np.zeros(0)
        self.scheme = scheme
        n = self.err.size
        if order is not None and len(order) != n:
            order = None
        self.order = np.asarray(order) if order is not None else np.arange(n)
        cap = buckets_for(n, self._pixels()) if plots.FAST else MAX_POINTS
        x, shown, mean = self._reduce(channel_rel_err, order, cap)
        self.curve.setData(x, shown)
        self.mean_line.setVisible(mean is not None)
        if mean is not None:
            self.mean_line.setValue(mean)
        if plots.FAST:
            # a constant title (the scheme is in the summary line above the plots): a title
            # of changing text re-lays out the plot (pyqtgraph's LabelItem), painting it twice,
            # and a long scheme name in the axis label was cut at the plot's edge
            if getattr(self, "_title", None) is None:
                self.getPlotItem().setTitle("per-channel relative error", color="#8a92a3",
                                            size="9pt")
                self.getPlotItem().titleLabel.setMinimumWidth(0)   # never widens the window
                self._title = True
        else:
            self.getPlotItem().setTitle(
                f"per-channel error under {scheme}" if scheme and n else "", color="#8a92a3",
                size="9pt")
        if not plots.FAST:
            self.getPlotItem().enableAutoRange()
            return
        vb = self.getPlotItem().vb
        if n:
            top = float(np.max(shown)) if shown.size else 1.0
            vb.setRange(xRange=(0, max(n - 1, 1)), yRange=(0.0, top if top > 0 else 1.0),
                        padding=0.02)
            self.getPlotItem().vb.updateMatrix()  # transform final before the paint
        else:
            vb.setRange(xRange=(0, 1), yRange=(0, 1), padding=0)
            self.getPlotItem().vb.updateMatrix()  # transform final before the paint

    def _pixels(self) -> int:
        w = int(self.getPlotItem().vb.width())
        return w if w > 10 else max(self.width() - 60, 200)

    def _hover(self, pos) -> None:
        n = self.err.size
        if not n or not self.sceneBoundingRect().contains(pos):
            return
        x = int(round(self.getPlotItem().vb.mapSceneToView(pos).x()))
        if 0 <= x < n:
            c = int(self.order[x])
            self.hovered.emit(f"channel {c}: relative error {fmt_float(self.err[c])} ({self.scheme})")

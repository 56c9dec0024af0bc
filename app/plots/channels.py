"""Per-output-channel min / max / absmax ranges, sortable by range, outliers highlighted."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Signal
from PySide6.QtGui import QPainterPath
from PySide6.QtWidgets import QGraphicsPathItem

from .. import perf as plots
from ..analysis import outlier_channels
from ..format import fmt_float


MAX_POINTS = 2048
CACHE_SIZE = 16


def buckets_for(n: int, pixels: int) -> int:
    """How many envelope buckets to draw: two per pixel column (so every pixel column shows
    its extremes), never more than the channels."""
    return int(min(n, max(64, 2 * max(int(pixels), 1))))


def envelope_to(x, lo, hi, ab, buckets: int):
    """`envelope` with a bucket count (not a point cap)."""
    return envelope(x, lo, hi, ab, max_points=max(int(buckets), 1))


def envelope_path(x, lo, hi) -> QPainterPath:
    """The min..max band as one closed polygon: along the maxima, back along the minima."""
    xs = np.concatenate([x, x[::-1]])
    ys = np.concatenate([hi, lo[::-1]])
    ok = np.isfinite(ys)
    xs, ys = xs[ok], ys[ok]
    if not xs.size:
        return QPainterPath()
    path = pg.arrayToQPath(xs, ys, connect="all")
    path.closeSubpath()
    return path


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
        # the legend is the plot's title line: inside the plot it covered the outliers
        item.setTitle("<span style='color:#4c9aff'>━ min / max</span>&nbsp;&nbsp;"
                      "<span style='color:#9ece6a'>━ |max|</span>&nbsp;&nbsp;"
                      "<span style='color:#f85149'>● outliers</span>", size="8pt")
        item.titleLabel.setMinimumWidth(0)
        self.max_curve = pg.PlotDataItem(pen=pg.mkPen("#4c9aff", width=1))
        self.min_curve = pg.PlotDataItem(pen=pg.mkPen("#4c9aff", width=1))
        self.fill = pg.FillBetweenItem(self.max_curve, self.min_curve,
                                       brush=pg.mkBrush(76, 154, 255, 70))
        self.abs_curve = pg.PlotDataItem(pen=pg.mkPen("#9ece6a", width=1))
        self.out_points = pg.ScatterPlotItem(size=6, brush=pg.mkBrush("#f85149"),
                                             pen=pg.mkPen(None))
        for it in (self.fill, self.max_curve, self.min_curve, self.abs_curve, self.out_points):
            self.addItem(it)
        # fast path: the envelope as one filled, outlined path (app.plots.FAST)
        self.band = QGraphicsPathItem()
        self.band.setBrush(pg.mkBrush(76, 154, 255, 70))
        pen = pg.mkPen("#4c9aff", width=1)
        pen.setCosmetic(True)
        self.band.setPen(pen)
        self.band.setVisible(False)
        self.band.setZValue(-10)      # under the |max| curve and the outliers
        self.addItem(self.band)
        self._prepared: OrderedDict = OrderedDict()   # per tensor: order, outliers, arrays
        self._drawn_buckets = 0
        self.scene().sigMouseMoved.connect(self._hover)

    def set_sorted(self, on: bool) -> None:
        self.sort_by_range = bool(on)
        if plots.FAST and getattr(self, "_prep", None) is not None:
            self._draw_fast(set_range=True)
            return
        self._draw()
        self.getPlotItem().enableAutoRange()

    def set_data(self, ch_min, ch_max, ch_absmax) -> None:
        if plots.FAST:
            self._set_data_fast(ch_min, ch_max, ch_absmax)
            return
        self.band.setVisible(False)
        for it in (self.fill, self.max_curve, self.min_curve):
            it.setVisible(True)
        self.ch_min = np.asarray(ch_min, np.float64)
        self.ch_max = np.asarray(ch_max, np.float64)
        self.ch_abs = np.asarray(ch_absmax, np.float64)
        self.outliers = outlier_channels(self.ch_abs)
        self._draw()
        self.getPlotItem().enableAutoRange()

    # ---- fast path ------------------------------------------------------------------------
    def _prepare(self, ch_min, ch_max, ch_absmax) -> dict:
        """Per tensor (the statistics' own arrays, by identity): float64 copies, the outlier
        mask and, per sort mode, the order and the full-resolution sorted arrays."""
        key = (id(ch_min), id(ch_max), id(ch_absmax))
        hit = self._prepared.get(key)
        if hit is not None and hit["src"][0] is ch_min and hit["src"][1] is ch_max \
                and hit["src"][2] is ch_absmax:
            self._prepared.move_to_end(key)
            return hit
        lo = np.asarray(ch_min, np.float64)
        hi = np.asarray(ch_max, np.float64)
        ab = np.asarray(ch_absmax, np.float64)
        prep = {"src": (ch_min, ch_max, ch_absmax), "lo": lo, "hi": hi, "ab": ab,
                "outliers": outlier_channels(ab), "views": {}}
        self._prepared[key] = prep
        while len(self._prepared) > CACHE_SIZE:
            self._prepared.popitem(last=False)
        return prep

    def _view(self, prep: dict, sort: bool) -> dict:
        v = prep["views"].get(sort)
        if v is None:
            lo, hi, ab = prep["lo"], prep["hi"], prep["ab"]
            n = lo.size
            if sort and n:
                rng = np.nan_to_num(hi - lo, nan=-1)
                order = np.argsort(-rng, kind="stable")
            else:
                order = np.arange(n)
            slo, shi, sab = (lo[order], hi[order], ab[order]) if sort else (lo, hi, ab)
            mask = prep["outliers"][order] if n else np.zeros(0, bool)
            x = np.arange(n, dtype=np.float64)
            v = {"order": order, "x": x, "lo": slo, "hi": shi, "ab": sab,
                 "ox": x[mask], "oy": sab[mask], "env": {}}
            prep["views"][sort] = v
        return v

    def _pixels(self) -> int:
        w = int(self.getPlotItem().vb.width())
        return w if w > 10 else max(self.width() - 60, 200)

    def _set_data_fast(self, ch_min, ch_max, ch_absmax) -> None:
        self._prep = self._prepare(ch_min, ch_max, ch_absmax)
        self.ch_min, self.ch_max, self.ch_abs = self._prep["lo"], self._prep["hi"], self._prep["ab"]
        self.outliers = self._prep["outliers"]
        self._draw_fast(set_range=True)

    def _draw_fast(self, set_range: bool) -> None:
        for it in (self.fill, self.max_curve, self.min_curve):
            it.setVisible(False)
        self.band.setVisible(True)
        n = self.ch_min.size
        v = self._view(self._prep, self.sort_by_range)
        self.order = v["order"]
        buckets = buckets_for(n, self._pixels()) if n else 0
        env = v["env"].get(buckets)
        if env is None:
            env = envelope_to(v["x"], v["lo"], v["hi"], v["ab"], buckets) if n else \
                (np.zeros(0),) * 4
            env = env + (envelope_path(env[0], env[1], env[2]),)
            v["env"][buckets] = env
        xs, lo, hi, ab, path = env
        self._drawn_buckets = buckets
        self.band.setPath(path)
        self.abs_curve.setData(xs, ab)
        self.out_points.setData(v["ox"], v["oy"])
        label = "channels sorted by range" if self.sort_by_range else "output channel"
        if label != getattr(self, "_bottom", None):
            self.getPlotItem().setLabel("bottom", label)
            self._bottom = label
        if set_range and n:
            with np.errstate(invalid="ignore"):
                y0 = float(np.nanmin(lo)) if np.isfinite(lo).any() else 0.0
                y1 = float(np.nanmax(np.fmax(hi, ab))) if np.isfinite(hi).any() else 1.0
            if not (y1 > y0):
                y0, y1 = y0 - 1.0, y0 + 1.0
            self.getPlotItem().vb.setRange(xRange=(0, max(n - 1, 1)), yRange=(y0, y1),
                                           padding=0.02)
            self.getPlotItem().vb.updateMatrix()  # transform final before the paint
        elif set_range:
            self.getPlotItem().vb.setRange(xRange=(0, 1), yRange=(0, 1), padding=0)
            self.getPlotItem().vb.updateMatrix()  # transform final before the paint

    def resizeEvent(self, ev) -> None:
        super().resizeEvent(ev)
        if plots.FAST and getattr(self, "_prep", None) is not None and self.ch_min.size and \
                buckets_for(self.ch_min.size, self._pixels()) != self._drawn_buckets:
            self._draw_fast(set_range=False)

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

"""The spread across a layer's experts: per-expert |max| and std (left axis) and excess kurtosis
(right axis) in one plot, from a workbench.running.moe.ExpertSpread."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Signal

from ..format import fmt_float

ABSMAX, STD, KURT = "#9ece6a", "#4c9aff", "#ff9e64"


class ExpertSpreadPlot(pg.PlotWidget):
    hovered = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("ExpertSpreadPlot")
        self.spread = None
        item = self.getPlotItem()
        item.setLabel("bottom", "expert")
        item.setLabel("left", "|max|, std")
        item.getAxis("left").enableAutoSIPrefix(False)
        from . import fix_axes, opaque
        opaque(self)
        fix_axes(item, short=True)
        item.setMenuEnabled(False)
        item.showGrid(x=False, y=True, alpha=0.15)
        item.setTitle(f"<span style='color:{ABSMAX}'>● |max|</span>&nbsp;&nbsp;"
                      f"<span style='color:{STD}'>■ std</span>&nbsp;&nbsp;"
                      f"<span style='color:{KURT}'>▲ kurtosis (right axis)</span>", size="8pt")
        item.titleLabel.setMinimumWidth(0)
        # kurtosis has its own scale: a second view box on the right axis, x linked
        self.right = pg.ViewBox()
        item.showAxis("right")
        item.scene().addItem(self.right)
        item.getAxis("right").linkToView(self.right)
        item.getAxis("right").setLabel("kurtosis")
        item.getAxis("right").enableAutoSIPrefix(False)
        self.right.setXLink(item)
        item.vb.sigResized.connect(self._sync)
        self.absmax = pg.PlotDataItem(pen=pg.mkPen(ABSMAX, width=1.5), symbol="o", symbolSize=7,
                                      symbolBrush=ABSMAX, symbolPen=None)
        self.std = pg.PlotDataItem(pen=pg.mkPen(STD, width=1.5), symbol="s", symbolSize=7,
                                   symbolBrush=STD, symbolPen=None)
        self.kurt = pg.PlotDataItem(pen=pg.mkPen(KURT, width=1.5), symbol="t", symbolSize=8,
                                    symbolBrush=KURT, symbolPen=None)
        self.addItem(self.absmax)
        self.addItem(self.std)
        self.right.addItem(self.kurt)
        self.scene().sigMouseMoved.connect(self._hover)

    def _sync(self) -> None:
        vb = self.getPlotItem().vb
        self.right.setGeometry(vb.sceneBoundingRect())
        self.right.linkedViewChanged(vb, self.right.XAxis)

    def set_spread(self, spread) -> None:
        """Draw an ExpertSpread (None: clear)."""
        self.spread = spread
        if spread is None or not len(spread.experts):
            for c in (self.absmax, self.std, self.kurt):
                c.setData([], [])
            return
        x = np.asarray(spread.experts, dtype=np.float64)
        self.absmax.setData(x, spread.absmax)
        self.std.setData(x, spread.std)
        self.kurt.setData(x, spread.kurtosis)
        item = self.getPlotItem()
        top = float(np.nanmax(spread.absmax)) if spread.absmax.size else 1.0
        item.setYRange(0.0, top * 1.08 if top > 0 else 1.0, padding=0)
        item.setXRange(float(x.min()) - 0.5, float(x.max()) + 0.5, padding=0)
        step = max(1, int(np.ceil(len(x) / 16)))          # integer expert ticks
        item.getAxis("bottom").setTicks([[(float(v), str(int(v))) for v in x[::step]], []])
        k = spread.kurtosis
        lo, hi = float(np.nanmin(k)), float(np.nanmax(k))
        pad = max(0.1 * (hi - lo), 0.1)
        self.right.setYRange(lo - pad, hi + pad, padding=0)
        self._sync()

    def _hover(self, pos) -> None:
        s = self.spread
        if s is None or not len(s.experts):
            return
        vb = self.getPlotItem().vb
        if not vb.sceneBoundingRect().contains(pos):
            return
        x = vb.mapSceneToView(pos).x()
        i = int(np.argmin(np.abs(np.asarray(s.experts) - x)))
        self.hovered.emit(f"expert {s.experts[i]}: |max| {fmt_float(s.absmax[i])}, std "
                          f"{fmt_float(s.std[i])}, kurtosis {s.kurtosis[i]:.2f}")

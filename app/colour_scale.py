"""A colour scale: the viridis lookup the map cells and the sensitivity heat map use, and the
legend widget that shows it with its numbers (issue 23)."""

from __future__ import annotations

import math

import numpy as np
from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QLinearGradient, QPainter
from PySide6.QtWidgets import QSizePolicy, QWidget

from .format import fmt_float
from .theme import FOREGROUND, MUTED, ui_font

_LUT = None
UNKNOWN = QColor("#3a3f4b")     # no value yet


def lut() -> np.ndarray:
    """(256, 3) uint8 viridis."""
    global _LUT
    if _LUT is None:
        import pyqtgraph as pg
        _LUT = np.asarray(pg.colormap.get("viridis").getLookupTable(nPts=256, alpha=False),
                          np.uint8)[:, :3]
    return _LUT


def rgb(t: np.ndarray, reverse: bool = False) -> np.ndarray:
    """[0, 1] → (n, 4) uint8 RGBA (NaN → the 'unknown' grey)."""
    t = np.asarray(t, np.float64)
    out = np.empty((t.size, 4), np.uint8)
    ok = np.isfinite(t)
    x = np.where(ok, t, 0.0)
    if reverse:
        x = 1.0 - x
    idx = np.clip((x * 255).round().astype(np.int64), 0, 255)
    out[:, :3] = lut()[idx]
    out[:, 3] = 255
    out[~ok] = (UNKNOWN.red(), UNKNOWN.green(), UNKNOWN.blue(), 255)
    return out


def tick_values(lo: float, hi: float, n: int = 5) -> list[float]:
    return [lo + (hi - lo) * k / (n - 1) for k in range(n)]


def tick_text(v: float, log: bool) -> str:
    if log:
        return fmt_float(10 ** v)
    return fmt_float(v) if abs(v) < 1e4 else f"{v:.3g}"


class ColourLegend(QWidget):
    """A horizontal bar from lo to hi with its ticks and title; `reverse`: better values at the
    low (yellow) end, so "good" reads the same on every overlay."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("ColourLegend")
        self.title = ""
        self.lo, self.hi, self.log, self.reverse = 0.0, 1.0, False, False
        self.note = ""
        self.setMinimumHeight(46)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def set_scale(self, title: str, lo: float, hi: float, log: bool, reverse: bool = False,
                  note: str = "") -> None:
        self.title, self.lo, self.hi, self.log, self.reverse = title, lo, hi, log, reverse
        self.note = note
        self.update()

    def ticks(self) -> list[str]:
        return [tick_text(v, self.log) for v in tick_values(self.lo, self.hi)]

    def paint_into(self, p: QPainter, rect: QRectF) -> None:
        """Draw into `rect` (also used by the PNG / SVG export)."""
        p.setFont(ui_font(8.5))
        fm = p.fontMetrics()
        p.setPen(QColor(FOREGROUND))
        scale = " (log scale)" if self.log else ""
        p.drawText(QRectF(rect.left(), rect.top(), rect.width(), fm.height()),
                   Qt.AlignmentFlag.AlignLeft, f"{self.title}{scale}")
        if self.note:
            p.setPen(QColor(MUTED))
            p.drawText(QRectF(rect.left(), rect.top(), rect.width(), fm.height()),
                       Qt.AlignmentFlag.AlignRight, self.note)
        bar = QRectF(rect.left() + 4, rect.top() + fm.height() + 2, rect.width() - 8, 10)
        grad = QLinearGradient(bar.left(), 0, bar.right(), 0)
        cols = rgb(np.linspace(0, 1, 16), self.reverse)
        for k, c in enumerate(cols):
            grad.setColorAt(k / 15, QColor(int(c[0]), int(c[1]), int(c[2])))
        p.fillRect(bar, grad)
        p.setPen(QColor(MUTED))
        for k, text in enumerate(self.ticks()):
            x = bar.left() + bar.width() * k / 4
            w = fm.horizontalAdvance(text)
            x0 = min(max(bar.left() - 4, x - w / 2), bar.right() + 4 - w)
            p.drawLine(int(x), int(bar.bottom()), int(x), int(bar.bottom() + 3))
            p.drawText(QRectF(x0, bar.bottom() + 3, w + 2, fm.height()), 0, text)

    def paintEvent(self, _event) -> None:
        p = QPainter(self)
        self.paint_into(p, QRectF(self.rect()))
        p.end()


def finite(v) -> bool:
    return v is not None and math.isfinite(v)

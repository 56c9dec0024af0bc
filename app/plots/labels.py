"""Point labels that do not overlap: each label takes the first of four places around its point
(right-above, left-above, right-below, left-below) that stays inside the plot and clears the
labels placed before it and every marked point; a label with no free place is hidden (its
value stays in the point's hover text). Labels are placed in priority order and re-placed when
the plot is resized; their TextItems are reused, not re-created."""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import QRectF

POINT_PX = 5.0      # half the size of the area kept free around each marked point


class LabelPlacer:
    def __init__(self, plot_item):
        self.item = plot_item
        self.vb = plot_item.getViewBox()
        self.texts: list = []
        self.cands: list = []
        self.points: list = []
        self.vb.sigResized.connect(lambda *_: self.place())

    def set(self, candidates, points=()) -> None:
        """candidates: (x, y, text, colour) in view coordinates (y already log10 on a log
        axis), highest priority first; points: (x, y) of every marker to keep clear."""
        self.cands = list(candidates)
        self.points = list(points)
        while len(self.texts) < len(self.cands):
            t = pg.TextItem("", color="#8a92a3")
            self.vb.addItem(t, ignoreBounds=True)
            self.texts.append(t)
        self.place()

    def _to_px(self, x, y, rng, w, h):
        (x0, x1), (y0, y1) = rng
        return ((x - x0) / ((x1 - x0) or 1.0) * w, (y1 - y) / ((y1 - y0) or 1.0) * h)

    def place(self) -> None:
        w, h = self.vb.width(), self.vb.height()
        if w < 20 or h < 20:    # not laid out yet: the first resize places them
            w, h = 400.0, 300.0
        rng = self.vb.viewRange()
        (x0, x1), (y0, y1) = rng
        taken = []
        for x, y in self.points:
            px, py = self._to_px(x, y, rng, w, h)
            taken.append(QRectF(px - POINT_PX, py - POINT_PX, 2 * POINT_PX, 2 * POINT_PX))
        bounds = QRectF(0, 0, w, h)
        for k, t in enumerate(self.texts):
            if k >= len(self.cands):
                t.setVisible(False)
                continue
            x, y, text, colour = self.cands[k]
            if t.toPlainText() != text:
                t.setText(text, color=colour)
            size = t.textItem.boundingRect()
            tw, th = size.width(), size.height()
            px, py = self._to_px(x, y, rng, w, h)
            placed = False
            # right-above, left-above, right-below, left-below of the point's free box
            for left, top in ((px + POINT_PX, py - POINT_PX - th + 4),
                              (px - POINT_PX - tw, py - POINT_PX - th + 4),
                              (px + POINT_PX, py + POINT_PX - 4),
                              (px - POINT_PX - tw, py + POINT_PX - 4)):
                r = QRectF(left, top, tw, th)
                inner = r.adjusted(3, 4, -3, -4)    # the text itself (TextItem pads it)
                if bounds.contains(inner) and not any(inner.intersects(o) for o in taken):
                    t.setAnchor((0, 0))
                    t.setPos(x0 + left / w * (x1 - x0), y1 - top / h * (y1 - y0))
                    t.setVisible(True)
                    taken.append(inner)
                    placed = True
                    break
            if not placed:
                t.setVisible(False)

    def shown(self) -> list[str]:
        return [t.toPlainText() for t in self.texts[:len(self.cands)] if t.isVisible()]

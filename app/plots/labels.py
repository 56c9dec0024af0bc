"""Point labels that do not overlap: each label takes the first of four places around its point
(right-above, left-above, right-below, left-below) that stays inside the plot and clears the
labels placed before it and every marked point; a label with no free place is hidden (its
value stays in the point's hover text). Labels are placed in priority order and re-placed when
the plot is resized; their TextItems are reused, not re-created.

A candidate may say how large its own marker is (the box kept free around its point) and that
it must be shown (the current scheme's name): such a label also tries places above, below and
beside its point and then farther out, one text height at a time; with no free place at all it
takes the one that covers the fewest markers. A marked point may give its own half size."""

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
        self.leaders: list = []     # lines to the points of labels placed away from them
        self.vb.sigResized.connect(lambda *_: self.place())

    def set(self, candidates, points=()) -> None:
        """candidates: (x, y, text, colour[, own_px[, always]]) in view coordinates (y already
        log10 on a log axis), highest priority first — own_px: half the size of the label's
        own marker, always: never hidden; points: (x, y[, half_px]) of every marker to keep
        clear."""
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
        for pt in self.points:
            x, y = pt[0], pt[1]
            half = pt[2] if len(pt) > 2 else POINT_PX
            px, py = self._to_px(x, y, rng, w, h)
            taken.append(QRectF(px - half, py - half, 2 * half, 2 * half))
        bounds = QRectF(0, 0, w, h)
        for line in self.leaders:
            line.setVisible(False)
        for k, t in enumerate(self.texts):
            if k >= len(self.cands):
                t.setVisible(False)
                continue
            x, y, text, colour = self.cands[k][:4]
            own = self.cands[k][4] if len(self.cands[k]) > 4 else POINT_PX
            always = bool(self.cands[k][5]) if len(self.cands[k]) > 5 else False
            if t.toPlainText() != text:
                t.setText(text, color=colour)
            size = t.textItem.boundingRect()
            tw, th = size.width(), size.height()
            px, py = self._to_px(x, y, rng, w, h)
            if always:      # the nearest free place, searched on a grid around the point
                spot = self._nearest_free(px, py, tw, th, own, taken, bounds)
                if spot is not None:
                    left, top = spot
                    t.setAnchor((0, 0))
                    t.setPos(x0 + left / w * (x1 - x0), y1 - top / h * (y1 - y0))
                    t.setVisible(True)
                    inner = QRectF(left, top, tw, th).adjusted(3, 4, -3, -4)
                    taken.append(inner)
                    self._lead(k, px, py, own, inner, rng, w, h)
                    continue
            best = None
            for left, top in self._places(px, py, tw, th, own, always):
                inner = QRectF(left, top, tw, th).adjusted(3, 4, -3, -4)  # the text (padded)
                if not bounds.contains(inner):
                    continue
                hits = sum(inner.intersects(o) for o in taken)
                if best is None or hits < best[0]:
                    best = (hits, left, top, inner)
                if hits == 0:
                    break
            if best is not None and (best[0] == 0 or always):
                _hits, left, top, inner = best
                t.setAnchor((0, 0))
                t.setPos(x0 + left / w * (x1 - x0), y1 - top / h * (y1 - y0))
                t.setVisible(True)
                taken.append(inner)
            else:
                t.setVisible(False)

    def _lead(self, k, px, py, own, rect, rng, w, h) -> None:
        """A thin line from a label placed away from its point to that point's marker."""
        import math
        import pyqtgraph as pg
        while len(self.leaders) <= k:
            line = pg.PlotCurveItem(pen=pg.mkPen(200, 205, 215, 150, width=1))
            self.vb.addItem(line, ignoreBounds=True)
            self.leaders.append(line)
        line = self.leaders[k]
        qx = min(max(px, rect.left()), rect.right())
        qy = min(max(py, rect.top()), rect.bottom())
        d = math.hypot(qx - px, qy - py)
        if d <= own + 6:
            line.setVisible(False)
            return
        sx, sy = px + (qx - px) * own / d, py + (qy - py) * own / d    # from the ring's edge
        (x0, x1), (y0, y1) = rng
        line.setData([x0 + sx / w * (x1 - x0), x0 + qx / w * (x1 - x0)],
                     [y1 - sy / h * (y1 - y0), y1 - qy / h * (y1 - y0)])
        line.setVisible(True)

    @staticmethod
    def _nearest_free(px, py, tw, th, own, taken, bounds):
        """Top-left corner of the free place nearest the point for a label of tw x th (its
        text clear of every box in `taken`, its own marker's box of half size `own`, and
        inside `bounds`), searched on a 4-pixel grid up to 160 pixels away; None if none."""
        import numpy as np
        g = np.arange(-160.0, 161.0, 4.0)
        lx, ty = np.meshgrid(px + g - tw / 2, py + g - th / 2)
        lx, ty = lx.ravel(), ty.ravel()
        # the text's own rectangle (TextItem pads it: 3 px at the sides, 4 above and below)
        a0, b0, a1, b1 = lx + 3, ty + 4, lx + tw - 3, ty + th - 4
        ok = (a0 >= bounds.left()) & (b0 >= bounds.top()) & (a1 <= bounds.right()) & \
            (b1 <= bounds.bottom())
        boxes = [(r.left(), r.top(), r.right(), r.bottom()) for r in taken]
        boxes.append((px - own, py - own, px + own, py + own))
        for c0, d0, c1, d1 in boxes:
            ok &= ~((a0 < c1) & (a1 > c0) & (b0 < d1) & (b1 > d0))
        if not ok.any():
            return None
        # distance from the point to the nearest edge of the text's rectangle
        dx = np.maximum(np.maximum(a0 - px, px - a1), 0.0)
        dy = np.maximum(np.maximum(b0 - py, py - b1), 0.0)
        d = np.where(ok, np.hypot(dx, dy), np.inf)
        k = int(np.argmin(d))
        return float(lx[k]), float(ty[k])

    @staticmethod
    def _places(px, py, tw, th, own, always):
        """Top-left corners to try, in order (pixels): the four corners of the point's free
        box; for a label that must show, then above, below, beside, and farther out."""
        up, down = py - own - th + 4, py + own - 4
        right, left = px + own, px - own - tw
        yield right, up
        yield left, up
        yield right, down
        yield left, down
        if not always:
            return
        yield px - tw / 2, up
        yield px - tw / 2, down
        yield right, py - th / 2
        yield left, py - th / 2
        for k in range(1, 5):
            step = k * (th - 6)
            yield right, up - step
            yield left, up - step
            yield right, down + step
            yield left, down + step
            yield px - tw / 2, up - step
            yield px - tw / 2, down + step

    def shown(self) -> list[str]:
        return [t.toPlainText() for t in self.texts[:len(self.cands)] if t.isVisible()]

"""pyqtgraph plots of one tensor: histogram with the quantization grid, channel ranges, channel error
(the fast drawing paths are described in app.perf)."""


def fix_axes(item, left_text: str = "", short: bool = False) -> None:
    """Fast path (app.perf): the left axis only ever grows to fit its tick labels (never
    shrinks back for a tensor with shorter labels) and the bottom axis has a fixed height.
    pyqtgraph otherwise resizes an axis to each tensor's labels, which re-lays out the plot
    and paints it a second time on every selection."""
    from .. import perf
    if not perf.FAST:
        return
    from PySide6.QtGui import QFontMetrics
    from PySide6.QtWidgets import QApplication
    fm = QFontMetrics(QApplication.font())
    axis = item.getAxis("left")
    axis.setStyle(autoReduceTextSpace=False)
    bottom = item.getAxis("bottom")
    bottom.setHeight(2 * fm.lineSpacing() + 6)
    # ticks of the major and minor levels only: the third level's were all but invisible
    for ax in (axis, bottom):
        ax.setStyle(maxTickLevel=1)
    if short:   # a short plot: labels at the major ticks only (minor ones overlapped)
        axis.setStyle(maxTextLevel=0)
    for ax in (axis, bottom):
        keep_label(ax)


def keep_label(axis) -> None:
    """Fast path (app.perf): the axis re-sets its label's HTML only when the text changes.
    pyqtgraph re-set it (QGraphicsTextItem.setHtml: a text layout, 0.4-0.8 ms) on every range
    change, for the SI-prefix check: six times per selection for an unchanged "count"."""
    import types
    orig = type(axis)._updateLabel

    def _update_label(self):
        from .. import perf
        text = self.labelString()
        if perf.FAST and getattr(self, "_shown_label", None) == text:
            self.picture = None
            self.update()
            return
        self._shown_label = text
        orig(self)
    axis._updateLabel = types.MethodType(_update_label, axis)


def opaque(view) -> None:
    """Fast path (app.perf): the plot's viewport paints every one of its pixels (the scene's
    background brush), so Qt need not paint the styled ancestors (splitters, panels) under it
    first each time the plot is repainted."""
    from .. import perf
    if perf.FAST:
        from PySide6.QtCore import Qt
        view.viewport().setAttribute(Qt.WidgetAttribute.WA_OpaquePaintEvent, True)


def fast_grid(item, alpha: float = 0.15) -> None:
    """Fast path (app.perf): the plot's grid as two path items in the view (major and minor
    lines at the axes' own tick values, pyqtgraph's alphas), instead of the axes drawing
    grid lines across the whole plot (which made each axis' picture as large as the plot
    and was a third of a plot's paint)."""
    from .. import perf
    if not perf.FAST:
        item.showGrid(x=True, y=True, alpha=alpha)
        return
    item.showGrid(x=False, y=False)
    grid = _Grid(item, alpha)
    item._fast_grid = grid


class _Grid:
    COLOUR = (201, 206, 216)

    def __init__(self, item, alpha: float):
        from PySide6.QtWidgets import QGraphicsPathItem
        import pyqtgraph as pg
        self.item = item
        self.alpha = alpha
        self.paths = []
        vb = item.getViewBox()
        for level in range(2):
            p = QGraphicsPathItem()
            p.setZValue(-1000)
            pen = pg.mkPen(self.COLOUR, width=1)
            pen.setCosmetic(True)
            p.setPen(pen)
            vb.addItem(p, ignoreBounds=True)
            self.paths.append(p)
        vb.sigRangeChanged.connect(lambda *_: self.update())
        vb.sigResized.connect(lambda *_: self.update())

    def update(self) -> None:
        import numpy as np
        import pyqtgraph as pg
        from PySide6.QtGui import QColor, QPainterPath
        vb = self.item.getViewBox()
        (x0, x1), (y0, y1) = vb.viewRange()
        w, h = max(vb.width(), 1.0), max(vb.height(), 1.0)
        xs = self.item.getAxis("bottom").tickValues(x0, x1, w)
        ys = self.item.getAxis("left").tickValues(y0, y1, h)
        for level, path_item in enumerate(self.paths):
            segs = []
            for ticks, lo, hi, length, vertical in ((xs, y0, y1, w, True), (ys, x0, x1, h, False)):
                if level < len(ticks):
                    vals = np.asarray(ticks[level][1], np.float64)
                    if vals.size:
                        segs.append((vals, lo, hi, vertical, len(vals), length))
            path = QPainterPath()
            alpha_px = 0
            for vals, lo, hi, vertical, n, length in segs:
                a = np.repeat(vals, 2)
                b = np.tile([lo, hi], vals.size)
                x, y = (a, b) if vertical else (b, a)
                path.addPath(pg.arrayToQPath(x, y, connect="pairs"))
                # pyqtgraph's grid alpha: 255/(level+1) * alpha * clip(0.05 * px / (n+1), 0, 1)
                alpha_px = max(alpha_px, 255.0 / (level + 1) * self.alpha
                               * min(max(0.05 * length / (n + 1), 0.0), 1.0))
            pen = path_item.pen()
            c = QColor(*self.COLOUR)
            c.setAlpha(int(alpha_px))
            pen.setColor(c)
            path_item.setPen(pen)
            path_item.setPath(path)

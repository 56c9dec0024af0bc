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
        cache_pictures(ax)
    for hidden in ("top", "right"):   # linked to the view too: their label was re-set as well
        keep_label(item.getAxis(hidden))


PICTURES = 8     # axis pictures kept per axis (by range and geometry)


def _rect(r) -> tuple:
    return (r.x(), r.y(), r.width(), r.height())


def _picture_key(axis) -> tuple:
    """Everything an axis' picture is drawn from (pyqtgraph's generateDrawSpecs): its range
    and scale, its own and the view's geometry, log mode, tick settings and style."""
    bounds = axis.mapRectFromParent(axis.geometry())
    view = axis.linkedView()
    ticks = view.mapRectToItem(axis, view.boundingRect()) if view is not None \
        and axis.grid is not False else bounds
    return (tuple(axis.range), _rect(bounds), _rect(ticks), axis.logMode, axis.scale,
            axis.autoSIPrefixScale, repr(axis._tickLevels), repr(axis._tickSpacing),
            getattr(axis, "_tickDensity", None), repr(sorted(axis.style.items())),
            axis.pen().color().rgba(), axis.textPen().color().rgba(),
            axis.tickPen().color().rgba())


def cache_pictures(axis) -> None:
    """Fast path (app.perf): the axis keeps its last few pictures (tick marks and labels),
    keyed by everything they are drawn from, and replays one instead of generating the
    ticks again (tick values, label strings, text metrics: a millisecond or more per axis)
    when a range comes back — selecting a tensor seen a moment ago, toggling log counts.
    The picture is the one pyqtgraph drew for that key."""
    import types
    from collections import OrderedDict
    orig = type(axis).paint
    cache: OrderedDict = OrderedDict()

    def paint(self, p, opt, widget):
        from .. import perf
        if not perf.FAST:
            return orig(self, p, opt, widget)
        if self.picture is None:
            key = _picture_key(self)
            hit = cache.get(key)
            if hit is None:
                orig(self, p, opt, widget)          # draws self.picture and plays it
                cache[key] = self.picture
                while len(cache) > PICTURES:
                    cache.popitem(last=False)
                return
            cache.move_to_end(key)
            self.picture = hit
        self.picture.play(p)
    axis.paint = types.MethodType(paint, axis)
    axis._picture_cache = cache


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
        self._cache: dict = {}
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
        vb = self.item.getViewBox()
        (x0, x1), (y0, y1) = vb.viewRange()
        w, h = max(vb.width(), 1.0), max(vb.height(), 1.0)
        bottom, left = self.item.getAxis("bottom"), self.item.getAxis("left")
        # the same range and size as a moment ago (a tensor selected again): its paths again
        key = (x0, x1, y0, y1, w, h, bottom.logMode, left.logMode, repr(bottom._tickLevels),
               repr(left._tickLevels))
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._paths(x0, x1, y0, y1, w, h, bottom, left)
            while len(self._cache) > 8:
                self._cache.pop(next(iter(self._cache)))
        for path_item, (path, colour) in zip(self.paths, hit):
            pen = path_item.pen()
            pen.setColor(colour)
            path_item.setPen(pen)
            path_item.setPath(path)

    def _paths(self, x0, x1, y0, y1, w, h, bottom, left) -> list:
        import numpy as np
        import pyqtgraph as pg
        from PySide6.QtGui import QColor, QPainterPath
        xs = bottom.tickValues(x0, x1, w)
        ys = left.tickValues(y0, y1, h)
        out = []
        for level in range(len(self.paths)):
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
            c = QColor(*self.COLOUR)
            c.setAlpha(int(alpha_px))
            out.append((path, c))
        return out

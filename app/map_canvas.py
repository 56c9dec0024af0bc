"""The model map's drawing surface: blocks as rows, sections as groups of cells, every tensor a
cell coloured by the overlay (issue 23). Geometry comes from `workbench.planning.model_map.layout`;
cell rectangles live in numpy arrays so a paint only visits the cells in the exposed area
(a 100,000-tensor catalog paints its viewport in milliseconds). Click a cell: it becomes the
current tensor everywhere; drag: a rubber band selects every cell it touches; click a block's
title: the whole block; Ctrl adds to the selection."""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import QPoint, QRect, QRectF, QSize, Qt, Signal
from PySide6.QtGui import QColor, QPainter, QPen
from PySide6.QtWidgets import QRubberBand, QSizePolicy, QToolTip, QWidget

from .theme import ACCENT, BACKGROUND, FOREGROUND, MUTED, PANEL, mono_font, ui_font

TITLE_W = 150
CELL_W, CELL_H = 40, 22
EXP_CELL, EXP_COLS = 7, 32       # one expert's tensor: a small square, 32 per row
SEC_GAP, ROW_GAP, CAPTION_H = 14, 10, 14


class MapCanvas(QWidget):
    cellClicked = Signal(str)
    selectionChanged = Signal()
    hovered = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("ModelMapCanvas")
        self.setMouseTracking(True)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        self.blocks = []
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.rects = np.zeros((0, 4), np.float32)       # x, y, w, h per cell
        self.labels: list[str] = []
        self.colours = np.zeros((0, 4), np.uint8)
        self.block_rects: list[tuple[QRectF, object]] = []    # (title rect, block)
        self.block_y = np.zeros((0, 2), np.float32)           # (top, bottom) per block
        self.captions: list[tuple[QRectF, str]] = []
        self.block_text: dict[str, str] = {}     # block key -> totals line
        self.selected: set[str] = set()
        self.current: str | None = None
        self._size = QSize(400, 200)
        self._press: QPoint | None = None
        self._band = QRubberBand(QRubberBand.Shape.Rectangle, self)
        self.cell_font = mono_font(7.5)
        self.title_font = ui_font(9.0)
        self.small_font = ui_font(7.5)

    # ---- geometry --------------------------------------------------------------------------
    def set_blocks(self, blocks, geometry=None) -> None:
        """Lay out `blocks` (workbench.planning.model_map.layout); `geometry`: what
        :func:`map_geometry` gave for them (worked out off the GUI thread), else worked out
        here."""
        g = geometry if geometry is not None else map_geometry(blocks)
        self.blocks = blocks
        (self.names, self.index, self.labels, self.rects, self.block_y, self.block_rects,
         self.captions, size) = g
        self.colours = np.zeros((len(self.names), 4), np.uint8)
        self.selected &= set(self.names)
        self._size = QSize(*size)
        self.setMinimumSize(self._size)
        self.updateGeometry()
        self.update()

    def sizeHint(self) -> QSize:
        return self._size

    def set_colours(self, colours: np.ndarray) -> None:
        self.colours = colours
        self.update()

    def set_block_text(self, text: dict[str, str]) -> None:
        self.block_text = text
        self.update()

    def set_current(self, name: str | None) -> None:
        self.current = name if name in self.index else None
        self.update()

    def cell_rect(self, name: str) -> QRectF | None:
        i = self.index.get(name)
        if i is None:
            return None
        x, y, w, h = (float(v) for v in self.rects[i])
        return QRectF(x, y, w, h)

    # ---- painting --------------------------------------------------------------------------
    def paint_into(self, p: QPainter, area: QRectF) -> int:
        """Draw the part of the map in `area`; returns the number of cells drawn."""
        p.fillRect(area, QColor(BACKGROUND))
        if not len(self.names):
            p.setPen(QColor(MUTED))
            p.drawText(area, Qt.AlignmentFlag.AlignCenter, "no model")
            return 0
        top, bottom = area.top(), area.bottom()
        vis = np.nonzero((self.block_y[:, 1] >= top) & (self.block_y[:, 0] <= bottom))[0]
        fg, muted = QColor(FOREGROUND), QColor(MUTED)
        for k in vis:
            r, b = self.block_rects[k]
            p.fillRect(QRectF(r.left(), r.top(), area.right() - r.left() - 4, r.height()),
                       QColor(PANEL))
            p.setFont(self.title_font)
            p.setPen(fg)
            p.drawText(QRectF(r.left() + 6, r.top() + 2, r.width() - 8, 16),
                       Qt.AlignmentFlag.AlignLeft, b.title)
            p.setFont(self.small_font)
            p.setPen(muted)
            text = self.block_text.get(b.key, "")
            p.drawText(QRectF(r.left() + 6, r.top() + 18, r.width() - 8, r.height() - 18),
                       int(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)
                       | int(Qt.TextFlag.TextWordWrap), text)
        p.setFont(self.small_font)
        p.setPen(muted)
        for rect, title in self.captions:
            if rect.bottom() >= top and rect.top() <= bottom:
                p.drawText(rect, int(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter),
                           title)
        R = self.rects
        m = ((R[:, 1] + R[:, 3] >= top) & (R[:, 1] <= bottom)
             & (R[:, 0] + R[:, 2] >= area.left()) & (R[:, 0] <= area.right()))
        idx = np.nonzero(m)[0]
        cols = self.colours
        p.setPen(Qt.PenStyle.NoPen)
        for i in idx:
            x, y, w, h = R[i]
            c = cols[i]
            p.fillRect(QRectF(float(x), float(y), float(w), float(h)),
                       QColor(int(c[0]), int(c[1]), int(c[2])))
        p.setFont(self.cell_font)
        for i in idx:
            x, y, w, h = R[i]
            if w < 20:
                continue
            c = cols[i]
            lum = 0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2]
            p.setPen(QColor("#101216") if lum > 140 else QColor("#e8ebf0"))
            p.drawText(QRectF(float(x), float(y), float(w), float(h)),
                       Qt.AlignmentFlag.AlignCenter, self.labels[i])
        if self.selected:
            p.setPen(QPen(QColor("#ffffff"), 1.5))
            p.setBrush(Qt.BrushStyle.NoBrush)
            for n in self.selected:
                i = self.index.get(n)
                if i is not None and m[i]:
                    x, y, w, h = R[i]
                    p.drawRect(QRectF(float(x) - 1, float(y) - 1, float(w) + 2, float(h) + 2))
        if self.current is not None:
            i = self.index[self.current]
            x, y, w, h = R[i]
            p.setPen(QPen(QColor(ACCENT), 2.5))
            p.setBrush(Qt.BrushStyle.NoBrush)
            p.drawRect(QRectF(float(x) - 2, float(y) - 2, float(w) + 4, float(h) + 4))
        return len(idx)

    def paintEvent(self, event) -> None:
        p = QPainter(self)
        self.last_drawn = self.paint_into(p, QRectF(event.rect()))
        p.end()

    # ---- mouse -----------------------------------------------------------------------------
    def cell_at(self, pos) -> str | None:
        R = self.rects
        x, y = pos.x(), pos.y()
        hit = np.nonzero((R[:, 0] <= x) & (x <= R[:, 0] + R[:, 2])
                         & (R[:, 1] <= y) & (y <= R[:, 1] + R[:, 3]))[0]
        return self.names[int(hit[0])] if hit.size else None

    def block_at(self, pos):
        for r, b in self.block_rects:
            if r.contains(pos.x(), pos.y()) and pos.x() < TITLE_W:
                return b
        return None

    def names_in(self, rect: QRect) -> list[str]:
        R = self.rects
        m = ((R[:, 0] <= rect.right()) & (R[:, 0] + R[:, 2] >= rect.left())
             & (R[:, 1] <= rect.bottom()) & (R[:, 1] + R[:, 3] >= rect.top()))
        return [self.names[i] for i in np.nonzero(m)[0]]

    def mousePressEvent(self, ev) -> None:
        if ev.button() == Qt.MouseButton.LeftButton:
            self._press = ev.position().toPoint()
            self._band.setGeometry(QRect(self._press, QSize()))

    def mouseMoveEvent(self, ev) -> None:
        pos = ev.position().toPoint()
        if self._press is not None and (pos - self._press).manhattanLength() > 4:
            self._band.setGeometry(QRect(self._press, pos).normalized())
            self._band.show()
        else:
            name = self.cell_at(pos)
            if name:
                self.hovered.emit(name)

    def mouseReleaseEvent(self, ev) -> None:
        if self._press is None:
            return
        pos = ev.position().toPoint()
        add = bool(ev.modifiers() & Qt.KeyboardModifier.ControlModifier)
        if self._band.isVisible():
            self._band.hide()
            self.select(self.names_in(QRect(self._press, pos).normalized()), add)
        else:
            name = self.cell_at(pos)
            block = self.block_at(pos) if name is None else None
            if name is not None:
                self.select([name], add)
                self.cellClicked.emit(name)
            elif block is not None:
                self.select(block.names, add)
        self._press = None

    def select(self, names, add: bool = False) -> None:
        self.selected = (self.selected | set(names)) if add else set(names)
        self.update()
        self.selectionChanged.emit()

    def event(self, ev) -> bool:
        from PySide6.QtCore import QEvent
        if ev.type() == QEvent.Type.ToolTip:
            name = self.cell_at(ev.pos())
            if name and self.tooltip is not None:
                QToolTip.showText(ev.globalPos(), self.tooltip(name), self)
            else:
                QToolTip.hideText()
            return True
        return super().event(ev)

    tooltip = None
    last_drawn = 0


def map_geometry(blocks) -> tuple:
    """Where every cell, caption and block title goes (numpy arrays and value types: no
    QObject is made, so the compute thread can lay out a 100,000-tensor map before it is first
    shown): (names, index, labels, rects, block_y, block_rects, captions, (width, height))."""
    names, rects, labels = [], [], []
    block_rects, captions = [], []
    block_y = []
    y = 6.0
    right = TITLE_W
    for b in blocks:
        x = TITLE_W + 6.0
        row_h = 30.0        # room for the title and two lines of totals
        for s in b.sections:
            n = len(s.cells)
            if s.experts:
                cell = 2 * EXP_CELL if n <= 16 else EXP_CELL    # few experts: larger
                cols = min(n, EXP_COLS)
                rows = -(-n // cols)
                w = cols * (cell + 1)
                h = rows * (cell + 1)
                idx = np.arange(n)
                xs = x + (idx % cols) * (cell + 1)
                ys = y + CAPTION_H + (idx // cols) * (cell + 1)
                rects.append(np.stack([xs, ys, np.full(n, cell), np.full(n, cell)], 1))
                title = f"{s.title} ({n})"
            else:
                w = n * (CELL_W + 2)
                h = CELL_H
                xs = x + np.arange(n) * (CELL_W + 2)
                rects.append(np.stack([xs, np.full(n, y + CAPTION_H), np.full(n, CELL_W),
                                       np.full(n, CELL_H)], 1))
                title = s.title
            w = max(w, 7 * len(title))
            captions.append((QRectF(x, y, w, CAPTION_H), title))
            names.extend(c.name for c in s.cells)
            labels.extend(c.label for c in s.cells)
            x += w + SEC_GAP
            row_h = max(row_h, h)
        bottom = y + CAPTION_H + row_h
        block_rects.append((QRectF(4, y, TITLE_W - 6, bottom - y), b))
        block_y.append((y, bottom))
        right = max(right, x)
        y = bottom + ROW_GAP
    index = {n: i for i, n in enumerate(names)}
    rects = (np.concatenate(rects).astype(np.float32) if rects else np.zeros((0, 4), np.float32))
    block_y = np.asarray(block_y, np.float32).reshape(-1, 2)
    return (names, index, labels, rects, block_y, block_rects, captions,
            (int(right + 8), int(y + 4)))

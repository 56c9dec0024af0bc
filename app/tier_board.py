"""The precision tier board: one column per tier, each weight matrix a card in its tier.

Each column is a QListView over a :class:`TierListModel` (a filtered view of the plan).
Dragging cards to another column drops their names as MIME data; the receiving model's
`dropMimeData` pushes a "move to tier" command, and the table, totals and plots follow
through the document's signals.
"""

from __future__ import annotations

import json

from PySide6.QtCore import QAbstractListModel, QMimeData, QModelIndex, QRect, QSize, Qt
from PySide6.QtGui import QBrush, QColor, QPainter, QPen
from PySide6.QtWidgets import (QAbstractItemView, QComboBox, QFrame, QHBoxLayout, QLabel,
                               QListView, QStyle, QStyledItemDelegate, QVBoxLayout, QWidget)

from workbench.schemes import list_schemes

from .format import fmt_bytes, fmt_db, fmt_shape, plural
from .theme import MONO_FAMILY, UI_FAMILY, sqnr_colour, tier_colour
from .tiers import on_board, tier_index

MIME = "application/x-quant-workbench-tensors"
NAME_ROLE = Qt.ItemDataRole.UserRole + 20


def members(doc, tier: int) -> list[str]:
    if doc.model is None:
        return []
    return [n for n, info in doc.model.tensors.items()
            if on_board(info) and tier_index(doc.tiers, doc.scheme_of(n), info) == tier]


class TierListModel(QAbstractListModel):
    def __init__(self, doc, tier: int, on_drop, parent=None):
        super().__init__(parent)
        self.doc = doc
        self.tier = tier
        self.on_drop = on_drop
        self.names: list[str] = []
        self._row: dict[str, int] = {}
        doc.modelChanged.connect(self.rebuild)
        doc.stateChanged.connect(lambda _n: self.rebuild())
        doc.tiersChanged.connect(self.rebuild)
        doc.resultsChanged.connect(self._changed)

    def rebuild(self) -> None:
        new = members(self.doc, self.tier)
        if new == self.names:
            self._changed(new)
            return
        self.beginResetModel()
        self.names = new
        self._row = {n: i for i, n in enumerate(new)}
        self.endResetModel()

    def _changed(self, names) -> None:
        for n in names:
            r = self._row.get(n)
            if r is not None:
                self.dataChanged.emit(self.index(r), self.index(r))

    def rowCount(self, parent=QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self.names)

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        name = self.names[index.row()]
        if role == NAME_ROLE:
            return name
        if role == Qt.ItemDataRole.DisplayRole:
            return name
        if role == Qt.ItemDataRole.ToolTipRole:
            info = self.doc.model.info(name)
            return f"{name}\n{fmt_shape(info.shape)} · {self.doc.scheme_of(name)}"
        return None

    def flags(self, index):
        if not index.isValid():
            return Qt.ItemFlag.ItemIsDropEnabled
        return (Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable
                | Qt.ItemFlag.ItemIsDragEnabled)

    def supportedDropActions(self):
        return Qt.DropAction.MoveAction | Qt.DropAction.CopyAction

    def supportedDragActions(self):
        return Qt.DropAction.MoveAction

    def mimeTypes(self):
        return [MIME]

    def mimeData(self, indexes):
        names = []
        for i in indexes:
            n = self.names[i.row()]
            if n not in names:
                names.append(n)
        md = QMimeData()
        md.setData(MIME, json.dumps(names).encode("utf-8"))
        md.setText("\n".join(names))
        return md

    def canDropMimeData(self, data, action, row, column, parent) -> bool:
        return data.hasFormat(MIME)

    def dropMimeData(self, data, action, row, column, parent) -> bool:
        if not data.hasFormat(MIME):
            return False
        try:
            names = json.loads(bytes(data.data(MIME)).decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            return False
        names = [n for n in names if isinstance(n, str) and n not in self._row]
        if names:
            self.on_drop(names, self.tier)
        return False  # the move is done by the command; nothing for the source view to remove


def card_title(name: str, block) -> str:
    """'model.layers.3.self_attn.q_proj.weight' -> 'L3 · self_attn.q_proj'."""
    import re
    stem = re.sub(r"\.weight$", "", name)
    if block is not None:
        m = re.search(rf"(?:^|\.){block}\.(.*)$", stem)
        if m:
            return f"L{block} · {m.group(1)}"
    return stem


class CardDelegate(QStyledItemDelegate):
    """Paints a card: short name, shape, scheme and SQNR (colour-coded)."""

    def __init__(self, doc, tier: int, parent=None):
        super().__init__(parent)
        self.doc = doc
        self.tier = tier

    def sizeHint(self, option, index):
        return QSize(option.rect.width() or 200, 46)

    def paint(self, p: QPainter, option, index) -> None:
        name = index.data(NAME_ROLE)
        info = self.doc.model.info(name)
        scheme = self.doc.scheme_of(name)
        r = self.doc.result(name)
        p.save()
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        rect = option.rect.adjusted(4, 3, -4, -3)
        selected = bool(option.state & QStyle.StateFlag.State_Selected)
        p.setPen(QPen(QColor("#4c9aff") if selected else QColor("#343a46"), 1))
        p.setBrush(QBrush(QColor("#2d3340") if selected else QColor("#262b34")))
        p.drawRoundedRect(rect, 5, 5)
        p.fillRect(QRect(rect.left(), rect.top() + 4, 3, rect.height() - 8), tier_colour(self.tier))
        short = card_title(name, info.block)
        f = p.font()
        f.setFamily(UI_FAMILY)
        f.setPointSizeF(9)
        f.setBold(True)
        p.setFont(f)
        p.setPen(QColor("#dfe3ea"))
        text_rect = rect.adjusted(10, 3, -6, 0)
        p.drawText(text_rect, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop,
                   p.fontMetrics().elidedText(short, Qt.TextElideMode.ElideLeft, text_rect.width()))
        f = p.font()
        f.setFamily(MONO_FAMILY)
        f.setBold(False)
        f.setPointSizeF(8)
        p.setFont(f)
        p.setPen(QColor("#8a92a3"))
        line = f"{fmt_shape(info.shape)}  {scheme if scheme != 'keep' else 'keep ' + info.dtype}"
        bottom = rect.adjusted(10, 0, -6, -4)
        p.drawText(bottom, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignBottom,
                   p.fontMetrics().elidedText(line, Qt.TextElideMode.ElideRight,
                                              bottom.width() - 70))
        sq = r.error.sqnr_db if r is not None else None
        c = sqnr_colour(sq)
        p.setPen(c if c is not None else QColor("#8a92a3"))
        p.drawText(bottom, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignBottom,
                   f"{fmt_db(sq)} dB" if sq is not None else "…")
        p.restore()


class TierColumn(QFrame):
    def __init__(self, doc, tier: int, on_drop, on_scheme, activated, parent=None):
        super().__init__(parent)
        self.doc = doc
        self.tier = tier
        self.on_scheme = on_scheme
        self.setObjectName("TierColumn")
        self.title = QLabel()
        self.title.setObjectName("TierTitle")
        self.summary = QLabel()
        self.summary.setObjectName("Muted")
        self.summary.setWordWrap(True)
        self.summary.setMinimumWidth(1)
        self.scheme = QComboBox()
        self.scheme.addItems(list_schemes())
        self.scheme.setMaxVisibleItems(24)
        self.scheme.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.scheme.setMinimumContentsLength(8)
        self.scheme.activated.connect(lambda _i: self._scheme_chosen())
        self.model = TierListModel(doc, tier, on_drop, self)
        self.view = QListView()
        self.view.setModel(self.model)
        self.view.setItemDelegate(CardDelegate(doc, tier, self.view))
        self.view.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.view.setDragEnabled(True)
        self.view.setAcceptDrops(True)
        self.view.setDropIndicatorShown(True)
        self.view.setDragDropMode(QAbstractItemView.DragDropMode.DragDrop)
        self.view.setDefaultDropAction(Qt.DropAction.MoveAction)
        self.view.setUniformItemSizes(True)
        self.view.setObjectName("TierList")
        self.view.selectionModel().currentChanged.connect(
            lambda cur, _p: cur.isValid() and activated(cur.data(NAME_ROLE)))
        head = QHBoxLayout()
        head.addWidget(self.title)
        head.addStretch(1)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 6, 6, 6)
        lay.setSpacing(4)
        lay.addLayout(head)
        lay.addWidget(self.scheme)
        lay.addWidget(self.summary)
        lay.addWidget(self.view, 1)
        self.model.modelReset.connect(self.refresh_header)
        self.model.dataChanged.connect(lambda *_: self.refresh_header())
        doc.tiersChanged.connect(self.refresh_header)

    def _scheme_chosen(self) -> None:
        s = self.scheme.currentText()
        if s != self.doc.tiers[self.tier].scheme:
            self.on_scheme(self.tier, s)

    def refresh_header(self) -> None:
        t = self.doc.tiers[self.tier]
        colour = tier_colour(self.tier).name()
        self.title.setText(f"<span style='color:{colour}'>■</span>&nbsp; <b>{t.name}</b>")
        self.scheme.setCurrentText(t.scheme)
        names = self.model.names
        if self.doc.model is None:
            return
        params = sum(self.doc.model.info(n).numel for n in names)
        size = sum(self.doc.bytes_of(n) for n in names)
        share = 100.0 * params / max(self.doc.model.total_params, 1)
        self.summary.setText(f"{plural(len(names), 'tensor')} · {share:.1f}% of params · {fmt_bytes(size)}")


class TierBoard(QWidget):
    def __init__(self, doc, push, activated, parent=None):
        super().__init__(parent)
        self.doc = doc
        self.push = push
        self.activated = activated
        self.columns: list[TierColumn] = []
        self.row = QHBoxLayout()
        self.row.setSpacing(8)
        self.note = QLabel()
        self.note.setObjectName("Muted")
        self.note.setWordWrap(True)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 6, 0, 0)
        lay.addLayout(self.row, 1)
        lay.addWidget(self.note)
        doc.modelChanged.connect(self.rebuild)
        doc.tiersChanged.connect(self._tiers_changed)

    def _tiers_changed(self) -> None:
        if len(self.columns) != len(self.doc.tiers):
            self.rebuild()

    def rebuild(self) -> None:
        for c in self.columns:
            c.setParent(None)
            c.deleteLater()
        self.columns = []
        for i in range(len(self.doc.tiers)):
            col = TierColumn(self.doc, i, self.drop, self.set_scheme, self.activated)
            self.row.addWidget(col, 1)
            self.columns.append(col)
            col.model.rebuild()
            col.refresh_header()
        if self.doc.model is not None:
            kept = sum(1 for i in self.doc.model.tensors.values() if not on_board(i))
            self.note.setText(f"Drag cards between tiers to assign the tier's scheme. "
                              f"{kept} vectors / integer tensors are kept as stored and not shown.")

    def drop(self, names, tier: int) -> None:
        from .commands import move_to_tier
        self.push(move_to_tier(self.doc, names, tier))

    def set_scheme(self, tier: int, scheme: str) -> None:
        from .commands import set_tier_scheme
        self.push(set_tier_scheme(self.doc, tier, scheme, members(self.doc, tier)))

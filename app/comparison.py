"""Scheme comparison for the selected tensor: every eligible scheme side by side.

Rows fill in as the compute thread evaluates each scheme (results are cached, so a scheme
measured once is instant afterwards). Sortable; double-click a row to assign that scheme.
"""

from __future__ import annotations

import math

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QSortFilterProxyModel, Qt
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (QAbstractItemView, QHBoxLayout, QHeaderView, QLabel,
                               QPushButton, QTableView, QVBoxLayout, QWidget)

from workbench.plan import KEEP

from .commands import schemes_for
from .format import fmt_bytes, fmt_db, fmt_float, fmt_gbs
from .theme import MUTED, mono_font, sqnr_colour

COLUMNS = ("Scheme", "Bits/w", "Bytes", "Rel. RMSE", "SQNR dB", "Max err", "GB/s")
SORT_ROLE = Qt.ItemDataRole.UserRole + 30


class ComparisonModel(QAbstractTableModel):
    def __init__(self, doc, parent=None):
        super().__init__(parent)
        self.doc = doc
        self.name: str | None = None
        self.schemes: list[str] = []
        self._row: dict[str, int] = {}
        self._mono = mono_font()
        doc.resultAdded.connect(self._result)
        doc.throughputChanged.connect(self._gbs)
        doc.stateChanged.connect(self._state)

    def set_tensor(self, name: str | None) -> None:
        self.beginResetModel()
        self.name = name
        self.schemes = list(schemes_for(self.doc.model.info(name))) if name else []
        self._row = {s: i for i, s in enumerate(self.schemes)}
        self.endResetModel()

    def _result(self, name: str, scheme: str) -> None:
        if name == self.name and scheme in self._row:
            r = self._row[scheme]
            self.dataChanged.emit(self.index(r, 0), self.index(r, len(COLUMNS) - 1))

    def _gbs(self, names) -> None:
        if self.name in names and self.schemes:
            self.dataChanged.emit(self.index(0, 6), self.index(len(self.schemes) - 1, 6))

    def _state(self, names) -> None:
        if self.name in names and self.schemes:
            self.dataChanged.emit(self.index(0, 0), self.index(len(self.schemes) - 1, 0))

    def rowCount(self, parent=QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self.schemes)

    def columnCount(self, parent=QModelIndex()) -> int:
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section, orientation, role=Qt.ItemDataRole.DisplayRole):
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return COLUMNS[section]
        return None

    def value(self, scheme: str, col: int):
        r = self.doc.result_for(self.name, scheme)
        if col == 0:
            return scheme
        if col in (1, 2):
            b = r.bytes if r is not None else self.doc.estimated_bytes(self.name, scheme)
            n = self.doc.model.info(self.name).numel
            return b if col == 2 else (8.0 * b / n if n else 0.0)
        if col == 6:
            return self.doc.throughput.get((self.name, scheme))
        if r is None:
            return None
        return {3: r.error.rel_rmse, 4: r.error.sqnr_db, 5: r.error.max_abs_err}[col]

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        scheme, col = self.schemes[index.row()], index.column()
        v = self.value(scheme, col)
        if role == Qt.ItemDataRole.DisplayRole:
            if col == 0:
                current = self.doc.scheme_of(self.name) == scheme
                return f"{'● ' if current else ''}{scheme}"
            if v is None:
                return "n/a" if col == 6 and (self.name, scheme) in self.doc.throughput else "…"
            return [None, lambda x: f"{x:.3f}", fmt_bytes, fmt_float, fmt_db, fmt_float,
                    fmt_gbs][col](v)
        if role == SORT_ROLE:
            if col == 0:
                return scheme
            if v is None:
                return -math.inf
            return 1e300 if isinstance(v, float) and math.isinf(v) else v
        if role == Qt.ItemDataRole.FontRole and col > 0:
            return self._mono
        if role == Qt.ItemDataRole.TextAlignmentRole and col > 0:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == Qt.ItemDataRole.ForegroundRole:
            if col == 4 and v is not None:
                c = sqnr_colour(v)
                return QBrush(c) if c is not None else None
            if v is None:
                return QBrush(QColor(MUTED))
        return None


class ComparisonView(QWidget):
    def __init__(self, doc, analyzer, push, parent=None):
        super().__init__(parent)
        self.doc = doc
        self.analyzer = analyzer
        self.push = push
        self.task = None
        self.model = ComparisonModel(doc, self)
        self.proxy = QSortFilterProxyModel(self)
        self.proxy.setSourceModel(self.model)
        self.proxy.setSortRole(SORT_ROLE)
        self.view = QTableView()
        self.view.setModel(self.proxy)
        self.view.setSortingEnabled(True)
        self.view.sortByColumn(1, Qt.SortOrder.DescendingOrder)
        self.view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.view.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.view.setAlternatingRowColors(True)
        self.view.verticalHeader().hide()
        self.view.verticalHeader().setDefaultSectionSize(22)
        self.view.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.view.doubleClicked.connect(self._assign)
        self.label = QLabel("Select a tensor to compare every scheme that can take it.")
        self.label.setObjectName("Muted")
        self.run_button = QPushButton("Compare all schemes")
        self.run_button.clicked.connect(self.run)
        bar = QHBoxLayout()
        bar.addWidget(self.label, 1)
        bar.addWidget(self.run_button)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 4, 0, 0)
        lay.addLayout(bar)
        lay.addWidget(self.view, 1)
        self._pending: str | None = None
        doc.currentChanged.connect(self._current)
        doc.modelChanged.connect(lambda: self._current(""))

    def _current(self, name: str) -> None:
        if self.task is not None and not self.task.finished:
            self.task.cancel()
        self._pending = name or ""
        if self.isVisible() or not name:
            self._apply_pending()

    def _apply_pending(self) -> None:
        """Fill the table for the current tensor (deferred while the tab is hidden, so a
        selection does not pay for a table nobody sees)."""
        name, self._pending = self._pending, None
        if name is None:
            return
        self.model.set_tensor(name or None)
        if name:
            self.label.setText(f"{name}: {len(self.model.schemes)} eligible schemes "
                               "(double-click a row to assign it)")
            if self.isVisible():
                self.run()

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if self._pending is not None:
            self._apply_pending()
        elif self.model.name and (self.task is None or self.task.finished):
            self.run()

    def run(self) -> None:
        if self.model.name:
            missing = [s for s in self.model.schemes
                       if self.doc.result_for(self.model.name, s) is None
                       or (self.model.name, s) not in self.doc.throughput]
            if missing:
                self.task = self.analyzer.compare(self.model.name, missing)

    def _assign(self, index) -> None:
        scheme = self.model.schemes[self.proxy.mapToSource(index).row()]
        from .commands import assign
        self.push(assign(self.doc, [self.model.name], scheme))

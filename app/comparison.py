"""Scheme comparison for the selected tensor: every eligible scheme side by side, as a table
beside a plot of bits per weight against SQNR (workbench.scheme_choice: Pareto points
marked, the current scheme highlighted).

Rows and points fill in as the compute thread evaluates each scheme (results are cached, so
a scheme measured once is instant afterwards). Sortable; double-click a row (or Enter), or
click a point, to assign that scheme (one undoable edit).
"""

from __future__ import annotations

import math

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QSortFilterProxyModel, Qt, QTimer
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (QAbstractItemView, QHBoxLayout, QHeaderView, QLabel,
                               QPushButton, QSplitter, QTableView, QVBoxLayout, QWidget)

from workbench.plan import KEEP
from workbench.scheme_choice import family_of, points_from_results

from .commands import schemes_for
from .format import fmt_bytes, fmt_db, fmt_float, fmt_gbs
from .theme import MUTED, mono_font, sqnr_colour

COLUMNS = ("Scheme", "Bits/w", "SQNR dB", "Rel. RMSE", "Bytes", "Max err", "GB/s", "Family")
C_SCHEME, C_BITS, C_SQNR, C_REL, C_BYTES, C_MAX, C_GBS, C_FAMILY = range(len(COLUMNS))
SORT_ROLE = Qt.ItemDataRole.UserRole + 30


class ComparisonModel(QAbstractTableModel):
    def __init__(self, doc, parent=None):
        super().__init__(parent)
        self.doc = doc
        self.name: str | None = None
        self.schemes: list[str] = []
        self.pareto: set[str] = set()
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
        self.pareto = {p.scheme for p in self.points() if p.pareto}
        self.endResetModel()

    def update_pareto(self) -> None:
        new = {p.scheme for p in self.points() if p.pareto}
        if new != self.pareto:
            self.pareto = new
            if self.schemes:
                self.dataChanged.emit(self.index(0, 0), self.index(len(self.schemes) - 1, 0))

    def _result(self, name: str, scheme: str) -> None:
        if name == self.name and scheme in self._row:
            r = self._row[scheme]
            self.dataChanged.emit(self.index(r, 0), self.index(r, len(COLUMNS) - 1))

    def _gbs(self, names) -> None:
        if self.name in names and self.schemes:
            self.dataChanged.emit(self.index(0, C_GBS), self.index(len(self.schemes) - 1, C_GBS))

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
        if col == C_SCHEME:
            return scheme
        if col == C_FAMILY:
            return family_of(scheme)
        if col in (C_BITS, C_BYTES):
            b = r.bytes if r is not None else self.doc.estimated_bytes(self.name, scheme)
            n = self.doc.model.info(self.name).numel
            return b if col == C_BYTES else (8.0 * b / n if n else 0.0)
        if col == C_GBS:
            return self.doc.throughput.get((self.name, scheme))
        if r is None:
            return None
        return {C_REL: r.error.rel_rmse, C_SQNR: r.error.sqnr_db, C_MAX: r.error.max_abs_err}[col]

    def points(self):
        """workbench.scheme_choice points of the schemes evaluated so far (Pareto marked)."""
        if not self.name:
            return []
        info = self.doc.model.info(self.name)
        rs = [r for r in (self.doc.result_for(self.name, s) for s in self.schemes)
              if r is not None]
        return points_from_results(rs, info)

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        scheme, col = self.schemes[index.row()], index.column()
        v = self.value(scheme, col)
        if role == Qt.ItemDataRole.DisplayRole:
            if col == C_SCHEME:
                current = self.doc.scheme_of(self.name) == scheme
                pareto = scheme in self.pareto
                return f"{'● ' if current else ''}{scheme}{'  ◆' if pareto else ''}"
            if col == C_FAMILY:
                return v
            if v is None:
                return "n/a" if col == C_GBS and (self.name, scheme) in self.doc.throughput \
                    else "…"
            return {C_BITS: lambda x: f"{x:.3f}", C_BYTES: fmt_bytes, C_REL: fmt_float,
                    C_SQNR: fmt_db, C_MAX: fmt_float, C_GBS: fmt_gbs}[col](v)
        if role == Qt.ItemDataRole.ToolTipRole and col == C_SCHEME:
            return ("◆ Pareto point: no other scheme has as few bits per weight and as high "
                    "an SQNR" if scheme in self.pareto else None)
        if role == SORT_ROLE:
            if col in (C_SCHEME, C_FAMILY):
                return scheme if col == C_SCHEME else f"{v} {scheme}"
            if v is None:
                return -math.inf
            return 1e300 if isinstance(v, float) and math.isinf(v) else v
        if role == Qt.ItemDataRole.FontRole and col not in (C_SCHEME, C_FAMILY):
            return self._mono
        if role == Qt.ItemDataRole.TextAlignmentRole and col not in (C_SCHEME, C_FAMILY):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == Qt.ItemDataRole.ForegroundRole:
            if col == C_FAMILY:
                from .plots.scheme_points import FAMILY_COLOURS
                return QBrush(QColor(FAMILY_COLOURS.get(v, "#c9ced8")))
            if col == C_SQNR and v is not None:
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
        self.view.sortByColumn(C_BITS, Qt.SortOrder.DescendingOrder)
        self.view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.view.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.view.setAlternatingRowColors(True)
        self.view.verticalHeader().hide()
        self.view.verticalHeader().setDefaultSectionSize(22)
        self.view.verticalHeader().setDefaultSectionSize(19)
        self.view.setWordWrap(False)
        hdr = self.view.horizontalHeader()
        hdr.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        hdr.setStretchLastSection(True)
        from PySide6.QtGui import QFontMetrics
        text, mono = self.view.fontMetrics(), QFontMetrics(mono_font())
        for col, sample in ((C_SCHEME, "● int8-g128-asym  ◆"), (C_FAMILY, "GGML legacy"),
                            (C_BITS, "32.000"), (C_BYTES, "1023 KiB"), (C_REL, "1.234e-05"),
                            (C_SQNR, "166.44"), (C_MAX, "1.234e-05"), (C_GBS, "12.3")):
            head = hdr.fontMetrics().horizontalAdvance(COLUMNS[col]) + 26
            fm = text if col in (C_SCHEME, C_FAMILY) else mono
            self.view.setColumnWidth(col, max(fm.horizontalAdvance(sample) + 16, head))
        self.view.doubleClicked.connect(self._assign)
        self.view.activated.connect(self._assign)
        from .plots.scheme_points import SchemePointsPlot
        self.plot = SchemePointsPlot()
        self.plot.picked.connect(self.assign_scheme)
        self.label = QLabel("Select a tensor to compare every scheme that can take it.")
        self.label.setObjectName("Muted")
        self.label.setMinimumWidth(1)
        from PySide6.QtWidgets import QSizePolicy
        self.label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.hover = QLabel(" ")
        self.hover.setObjectName("HoverReadout")
        self.hover.setMinimumWidth(1)
        self.hover.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.plot.hovered.connect(self.hover.setText)
        self.run_button = QPushButton("Compare all schemes")
        self.run_button.clicked.connect(self.run)
        bar = QHBoxLayout()
        bar.addWidget(self.label, 1)
        bar.addWidget(self.run_button)
        self.split = QSplitter(Qt.Orientation.Horizontal)
        self.split.addWidget(self.view)
        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.setSpacing(2)
        rl.addWidget(self.plot, 1)
        rl.addWidget(self.hover)
        self.split.addWidget(right)
        self.split.setStretchFactor(0, 5)
        self.split.setStretchFactor(1, 4)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 4, 0, 0)
        lay.addLayout(bar)
        lay.addWidget(self.split, 1)
        self._pending: str | None = None
        # points are redrawn at most every 150 ms while results stream in
        self._replot = QTimer(self, singleShot=True, interval=150)
        self._replot.timeout.connect(self.refresh_plot)
        doc.currentChanged.connect(self._current)
        doc.modelChanged.connect(lambda: self._current(""))
        doc.resultAdded.connect(self._result)
        doc.stateChanged.connect(self._state)

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
        self.refresh_plot()
        if name:
            self.label.setText(f"{name}: all {len(self.model.schemes)} eligible schemes; "
                               "◆ Pareto · ● current · double-click a row or click a point "
                               "to assign")
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

    def _result(self, name: str, _scheme: str) -> None:
        if name == self.model.name and not self._replot.isActive():
            self._replot.start()

    def _state(self, names) -> None:
        if self.model.name in names:
            self.plot.set_current(self.doc.scheme_of(self.model.name))

    def refresh_plot(self) -> None:
        """Points of every scheme evaluated so far (workbench.scheme_choice), Pareto marked."""
        self.model.update_pareto()
        name = self.model.name
        self.plot.set_points(self.model.points(), self.doc.scheme_of(name) if name else None)

    def _assign(self, index) -> None:
        self.assign_scheme(self.model.schemes[self.proxy.mapToSource(index).row()])

    def assign_scheme(self, scheme: str) -> None:
        """One undoable edit: the compared tensor gets `scheme`."""
        if not self.model.name or scheme == self.doc.scheme_of(self.model.name):
            return
        from .commands import assign
        self.push(assign(self.doc, [self.model.name], scheme))

"""The scheme table model: one row per tensor, read from the plan and the catalog.

A QAbstractTableModel over the document (DESIGN.md example 6): it holds no copy of the
plan; an edit of the Scheme column is handed to `on_assign(names, scheme)` (which pushes
an undoable command), and when the document reports changed tensors the model emits
`dataChanged` for exactly those rows.
"""

from __future__ import annotations

import math

from PySide6.QtCore import QAbstractTableModel, QModelIndex, Qt
from PySide6.QtGui import QBrush, QColor

from workbench.api.plans import KEEP

from . import perf

from .format import fmt_bytes, fmt_count, fmt_db, fmt_float, fmt_gbs, fmt_shape
from .theme import MUTED, mono_font, sqnr_colour

SORT_ROLE = Qt.ItemDataRole.UserRole + 10
NAME_ROLE = Qt.ItemDataRole.UserRole + 11

COLUMNS = ("Tensor", "Shape", "Params", "Role", "Scheme", "Bits/w", "Bytes", "Rel. RMSE",
           "SQNR dB", "Max err", "GB/s", "Method", "Note")
C_NAME, C_SHAPE, C_PARAMS, C_ROLE, C_SCHEME, C_BITS, C_BYTES, C_REL, C_SQNR, C_MAX, C_GBS, \
    C_METHOD, C_NOTE = range(len(COLUMNS))
NUMERIC = {C_PARAMS, C_BITS, C_BYTES, C_REL, C_SQNR, C_MAX, C_GBS}
TOOLTIPS = {
    C_BITS: "stored bits per weight, including scales and zero points",
    C_REL: "relative RMS error: sqrt(sum (w-w')² / sum w²)",
    C_SQNR: "signal-to-quantization-noise ratio, dB (green ≥ 25, amber ≥ 15, red below)",
    C_MAX: "largest absolute error of a single weight",
    C_GBS: "measured dequantization throughput of the kernels (float32 GB/s)",
    C_METHOD: "quantization method (rtn, imatrix, gptq, awq); the errors shown are the scheme's "
              "round-to-nearest ones — `evaluate/check/export --calib F` apply the method",
    C_NOTE: "what is applied instead of the plan's scheme, and why (fallbacks, kept tensors: "
            "workbench.quant.runtimes, as `evaluate` reports them)",
}
WARN = "#d29922"


class SchemeTableModel(QAbstractTableModel):
    def __init__(self, doc, on_assign=None, parent=None, on_method=None):
        super().__init__(parent)
        self.doc = doc
        self.on_assign = on_assign
        self.on_method = on_method
        self.on_sort = None       # on_sort(column, order): a view asked this model to sort
        self._names: list[str] = []
        self._row: dict[str, int] = {}
        self._mono = mono_font()
        self._muted = QBrush(QColor(MUTED))
        self._warn = QBrush(QColor(WARN))
        # fast path (app.perf): each cell's value per role is kept until the document
        # changes (these connections come first, so every later slot and paint reads fresh
        # values); a selection repaints up to a whole viewport of cells, ten roles each,
        # every one a Python call
        self._cache: dict = {}
        for sig in (doc.modelChanged, doc.stateChanged, doc.resultsChanged,
                    doc.throughputChanged, doc.statsChanged, doc.tiersChanged,
                    doc.estimatesChanged, doc.backendChanged):
            sig.connect(self._drop_cache)
        doc.modelChanged.connect(self.reset)
        doc.stateChanged.connect(self.rows_changed)
        doc.resultsChanged.connect(self.rows_changed)
        doc.throughputChanged.connect(self.rows_changed)

    # ---- structure ------------------------------------------------------------------------
    def reset(self) -> None:
        self._cache.clear()
        self.beginResetModel()
        self._names = self.doc.names()
        self._row = {n: i for i, n in enumerate(self._names)}
        self.endResetModel()

    def rows_changed(self, names) -> None:
        rows = sorted(self._row[n] for n in names if n in self._row)
        if not rows:
            return
        # one signal per contiguous run of rows
        start = prev = rows[0]
        for r in rows[1:] + [None]:
            if r is not None and r == prev + 1:
                prev = r
                continue
            self.dataChanged.emit(self.index(start, C_SCHEME), self.index(prev, C_NOTE))
            if r is not None:
                start = prev = r

    def sort(self, column, order=Qt.SortOrder.AscendingOrder) -> None:
        """A view showing this model itself asks it to sort: handed to `on_sort` (the scheme
        table then shows its sort proxy); the rows here keep the catalog's order."""
        if self.on_sort is not None:
            self.on_sort(column, order)

    def rowCount(self, parent=QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self._names)

    def columnCount(self, parent=QModelIndex()) -> int:
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section, orientation, role=Qt.ItemDataRole.DisplayRole):
        if orientation != Qt.Orientation.Horizontal:
            return None
        if role == Qt.ItemDataRole.DisplayRole:
            return COLUMNS[section]
        if role == Qt.ItemDataRole.ToolTipRole:
            return TOOLTIPS.get(section)
        if role == Qt.ItemDataRole.TextAlignmentRole and section in NUMERIC:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None

    def flags(self, index):
        if perf.FAST:    # asked for twice per painted cell: kept with the cell values
            key = (index.row(), index.column(), -1)
            try:
                return self._cache[key]
            except KeyError:
                f = self._cache[key] = self._flags(index)
                return f
        return self._flags(index)

    def _flags(self, index):
        f = Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable
        if index.column() == C_SCHEME and self.doc.model.info(self._names[index.row()]).is_float:
            f |= Qt.ItemFlag.ItemIsEditable
        if index.column() == C_METHOD and self._takes_method(self._names[index.row()]):
            f |= Qt.ItemFlag.ItemIsEditable
        return f

    def _takes_method(self, name: str) -> bool:
        info = self.doc.model.info(name)
        return info.is_float and info.ndim >= 2 and self.doc.scheme_of(name) != KEEP

    def name_at(self, row: int) -> str:
        return self._names[row]

    def row_of(self, name: str) -> int:
        return self._row[name]

    # ---- values ---------------------------------------------------------------------------
    def value(self, name: str, col: int):
        """The raw value of a cell (numbers unformatted; None = not known yet)."""
        info = self.doc.model.info(name)
        r = self.doc.result(name)
        if col == C_NAME:
            return name
        if col == C_SHAPE:
            return info.shape
        if col == C_PARAMS:
            return info.numel
        if col == C_ROLE:
            return info.role
        if col == C_SCHEME:
            return self.doc.scheme_of(name)
        if col == C_BYTES:
            return r.bytes if r is not None else self.doc.estimated_bytes(name)
        if col == C_BITS:
            b = r.bytes if r is not None else self.doc.estimated_bytes(name)
            return 8.0 * b / info.numel if info.numel else 0.0
        if col == C_GBS:
            return self.doc.gbs(name)
        if col == C_METHOD:
            return self.doc.method_of(name) if self._takes_method(name) else None
        if col == C_NOTE:
            return self.note(name)
        if r is None:
            return None
        return {C_REL: r.error.rel_rmse, C_SQNR: r.error.sqnr_db, C_MAX: r.error.max_abs_err}[col]

    def note(self, name: str) -> str | None:
        """The tensor's fallback note (None: the plan's scheme is applied as asked)."""
        d = self.doc.decision(name)
        if d is not None and d.kind in ("fallback", "skipped") or (
                d is not None and d.kind == "kept" and d.requested != KEEP and d.note):
            return f"{d.kind}: {d.note}"
        return None

    def _drop_cache(self, *_args) -> None:
        self._cache.clear()

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        if perf.FAST:
            key = (index.row(), index.column(), role)
            try:
                return self._cache[key]
            except KeyError:
                v = self._cache[key] = self._data(index, role)
                return v
        return self._data(index, role)

    def _data(self, index, role):
        name, col = self._names[index.row()], index.column()
        if role == NAME_ROLE:
            return name
        if role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.EditRole):
            v = self.value(name, col)
            if role == Qt.ItemDataRole.EditRole and col in (C_SCHEME, C_METHOD):
                return v
            return self._text(name, col, v)
        if role == SORT_ROLE:
            v = self.value(name, col)
            if col == C_SHAPE:
                return math.prod(v) if v else 0
            if v is None:
                return -math.inf
            if isinstance(v, float) and math.isinf(v):
                return 1e300 if v > 0 else -1e300
            return v
        if role == Qt.ItemDataRole.TextAlignmentRole and col in NUMERIC:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == Qt.ItemDataRole.FontRole and col in NUMERIC | {C_SHAPE}:
            return self._mono
        if role == Qt.ItemDataRole.ForegroundRole:
            if col == C_SQNR:
                r = self.doc.result(name)
                c = sqnr_colour(r.error.sqnr_db if r else None)
                return QBrush(c) if c is not None else self._muted
            if col in (C_REL, C_MAX, C_GBS) and self.value(name, col) is None:
                return self._muted
            if col == C_NOTE or (col == C_SCHEME and self.note(name)):
                return self._warn
            if col == C_SCHEME and self.doc.scheme_of(name) == KEEP:
                return self._muted
        if role == Qt.ItemDataRole.ToolTipRole:
            note = self.note(name)
            if note:
                return f"{self.doc.scheme_of(name)} not applied as asked — {note}"
            if col in (C_REL, C_SQNR, C_MAX) and self.doc.result(name) is None:
                # "…" says what it waits for (issue 33)
                return (f"not measured yet under {self.doc.scheme_of(name)}: the error "
                        "evaluation is queued or running (the work queue below shows how far)")
            return name if col == C_NAME else None
        return None

    def _text(self, name: str, col: int, v) -> str:
        if col == C_SHAPE:
            return fmt_shape(v)
        if col == C_PARAMS:
            return fmt_count(v)
        if col == C_SCHEME:
            if v == KEEP:
                return f"keep ({self.doc.model.info(name).display_dtype})"
            d = self.doc.decision(name)
            if d is not None and d.applied != v and self.note(name):
                applied = "keep" if d.applied == KEEP else d.applied
                return f"{v} → {applied} ⚠"
            return v
        if col == C_NOTE:
            return v or ""
        if col == C_BITS:
            return f"{v:.2f}"
        if col == C_BYTES:
            return fmt_bytes(v)
        if col == C_REL:
            return fmt_float(v)
        if col == C_SQNR:
            return fmt_db(v)
        if col == C_MAX:
            return fmt_float(v)
        if col == C_METHOD:
            return "—" if v is None else v
        if col == C_GBS:
            return "n/a" if v is None and (name, self.doc.scheme_of(name)) in self.doc.throughput \
                else ("—" if v is None else fmt_gbs(v))
        return str(v)

    def setData(self, index, value, role=Qt.ItemDataRole.EditRole) -> bool:
        if role == Qt.ItemDataRole.EditRole and index.column() == C_METHOD and value:
            if self.on_method is not None:
                self.on_method([self._names[index.row()]], str(value))
            return True
        if role != Qt.ItemDataRole.EditRole or index.column() != C_SCHEME or not value:
            return False
        names = [self._names[index.row()]]
        if self.on_assign is not None:
            self.on_assign(names, str(value))
        return True

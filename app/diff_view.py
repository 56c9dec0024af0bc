"""The "Compare" tab (issue 23): the current plan beside a second plan or quantized file (a
GGUF someone published, quantized safetensors, compressed-tensors) of the same model, tensor by
tensor — each one's type, bits per weight and error against the open model. The numbers are
`workbench.planning.diff.diff` (the `quant-workbench diff` command), computed on the compute thread.
Clicking a row selects that tensor everywhere."""

from __future__ import annotations

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QSortFilterProxyModel, Qt
from PySide6.QtWidgets import (QCheckBox, QFileDialog, QHBoxLayout, QLabel, QPushButton,
                               QTableView, QVBoxLayout, QWidget)

from .format import fmt_bytes, fmt_float
from .workers import FOREGROUND

HEADERS = ("Tensor", "Plan type", "Plan b/w", "Plan rel. RMSE", "Other type", "Other b/w",
           "Other rel. RMSE")


class DiffModel(QAbstractTableModel):
    """Rows of a `workbench.planning.diff` result (read-only)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.rows: list[dict] = []

    def set_rows(self, rows) -> None:
        self.beginResetModel()
        self.rows = list(rows)
        self.endResetModel()

    def rowCount(self, parent=QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent=QModelIndex()) -> int:
        return len(HEADERS)

    def headerData(self, section, orientation, role=Qt.ItemDataRole.DisplayRole):
        if role == Qt.ItemDataRole.DisplayRole and orientation == Qt.Orientation.Horizontal:
            return HEADERS[section]
        return None

    def value(self, row: dict, col: int):
        if col == 0:
            return row["name"]
        side = row["a"] if col <= 3 else row["b"]
        if side is None:
            return None
        return side[("type", "bits_per_weight", "rel_rmse")[(col - 1) % 3]]

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        row = self.rows[index.row()]
        v = self.value(row, index.column())
        if role == Qt.ItemDataRole.DisplayRole:
            if v is None:
                return "—" if index.column() in (1, 4) else ""
            if isinstance(v, float):
                return f"{v:.3f}" if index.column() in (2, 5) else fmt_float(v)
            return str(v)
        if role == Qt.ItemDataRole.UserRole:          # sort key
            return v if v is not None else float("-inf")
        if role == Qt.ItemDataRole.TextAlignmentRole and index.column() > 0:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == Qt.ItemDataRole.ForegroundRole and not row["same_type"] and index.column() in (1, 4):
            from PySide6.QtGui import QColor
            return QColor("#ffb454")
        return None


class DiffView(QWidget):
    def __init__(self, doc, runner, select, parent=None):
        super().__init__(parent)
        self.setObjectName("DiffView")
        self.doc, self.runner, self.select = doc, runner, select
        self.result = None
        self.path: str | None = None
        self.model = DiffModel(self)
        self.proxy = QSortFilterProxyModel(self)
        self.proxy.setSourceModel(self.model)
        self.proxy.setSortRole(Qt.ItemDataRole.UserRole)
        self.table = QTableView()
        self.table.setModel(self.proxy)
        self.table.setSortingEnabled(True)
        self.table.setSelectionBehavior(QTableView.SelectionBehavior.SelectRows)
        self.table.verticalHeader().hide()
        self.table.clicked.connect(self._clicked)
        self.open_button = QPushButton("Compare with…")
        self.open_button.clicked.connect(self.choose)
        self.only_diff = QCheckBox("only tensors whose types differ")
        self.only_diff.setChecked(True)
        self.only_diff.toggled.connect(lambda _on: self._fill())
        self.summary = QLabel("open a second plan or quantized file of this model (GGUF, "
                              "quantized safetensors, compressed-tensors) to compare")
        self.summary.setObjectName("DiffSummary")
        self.summary.setWordWrap(True)
        bar = QHBoxLayout()
        bar.setContentsMargins(0, 0, 0, 0)
        bar.addWidget(self.open_button)
        bar.addWidget(self.only_diff)
        bar.addStretch(1)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addLayout(bar)
        lay.addWidget(self.summary)
        lay.addWidget(self.table, 1)
        doc.modelChanged.connect(self._clear)

    def choose(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Compare the plan with", "",
            "Plans and quantized files (*.json *.gguf *.safetensors);;All files (*)")
        if path:
            self.compare(path)

    def compare(self, path: str):
        """Compute the comparison of the current plan with `path` on the compute thread."""
        from workbench.api.choices import diff
        model, plan = self.doc.model, self.doc.plan
        if model is None:
            return None
        self.path = path
        self.summary.setText(f"comparing with {path}…")
        return self.runner.submit(lambda: diff(plan, path, model, check=False),
                                  f"Comparing with {path}", FOREGROUND, visible=True,
                                  on_done=self._done, on_error=self._failed)

    def _done(self, result) -> None:
        self.result = result
        t = result["totals"]
        a, b = t["a_matched"], t["b_matched"]

        def fig(x):
            sq = x["sqnr_db"]
            return (f"{fmt_bytes(x['bytes'])}, {x['bits_per_weight']:.3f} b/w"
                    + ("" if sq is None else f", SQNR {sq:.2f} dB"))
        self.summary.setText(
            f"<b>{result['b']['path']}</b> ({result['b']['kind']}): {t['matched']} tensors in "
            f"both, {t['different_type']} of another type, {t['only_a']} only in the model, "
            f"{t['only_b']} only in the file.<br>plan: {fig(a)} · other: {fig(b)}")
        self._fill()

    def _failed(self, message: str) -> None:
        self.summary.setText(f"cannot compare: {message.splitlines()[0]}")

    def _fill(self) -> None:
        if self.result is None:
            self.model.set_rows([])
            return
        rows = self.result["tensors"]
        if self.only_diff.isChecked():
            rows = [r for r in rows if not r["same_type"] and (r["a"] or r["b"])]
        self.model.set_rows(rows)
        self.table.resizeColumnsToContents()

    def _clear(self) -> None:
        self.result = None
        self._fill()

    def _clicked(self, index) -> None:
        row = self.model.rows[self.proxy.mapToSource(index).row()]
        if self.doc.model is not None and row["name"] in self.doc.model.tensors:
            self.select(row["name"])

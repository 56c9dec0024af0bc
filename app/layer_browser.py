"""The layer browser: tensors grouped by block, with a substring / `re:` filter."""

from __future__ import annotations

import re

from workbench.errors import WorkbenchError
from workbench.patterns import compile_pattern

from PySide6.QtCore import QItemSelectionModel, QSortFilterProxyModel, Qt, Signal
from PySide6.QtGui import QStandardItem, QStandardItemModel
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QLineEdit, QTreeView, QVBoxLayout, QWidget, QLabel

from .format import fmt_count, fmt_shape, plural
from .theme import mono_font

NAME_ROLE = Qt.ItemDataRole.UserRole + 1
SORT_ROLE = Qt.ItemDataRole.UserRole + 2
COLUMNS = ("Tensor", "Shape", "Params", "DType", "Role")


def _group_key(group: str) -> tuple:
    if group == "embeddings":
        return (0, 0)
    if group.startswith("layer "):
        return (1, int(group.split()[1]))
    return (2, 0) if group == "head" else (3, 0)


def _short(name: str, group: str) -> str:
    """The name inside its group: 'model.layers.3.mlp.up_proj.weight' -> 'mlp.up_proj.weight'."""
    short = name[:-7] if name.endswith(".weight") else name
    if group.startswith("layer "):
        m = re.search(r"(?:^|\.)(?:layers|layer|h|blk|blocks|block)\.\d+\.(.*)$", short)
        if m:
            return m.group(1)
    return short


class _Filter(QSortFilterProxyModel):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.setRecursiveFilteringEnabled(True)
        self.setSortRole(SORT_ROLE)
        self._pattern = None
        self.error = ""

    def set_text(self, text: str) -> None:
        text = text.strip()
        self.error = ""
        staged = hasattr(self, "beginFilterChange")
        if staged:
            self.beginFilterChange()
        if not text:
            self._pattern = None
        elif text.startswith("re:"):
            try:  # RE2: a pattern cannot make the GUI thread backtrack for minutes
                self._pattern = compile_pattern(text[3:], ignore_case=True)
            except WorkbenchError as exc:
                self.error = str(exc)
                self._pattern = None
        else:
            self._pattern = re.compile(re.escape(text), re.IGNORECASE)
        if staged:
            self.endFilterChange(QSortFilterProxyModel.Direction.Rows)
        else:
            self.invalidateRowsFilter()

    def filterAcceptsRow(self, row, parent) -> bool:
        if self._pattern is None:
            return True
        idx = self.sourceModel().index(row, 0, parent)
        name = idx.data(NAME_ROLE)
        return bool(name) and bool(self._pattern.search(name))


class LayerBrowser(QWidget):
    """Emits `activated(name)` when the current tensor changes."""

    activated = Signal(str)

    def __init__(self, doc, parent=None):
        super().__init__(parent)
        self.doc = doc
        self.setObjectName("LayerBrowser")
        self.filter_edit = QLineEdit(placeholderText="Filter tensors (text or re:pattern)")
        self.filter_edit.setClearButtonEnabled(True)
        self.filter_error = QLabel()
        self.filter_error.setObjectName("FilterError")
        self.filter_error.hide()
        self.model = QStandardItemModel(0, len(COLUMNS), self)
        self.model.setHorizontalHeaderLabels(COLUMNS)
        self.proxy = _Filter(self)
        self.proxy.setSourceModel(self.model)
        self.view = QTreeView()
        self.view.setModel(self.proxy)
        self.view.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.view.setUniformRowHeights(True)
        self.view.setAlternatingRowColors(True)
        self.view.setSortingEnabled(False)
        self.view.setDragEnabled(False)
        hdr = self.view.header()
        hdr.setStretchLastSection(False)
        hdr.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        hdr.setMinimumSectionSize(36)
        for c in range(1, len(COLUMNS)):
            hdr.setSectionResizeMode(c, QHeaderView.ResizeMode.ResizeToContents)
        self.view.setIndentation(12)
        self.view.setTextElideMode(Qt.TextElideMode.ElideRight)
        from .format import tail_elide_delegate
        self.view.setItemDelegateForColumn(0, tail_elide_delegate(self.view))
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(4)
        title = QLabel("Layers")
        title.setObjectName("PanelTitle")
        lay.addWidget(title)
        lay.addWidget(self.filter_edit)
        lay.addWidget(self.filter_error)
        lay.addWidget(self.view, 1)
        self.filter_edit.textChanged.connect(self._filter)
        self.view.selectionModel().currentChanged.connect(self._current)
        doc.modelChanged.connect(self.rebuild)
        doc.currentChanged.connect(self.show_tensor)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        # narrow panel: the role column gives its room to the names (roles stay in the table)
        self.view.setColumnHidden(4, self.width() < 540)

    def rebuild(self) -> None:
        self.model.removeRows(0, self.model.rowCount())
        m = self.doc.model
        if m is None:
            return
        groups: dict[str, list] = {}
        for info in m.tensors.values():
            groups.setdefault(info.group, []).append(info)
        mono = mono_font()
        for g in sorted(groups, key=_group_key):
            infos = groups[g]
            head = [QStandardItem(g), QStandardItem(plural(len(infos), "tensor")),
                    QStandardItem(fmt_count(sum(i.numel for i in infos))), QStandardItem(""),
                    QStandardItem("")]
            head[0].setData(_group_key(g)[0] * 10000 + _group_key(g)[1], SORT_ROLE)
            for it in head:
                it.setEditable(False)
                it.setSelectable(False)
            head[2].setFont(mono)
            for info in infos:
                row = [QStandardItem(_short(info.name, g)), QStandardItem(fmt_shape(info.shape)),
                       QStandardItem(fmt_count(info.numel)),
                       QStandardItem(info.display_dtype), QStandardItem(info.role)]
                for it in row:
                    it.setEditable(False)
                    it.setData(info.name, NAME_ROLE)
                    it.setToolTip(info.name)
                row[1].setFont(mono)
                row[2].setFont(mono)
                row[2].setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                head[0].appendRow(row)
            self.model.appendRow(head)
        self.view.expandAll()

    def _filter(self, text: str) -> None:
        self.proxy.set_text(text)
        self.filter_error.setText(self.proxy.error)
        self.filter_error.setVisible(bool(self.proxy.error))
        self.view.expandAll()

    def _current(self, current, _previous) -> None:
        name = current.data(NAME_ROLE) if current.isValid() else None
        if name:
            self.activated.emit(name)

    def _find(self, name: str):
        for g in range(self.model.rowCount()):
            head = self.model.item(g, 0)
            for r in range(head.rowCount()):
                if head.child(r, 0).data(NAME_ROLE) == name:
                    return self.proxy.mapFromSource(head.child(r, 0).index())
        return None

    def show_tensor(self, name: str) -> None:
        """Make `name` the current row (without re-emitting when already current)."""
        cur = self.view.currentIndex()
        if not name or (cur.isValid() and cur.data(NAME_ROLE) == name):
            return
        idx = self._find(name)
        if idx is not None and idx.isValid():
            self.view.selectionModel().setCurrentIndex(
                idx, QItemSelectionModel.SelectionFlag.ClearAndSelect
                | QItemSelectionModel.SelectionFlag.Rows)
            self.view.scrollTo(idx)

    def selected_names(self) -> list[str]:
        names = []
        for idx in self.view.selectionModel().selectedRows(0):
            n = idx.data(NAME_ROLE)
            if n and n not in names:
                names.append(n)
        return names

    def state(self) -> dict:
        return {"filter": self.filter_edit.text()}

    def restore(self, state: dict) -> None:
        self.filter_edit.setText(state.get("filter", ""))

"""The layer browser: tensors grouped by block, with a substring / `re:` filter. A block's
mixture-of-experts tensors sit in one expandable "experts" row: one row per projection
(gate / up / down) holding that projection's per-expert tensors, or the merged 3-D tensor
(GGUF); selecting a projection row or a merged tensor shows the spread across experts."""

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
GROUP_ROLE = Qt.ItemDataRole.UserRole + 3   # an expert group key ('layer 5 experts down')
_PROJ_ORDER = {"gate": 0, "up": 1, "gate_up": 2, "down": 3}
COLUMNS = ("Tensor", "Shape", "Params", "DType", "Role")


def _group_key(group: str) -> tuple:
    if group == "embeddings":
        return (0, 0)
    if group.startswith("layer "):
        return (1, int(group.split()[1]))
    return (2, 0) if group == "head" else (3, 0)


def _expert_label(name: str) -> str:
    """'mlp.experts.3.down_proj.weight' -> 'expert 3 · down_proj'."""
    from workbench.catalog import expert_index
    e = expert_index(name)
    tail = name[:-7] if name.endswith(".weight") else name
    return f"expert {e} · {tail.rsplit('.', 1)[-1]}" if e is not None else tail


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
    #: an expert group row became current: its key ('layer 5 experts down')
    groupActivated = Signal(str)

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
            experts = [i for i in infos if i.role == "expert"]
            exp_row = None
            for info in infos:
                if info.role == "expert":
                    if exp_row is None:
                        exp_row = self._experts_row(experts, g, mono)
                        head[0].appendRow(exp_row)
                    continue
                head[0].appendRow(self._tensor_row(info, _short(info.name, g), mono))
            self.model.appendRow(head)
        self.view.expandAll()
        self._collapse_experts()

    def _tensor_row(self, info, label: str, mono) -> list:
        row = [QStandardItem(label), QStandardItem(fmt_shape(info.shape)),
               QStandardItem(fmt_count(info.numel)),
               QStandardItem(info.display_dtype), QStandardItem(info.role)]
        for it in row:
            it.setEditable(False)
            it.setData(info.name, NAME_ROLE)
            it.setToolTip(info.name)
            if info.merged_experts:
                it.setData(info.expert_group, GROUP_ROLE)
        row[1].setFont(mono)
        row[2].setFont(mono)
        row[2].setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return row

    def _experts_row(self, experts, g: str, mono) -> list:
        """One expandable row for a block's routed experts: a child per projection."""
        groups: dict[str, list] = {}
        for info in experts:
            groups.setdefault(info.expert_group, []).append(info)
        n_exp = max(sum(i.n_experts for i in members) for members in groups.values())
        row = [QStandardItem(f"experts ×{n_exp}"), QStandardItem(plural(len(experts), "tensor")),
               QStandardItem(fmt_count(sum(i.numel for i in experts))), QStandardItem(""),
               QStandardItem("expert")]
        for it in row:
            it.setEditable(False)
            it.setSelectable(False)
            it.setData(True, GROUP_ROLE + 1)   # marks the experts row (kept collapsed)
        row[2].setFont(mono)

        def order(key):
            return _PROJ_ORDER.get(key.rsplit(" ", 1)[-1], 9)
        for key in sorted(groups, key=order):
            members = groups[key]
            if len(members) == 1 and members[0].merged_experts:
                row[0].appendRow(self._tensor_row(members[0], _short(members[0].name, g), mono))
                continue
            members.sort(key=lambda i: i.expert if i.expert is not None else -1)
            proj = key.rsplit(" ", 1)[-1]
            sub = [QStandardItem(f"{proj} · {len(members)} experts"),
                   QStandardItem(fmt_shape(members[0].shape)),
                   QStandardItem(fmt_count(sum(i.numel for i in members))),
                   QStandardItem(members[0].display_dtype), QStandardItem("expert")]
            for it in sub:
                it.setEditable(False)
                it.setData(key, GROUP_ROLE)
                it.setToolTip(f"{key}: {len(members)} tensors (one llama.cpp tensor)")
            sub[1].setFont(mono)
            sub[2].setFont(mono)
            for info in members:
                sub[0].appendRow(self._tensor_row(info, _expert_label(info.name), mono))
            row[0].appendRow(sub)
        return row

    def _collapse_experts(self) -> None:
        """Expert rows start closed: a 128-expert layer would fill the panel."""
        def walk(parent):
            for r in range(self.proxy.rowCount(parent)):
                idx = self.proxy.index(r, 0, parent)
                if idx.data(GROUP_ROLE + 1):
                    self.view.collapse(idx)
                elif idx.data(GROUP_ROLE) and not idx.data(NAME_ROLE):
                    self.view.collapse(idx)
                else:
                    walk(idx)
        walk(self.view.rootIndex())

    def _filter(self, text: str) -> None:
        self.proxy.set_text(text)
        self.filter_error.setText(self.proxy.error)
        self.filter_error.setVisible(bool(self.proxy.error))
        self.view.expandAll()
        if not self.proxy._pattern:
            self._collapse_experts()

    def _current(self, current, _previous) -> None:
        name = current.data(NAME_ROLE) if current.isValid() else None
        if name:
            self.activated.emit(name)
            if current.data(GROUP_ROLE):   # a merged expert tensor: its spread too
                self.groupActivated.emit(current.data(GROUP_ROLE))
        elif current.isValid() and current.data(GROUP_ROLE):
            self.groupActivated.emit(current.data(GROUP_ROLE))

    def _find(self, name: str):
        def walk(item):
            for r in range(item.rowCount()):
                child = item.child(r, 0)
                if child.data(NAME_ROLE) == name:
                    return child
                found = walk(child) if child.hasChildren() else None
                if found is not None:
                    return found
            return None
        for g in range(self.model.rowCount()):
            found = walk(self.model.item(g, 0))
            if found is not None:
                return self.proxy.mapFromSource(found.index())
        return None

    def group_names(self, key: str) -> list[str]:
        """The tensor names under an expert group row."""
        def walk(item):
            out = []
            for r in range(item.rowCount()):
                child = item.child(r, 0)
                if child.data(GROUP_ROLE) == key and child.data(NAME_ROLE):
                    out.append(child.data(NAME_ROLE))
                elif child.data(GROUP_ROLE) == key:
                    out += [child.child(i, 0).data(NAME_ROLE) for i in range(child.rowCount())]
                elif child.hasChildren():
                    out += walk(child)
            return out
        out = []
        for g in range(self.model.rowCount()):
            out += walk(self.model.item(g, 0))
        return out

    def show_tensor(self, name: str) -> None:
        """Make `name` the current row (without re-emitting when already current)."""
        cur = self.view.currentIndex()
        if not name or (cur.isValid() and cur.data(NAME_ROLE) == name):
            return
        idx = self._find(name)
        if idx is not None and idx.isValid():
            parent = idx.parent()
            while parent.isValid():   # inside a collapsed experts row: open it
                self.view.expand(parent)
                parent = parent.parent()
            self.view.selectionModel().setCurrentIndex(
                idx, QItemSelectionModel.SelectionFlag.ClearAndSelect
                | QItemSelectionModel.SelectionFlag.Rows)
            self.view.scrollTo(idx)

    def show_group(self, key: str) -> bool:
        """Make the row of expert group `key` current (emits groupActivated)."""
        def walk(parent):
            for r in range(self.proxy.rowCount(parent)):
                idx = self.proxy.index(r, 0, parent)
                if idx.data(GROUP_ROLE) == key:
                    return idx
                found = walk(idx)
                if found is not None:
                    return found
            return None
        idx = walk(self.view.rootIndex())
        if idx is None:
            return False
        parent = idx.parent()
        while parent.isValid():
            self.view.expand(parent)
            parent = parent.parent()
        self.view.selectionModel().setCurrentIndex(
            idx, QItemSelectionModel.SelectionFlag.ClearAndSelect
            | QItemSelectionModel.SelectionFlag.Rows)
        self.view.scrollTo(idx)
        return True

    def selected_names(self) -> list[str]:
        names = []
        for idx in self.view.selectionModel().selectedRows(0):
            n = idx.data(NAME_ROLE)
            group = [n] if n else (self.group_names(idx.data(GROUP_ROLE))
                                   if idx.data(GROUP_ROLE) else [])
            for m in group:   # an expert group row stands for every expert under it
                if m and m not in names:
                    names.append(m)
        return names

    def state(self) -> dict:
        return {"filter": self.filter_edit.text()}

    def restore(self, state: dict) -> None:
        self.filter_edit.setText(state.get("filter", ""))

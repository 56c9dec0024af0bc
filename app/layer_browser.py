"""The layer browser: tensors grouped by block, with a substring / `re:` filter. A block's
mixture-of-experts tensors sit in one expandable "experts" row: one row per projection
(gate / up / down) holding that projection's per-expert tensors, or the merged 3-D tensor
(GGUF); selecting a projection row or a merged tensor shows the spread across experts.
The tree's model is in :mod:`app.layer_tree`."""

from __future__ import annotations

from PySide6.QtCore import QItemSelectionModel, QModelIndex, Qt, Signal
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QLineEdit, QTreeView, QVBoxLayout, QWidget, QLabel

from .layer_tree import _EXPERTS, _PROJ, COLUMNS, GROUP_ROLE, NAME_ROLE, TreeModel


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
        # one model, filtering itself (`proxy` is the same object: the view's model)
        self.model = self.proxy = TreeModel(self)
        self._quiet = False       # True while the current row is restored, not chosen
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
        # columns fitted to the rows on screen, not to the first 1,000 rows of the tree (each
        # of those a few Python calls per column: 100 ms per filter keystroke on a MoE catalog)
        hdr.setResizeContentsPrecision(0)
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
        self.view.expanded.connect(self._expanded)
        self.view.selectionModel().currentChanged.connect(self._current)
        doc.modelChanged.connect(self.rebuild)
        doc.currentChanged.connect(self.show_tensor)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        # narrow panel: the role column gives its room to the names (roles stay in the table)
        self.view.setColumnHidden(4, self.width() < 540)

    def rebuild(self) -> None:
        self.model.build(self.doc.model)
        if self.model.visible is not None or self.filter_edit.text().strip():
            self._filter(self.filter_edit.text())
        else:
            self._expand()

    def _expand(self) -> None:
        """Without a filter: every group open, the experts rows closed (a 128-expert layer would
        fill the panel); with one: every row that holds a match open."""
        m = self.model
        if m.visible is None:
            for i in m.nodes[0].children:
                self.view.expand(m.index_of(i))
            return
        for i, kids in m.visible.items():
            if i > 0 and kids:
                self.view.expand(m.index_of(i))

    def _expanded(self, index) -> None:
        """An experts row opened: its projection rows open too (each lists its experts)."""
        m = self.model
        if index.isValid() and m.nodes[index.internalId()].kind == _EXPERTS:
            for c in m.kids(index.internalId()):
                if m.nodes[c].kind == _PROJ:
                    self.view.expand(m.index_of(c))

    def _filter(self, text: str) -> None:
        self.model.set_filter(text)
        self.filter_error.setText(self.model.error)
        self.filter_error.setVisible(bool(self.model.error))
        self._expand()
        self._keep_current()

    def _keep_current(self) -> None:
        """After a filter is typed or cleared (the model's rows reset): the document's current
        tensor is the current row again, its experts row open and in view, when the rows hold
        it. Done here, in the same pass as the filter's own layout and repaint, rather than by
        the next selection (which would re-open the row and repaint the tree twice)."""
        name = self.doc.current
        idx = self._find(name) if name else None
        if idx is None or not idx.isValid():
            return
        self._quiet = True            # the same tensor: nothing to tell the window
        try:
            self._make_current(idx)
        finally:
            self._quiet = False

    def _current(self, current, _previous) -> None:
        if self._quiet:
            return
        name = current.data(NAME_ROLE) if current.isValid() else None
        if name:
            self.activated.emit(name)
            if current.data(GROUP_ROLE):   # a merged expert tensor: its spread too
                self.groupActivated.emit(current.data(GROUP_ROLE))
        elif current.isValid() and current.data(GROUP_ROLE):
            self.groupActivated.emit(current.data(GROUP_ROLE))

    def _find(self, name: str):
        i = self.model.node_of(name)
        if i is None:
            return None
        return self.model.index_of(i)

    def group_names(self, key: str) -> list[str]:
        """The tensor names under an expert group row."""
        return self.model.group_members(key)

    def show_tensor(self, name: str) -> None:
        """Make `name` the current row (without re-emitting when already current)."""
        cur = self.view.currentIndex()
        if not name or (cur.isValid() and cur.data(NAME_ROLE) == name):
            return
        idx = self._find(name)
        if idx is not None and idx.isValid():
            self._make_current(idx)

    def _make_current(self, idx) -> None:
        parent = idx.parent()
        while parent.isValid():   # inside a collapsed experts row: open it
            if not self.view.isExpanded(parent):
                self.view.expand(parent)
            parent = parent.parent()
        self.view.selectionModel().setCurrentIndex(
            idx, QItemSelectionModel.SelectionFlag.ClearAndSelect
            | QItemSelectionModel.SelectionFlag.Rows)
        self.view.scrollTo(idx)

    def show_group(self, key: str) -> bool:
        """Make the row of expert group `key` current (emits groupActivated)."""
        m = self.model
        i = m.group_nodes.get(key)
        if i is not None and m.nodes[i].kind == _EXPERTS:
            m._children(i)
            i = m.group_nodes.get(key)
        idx = m.index_of(i) if i is not None else QModelIndex()
        if not idx.isValid():
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

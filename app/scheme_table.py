"""The scheme table view: sortable, a scheme editor per row, bulk assignment and rules."""

from __future__ import annotations

import re

from workbench.core.errors import WorkbenchError
from workbench.core.patterns import compile_pattern

from PySide6.QtCore import (QEvent, QItemSelection, QItemSelectionModel, QSortFilterProxyModel,
                            Qt, QTimer, Signal)
from PySide6.QtWidgets import (QAbstractItemView, QComboBox, QDialog, QDialogButtonBox,
                               QFormLayout, QHBoxLayout, QHeaderView, QLabel, QLineEdit,
                               QMenu, QPushButton, QStyledItemDelegate, QTableView,
                               QToolButton, QVBoxLayout, QWidget)

from workbench.api.plans import KEEP
from workbench.api.plans import list_schemes

from .commands import schemes_for, unavailable_for
from .table_columns import ColumnFit
from .table_model import C_METHOD, C_NAME, C_SCHEME, NAME_ROLE, SORT_ROLE, SchemeTableModel


def fit_editor(editor, rect) -> None:
    """Place a cell's editor, never shorter than it needs: a row-high combo clipped its text's
    bottom ("q4_0" read "q4 0"); a taller editor is centred on the row."""
    need = editor.sizeHint().height()
    if need > rect.height():
        rect = rect.adjusted(0, -((need - rect.height()) // 2), 0,
                             (need - rect.height() + 1) // 2)
    editor.setGeometry(rect)


class SchemeDelegate(QStyledItemDelegate):
    """An editable combo box listing only the schemes that can take the row's tensor, grouped
    by family, each with its bits per weight on the tensor and the predicted error (SQNR) as
    soon as the compute thread has it (app.scheme_picker).

    The editor has a text field: typing completes a scheme name, and Ctrl+A selects the
    field's text (it never reaches the table, where it would select every row). Text that
    names no listed scheme changes nothing. Schemes that cannot take the tensor are listed
    greyed with the reason; naming one changes nothing and `refused` says why. One Return
    (or a click in the list) commits."""

    refused = Signal(str)

    def __init__(self, doc, parent=None, predict=None):
        super().__init__(parent)
        self.doc = doc
        self.predict = predict    # predict(name, schemes): evaluate them off the GUI thread
        self._double_clicked = False

    def editorEvent(self, event, model, option, index):
        # the view hands the double-click to the delegate just before it opens the editor:
        # an editor opened by the mouse opens its list too (the keyboard's keeps the text field)
        self._double_clicked = event.type() == QEvent.Type.MouseButtonDblClick
        return super().editorEvent(event, model, option, index)

    def createEditor(self, parent, option, index):
        from .scheme_picker import SchemeCombo, fill
        name = index.data(NAME_ROLE)
        info = self.doc.model.info(name)
        combo = SchemeCombo(self.doc, lambda: name, parent)
        combo.setEditable(True)
        combo.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)
        schemes = schemes_for(info)
        fill(combo, schemes, info, unavailable_for(info))
        combo.setMaxVisibleItems(24)
        # a pick in the list (click or Return) is the edit: commit it at once, not on a
        # second Return
        combo.activated.connect(lambda _i, c=combo: self._commit(c))
        if self.predict is not None:
            combo.on_popup = lambda: self.predict(name, schemes)
            self.predict(name, schemes)
        if self._double_clicked:
            self._double_clicked = False
            QTimer.singleShot(0, combo.showPopup)   # once the view has placed the editor
        return combo

    def _commit(self, editor) -> None:
        if editor.scheme() is None and editor.unavailable() is None:
            return                       # a header, or text naming nothing: keep editing
        self.commitData.emit(editor)
        self.closeEditor.emit(editor, QStyledItemDelegate.EndEditHint.NoHint)

    def updateEditorGeometry(self, editor, option, index):
        fit_editor(editor, option.rect)

    def setEditorData(self, editor, index):
        # Qt calls this again whenever the cell's data changes while the editor is open (a
        # background result arriving): never overwrite what the user is typing
        if editor.property("qw_filled"):
            return
        editor.setProperty("qw_filled", True)
        editor.set_scheme(index.data(Qt.ItemDataRole.EditRole))

    def setModelData(self, editor, model, index):
        text = editor.scheme()
        if text is None:       # not a scheme this tensor can take: say why, change nothing
            why = editor.unavailable()
            if why is not None:
                self.refused.emit(f"{editor.currentText().strip()} is not available for "
                                  f"{index.data(NAME_ROLE)}: {why}")
            return
        if text != index.data(Qt.ItemDataRole.EditRole):
            model.setData(index, text, Qt.ItemDataRole.EditRole)


class MethodDelegate(QStyledItemDelegate):
    """A combo box of the quantization methods (workbench.quant.methods.list_methods)."""

    def createEditor(self, parent, option, index):
        from workbench.api.methods import list_methods
        combo = QComboBox(parent)
        combo.addItems(list_methods())
        return combo

    def updateEditorGeometry(self, editor, option, index):
        fit_editor(editor, option.rect)

    def setEditorData(self, editor, index):
        if editor.property("qw_filled"):
            return                    # as for schemes: keep the user's choice
        editor.setProperty("qw_filled", True)
        editor.setCurrentIndex(max(editor.findText(index.data(Qt.ItemDataRole.EditRole) or ""), 0))

    def setModelData(self, editor, model, index):
        text = editor.currentText()
        if text and text != index.data(Qt.ItemDataRole.EditRole):
            model.setData(index, text, Qt.ItemDataRole.EditRole)


class RuleDialog(QDialog):
    """Add a plan rule: an exact name, a `re:` pattern or a `moe:` selector, and a scheme; shows
    the matches."""

    def __init__(self, doc, match: str = "", parent=None):
        super().__init__(parent)
        self.doc = doc
        self.setWindowTitle("Add rule")
        self.setMinimumWidth(620)
        self.match = QLineEdit(match)
        self.match.setMinimumWidth(420)
        self.match.setToolTip(match)
        from .scheme_picker import SchemeCombo, fill
        self.scheme = SchemeCombo(doc)
        fill(self.scheme, [KEEP] + list_schemes())
        self.scheme.setMaxVisibleItems(24)
        self.scheme.set_scheme("int4-g128")
        self.count = QLabel()
        self.count.setWordWrap(True)
        self.count.setObjectName("Muted")
        form = QFormLayout(self)
        form.addRow("Match (name, re:pattern or moe:selector)", self.match)
        form.addRow("Scheme", self.scheme)
        form.addRow("", self.count)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok
                                   | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)
        self.ok = buttons.button(QDialogButtonBox.StandardButton.Ok)
        self.match.textChanged.connect(self._update)
        self._update()

    def matched(self) -> list[str] | None:
        text = self.match.text().strip()
        if not text:
            return None
        if text.startswith("moe:"):   # workbench.running.moe selectors: experts / shared / router
            from workbench.api.models import parse_selector
            try:
                sel = parse_selector(text)
            except WorkbenchError:
                return None
            return [n for n in self.doc.names() if sel.matches(n)]
        if text.startswith("re:"):
            from workbench.api.models import moe_role
            try:
                pat = compile_pattern(text[3:])
            except WorkbenchError:
                return None
            # a pattern never reaches a router (workbench.quant.plan): not counted
            return [n for n in self.doc.names() if pat.search(n) and moe_role(n) != "router"]
        return [text] if text in self.doc.names() else []

    def matches(self) -> int | None:
        m = self.matched()
        return None if m is None else len(m)

    def _update(self) -> None:
        m = self.matched()
        if m is None:
            self.count.setText("invalid pattern")
        else:
            shown = ", ".join(m[:4]) + (f" … (+{len(m) - 4})" if len(m) > 4 else "")
            self.count.setText(f"matches {len(m)} tensor(s)" + (f": {shown}" if m else ""))
        self.ok.setEnabled(bool(m))


def common_pattern(names, all_names=None) -> str:
    """A short `re:` pattern matching exactly `names` among `all_names` (default: `names`):
    the same tensor kind in every block (e.g. all q_proj) as one stem; several kinds as an
    alternation of their stems with the block number free; an alternation of whole names only
    when nothing shorter matches exactly the same tensors."""
    names = list(names)
    if not names:
        return ""
    universe = list(all_names) if all_names is not None else names
    chosen = set(names)

    def exact(pattern: str) -> bool:
        try:
            rx = re.compile(pattern)
        except re.error:
            return False
        return {n for n in universe if rx.search(n)} == chosen

    # 1. one kind: the tail after the block number, then shorter tails while exact
    tails = {re.sub(r"^.*?\.\d+\.", "", n) for n in names}
    if len(tails) == 1:
        parts = tails.pop().split(".")
        for k in range(1, len(parts) + 1):
            pat = r"(^|\.)" + re.escape(".".join(parts[-k:])) + "$" if k < len(parts) \
                else re.escape(".".join(parts)) + "$"
            if exact(pat):
                return "re:" + (re.escape(".".join(parts[-k:])) + "$" if exact(
                    re.escape(".".join(parts[-k:])) + "$") else pat)
    # 2. several kinds sharing a beginning and/or an end: "P.*S$"
    import os.path
    stems = sorted({re.sub(r"\.\d+\.", ".", n) for n in names})
    tails = sorted({re.sub(r"^.*?\.\d+\.", "", n) for n in names})
    pre_all = os.path.commonprefix(names)
    if len(pre_all) >= 4 and exact("^" + re.escape(pre_all)):
        return "re:^" + re.escape(pre_all)         # e.g. every tensor of one block
    for group in (tails, stems):
        pre = os.path.commonprefix(group)
        suf = os.path.commonprefix([t[::-1] for t in group])[::-1]
        cands = []
        if len(suf) >= 4:
            cands.append(re.escape(suf) + "$")
        if len(pre) >= 4:
            cands.append(re.escape(pre) + ".*" + re.escape(suf) + "$")
            cands.append(r"(^|\.)" + re.escape(pre) + ".*" + re.escape(suf) + "$")
        for pat in cands:
            if exact(pat):
                return "re:" + pat
    # 3. block numbers free, the shortest distinguishing tails
    for k in range(1, 6):
        tails = sorted({".".join(s.split(".")[-k:]) for s in stems})
        pat = "(" + "|".join(re.escape(t) for t in tails) + ")$"
        if len(tails) <= 12 and exact(pat):
            return "re:" + pat
    numbered = sorted({re.sub(r"\.\d+\.", r".\\d+.", re.escape(n).replace(r"\.", ".")
                              .replace(".", r"\.")) for n in names})
    pat = "^(" + "|".join(numbered) + ")$"
    if len(numbered) < len(names) and exact(pat):
        return "re:" + pat
    return "re:^(" + "|".join(re.escape(n) for n in names) + ")$"


class SchemeTable(QWidget):
    """Emits `activated(name)` when the current row changes."""

    activated = Signal(str)

    def __init__(self, doc, push, parent=None):
        super().__init__(parent)
        self.doc = doc
        self.push = push  # push(command_factory_result)
        self.model = SchemeTableModel(doc, on_assign=self.assign, on_method=self.set_method)
        self.model.on_sort = self._sort_requested
        # the view shows the model itself until a sort is asked for (a header click), then the
        # sort proxy: a repaint of the unsorted table makes no call through the proxy (each
        # cell's data there maps its index back into the model: a few Python calls a cell)
        self.proxy = QSortFilterProxyModel(self)
        self.proxy.setSourceModel(self.model)
        self.proxy.setSortRole(SORT_ROLE)
        self.view = QTableView()
        self.view.setObjectName("SchemeTable")
        self.view.setModel(self.model)
        # no sort indicator before sorting is enabled (enabling sorts by the indicator's column)
        self.view.horizontalHeader().setSortIndicator(-1, Qt.SortOrder.AscendingOrder)
        self.view.setSortingEnabled(True)
        self.view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.view.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.delegate = SchemeDelegate(doc, self.view, predict=self._predict)
        self.predict = None       # set by the window: Analyzer.predict(name, schemes)
        self.view.setItemDelegateForColumn(C_SCHEME, self.delegate)
        self.view.setItemDelegateForColumn(C_METHOD, MethodDelegate(self.view))
        from .format import tail_elide_delegate
        self.view.setItemDelegateForColumn(C_NAME, tail_elide_delegate(self.view))
        self.view.setEditTriggers(QAbstractItemView.EditTrigger.DoubleClicked
                                  | QAbstractItemView.EditTrigger.SelectedClicked
                                  | QAbstractItemView.EditTrigger.EditKeyPressed)
        self.view.setAlternatingRowColors(True)
        self.view.setWordWrap(False)
        self.view.verticalHeader().hide()
        self.view.verticalHeader().setDefaultSectionSize(22)
        hdr = self.view.horizontalHeader()
        hdr.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        hdr.setStretchLastSection(True)
        hdr.setMinimumSectionSize(48)
        fm = self.view.horizontalHeader().fontMetrics()
        cell = self.view.fontMetrics()
        # the name keeps a readable width (the table scrolls sideways rather than showing
        # "m…t"); roles fit whole ("embedding", "attn_qkv")
        self.view.setColumnWidth(C_NAME, 250)
        for col, w in zip(range(1, 11), (cell.horizontalAdvance("30522 × 1536") + 16, 68, cell.horizontalAdvance("embedding") + 20,
                                         136, 60, 84, 80, 72, 76, 56)):
            text = self.model.headerData(col, Qt.Orientation.Horizontal)
            self.view.setColumnWidth(col, max(w, fm.horizontalAdvance(text) + 30))
        self.view.setColumnWidth(C_METHOD, max(cell.horizontalAdvance("imatrix") + 20,
                                               fm.horizontalAdvance("Method") + 30))
        self.view.setTextElideMode(Qt.TextElideMode.ElideRight)
        # the name column gives up width (down to NAME_MIN), then the least needed columns are
        # hidden, so that the table never scrolls sideways (app.table_columns); the viewport's
        # resizes refit it
        from .fit_label import FitLabel, never_widens
        self.hidden_label = never_widens(FitLabel(""))
        self.hidden_label.setObjectName("Muted")
        self.columns = ColumnFit(self.view, self.hidden_label, self.NAME_MIN, self.NAME_MAX)
        self.columns.remember_widths()
        self.view.viewport().installEventFilter(self)

        from .scheme_picker import SchemeCombo, fill
        self.assign_combo = SchemeCombo(doc)
        fill(self.assign_combo, [KEEP] + list_schemes())
        self.assign_combo.set_scheme("int4-g128")
        self.assign_combo.setMaxVisibleItems(24)
        self.assign_combo.on_popup = lambda: self._predict(self.doc.current)
        for combo in (self.assign_combo,):
            combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
            combo.setMinimumContentsLength(12)
        self.assign_button = QPushButton("Assign to selection")
        self.assign_button.clicked.connect(self.assign_selection)
        self.default_combo = SchemeCombo(doc)
        fill(self.default_combo, [KEEP] + list_schemes())   # keep: a quantized source's default
        self.default_combo.on_popup = lambda: self._predict(self.doc.current)
        self.default_combo.setMaxVisibleItems(24)
        self.default_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.default_combo.setMinimumContentsLength(12)
        self.default_combo.activated.connect(
            lambda _i: self._set_default(self.default_combo.currentText()))
        self.rule_button = QPushButton("Add rule…")
        self.rule_button.clicked.connect(self.add_rule_dialog)
        self.rules_button = QToolButton()
        self.rules_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.rules_menu = QMenu(self.rules_button)
        self.rules_button.setMenu(self.rules_menu)
        bar = QHBoxLayout()
        bar.setContentsMargins(0, 0, 0, 0)
        bar.addWidget(self.assign_combo)
        bar.addWidget(self.assign_button)
        bar.addSpacing(16)
        bar.addWidget(QLabel("Default"))
        bar.addWidget(self.default_combo)
        bar.addWidget(self.rule_button)
        bar.addWidget(self.rules_button)
        bar.addSpacing(8)
        bar.addWidget(self.hidden_label, 1)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 4, 0, 0)
        lay.setSpacing(4)
        lay.addLayout(bar)
        lay.addWidget(self.view, 1)
        self.view.selectionModel().currentRowChanged.connect(self._current)
        doc.currentChanged.connect(self.show_tensor)
        doc.stateChanged.connect(lambda _n: self._sync_plan())
        doc.modelChanged.connect(self._sync_plan)

    def _predict(self, name, schemes=None):
        if self.predict is not None and name and self.doc.model is not None:
            self.predict(name, schemes)

    # ---- the view's rows: the model's own until sorted, then the sort proxy's ------------
    @property
    def sorted(self) -> bool:
        return self.view.model() is self.proxy

    def view_index(self, row: int, column: int = C_NAME):
        """The view's index of the model's `row` (a tensor) and `column`."""
        idx = self.model.index(row, column)
        return self.proxy.mapFromSource(idx) if self.sorted else idx

    def model_row(self, index) -> int:
        """The model's row (tensor) of one of the view's indexes."""
        return self.proxy.mapToSource(index).row() if self.sorted else index.row()

    NAME_MIN, NAME_MAX = 160, 250

    def eventFilter(self, obj, event) -> bool:
        if event.type() == QEvent.Type.Resize and obj is self.view.viewport():
            self.fit_columns()
        return super().eventFilter(obj, event)

    def fit_columns(self) -> None:
        """Tensor column = what the viewport leaves after the other columns and the Note's
        header (NAME_MIN..NAME_MAX), columns hidden where even that does not fit; the Note,
        the last section, stretches over the rest."""
        self.columns.fit()

    def set_column_shown(self, column: int, on: bool) -> None:
        """Show or hide a column whatever the width (the header's context menu)."""
        self.columns.set_shown(column, on)

    def _sort_requested(self, column: int, order) -> None:
        """The view asked the model itself to sort (a header click): show the sort proxy from
        now on, with the same current row, selection and column widths, and sort it."""
        if column < 0 or self.sorted:
            return
        view, hdr = self.view, self.view.horizontalHeader()
        widths = [view.columnWidth(c) for c in range(self.model.columnCount())]
        natural = dict(self.columns.natural)
        cur = view.currentIndex()
        cur_row, cur_col = (cur.row(), cur.column()) if cur.isValid() else (None, C_NAME)
        rows = sorted({i.row() for i in view.selectionModel().selectedRows()})
        old = view.selectionModel()
        view.setModel(self.proxy)
        old.deleteLater()
        for c, w in enumerate(widths):
            if w > 0:                    # a hidden column's width reads 0: fit_columns sets it
                view.setColumnWidth(c, w)
        self.columns.natural = natural   # the model swap's default widths are not the user's
        self.fit_columns()
        hdr.blockSignals(True)
        hdr.setSortIndicator(column, order)
        hdr.blockSignals(False)
        self.proxy.sort(column, order)
        sm = view.selectionModel()
        sel = QItemSelection()
        for r in rows:
            idx = self.view_index(r)
            sel.select(idx, idx)
        sm.select(sel, QItemSelectionModel.SelectionFlag.Select
                  | QItemSelectionModel.SelectionFlag.Rows)
        if cur_row is not None:
            sm.setCurrentIndex(self.view_index(cur_row, cur_col),
                               QItemSelectionModel.SelectionFlag.NoUpdate)
        sm.currentRowChanged.connect(self._current)

    # ---- edits ------------------------------------------------------------------------------
    def selected_names(self) -> list[str]:
        rows = sorted({self.model_row(i) for i in self.view.selectionModel().selectedRows()})
        return [self.model.name_at(r) for r in rows]

    def assign(self, names, scheme: str) -> None:
        """Assign from an edited cell: to the whole selection when the row is part of it."""
        sel = self.selected_names()
        if len(names) == 1 and names[0] in sel:
            names = sel
        from .commands import assign
        self.push(assign(self.doc, names, scheme))

    def set_method(self, names, method: str) -> None:
        """A method from an edited cell: for the whole selection when the row is part of it."""
        sel = self.selected_names()
        if len(names) == 1 and names[0] in sel:
            names = sel
        from .commands import set_method
        self.push(set_method(self.doc, names, method))

    def assign_selection(self) -> None:
        names = self.selected_names()
        if names:
            from .commands import assign
            self.push(assign(self.doc, names, self.assign_combo.currentText()))

    def _set_default(self, scheme: str) -> None:
        if scheme != self.doc.plan.default:
            from .commands import set_default
            self.push(set_default(self.doc, scheme))

    def add_rule_dialog(self) -> None:
        dlg = RuleDialog(self.doc, common_pattern(self.selected_names(), self.doc.names()), self)
        dlg.scheme.set_scheme(self.assign_combo.currentText())
        if dlg.exec() == QDialog.DialogCode.Accepted:
            from .commands import add_rule
            self.push(add_rule(self.doc, dlg.match.text().strip(), dlg.scheme.currentText()))

    def _remove_rule(self, index: int) -> None:
        from .commands import remove_rule
        self.push(remove_rule(self.doc, index))

    def _sync_plan(self) -> None:
        plan = self.doc.plan
        self.default_combo.set_scheme(plan.default)
        self.rules_menu.clear()
        self.rules_button.setText(f"Rules ({len(plan.rules)})")
        if not plan.rules:
            self.rules_menu.addAction("No rules: every matrix uses the default").setEnabled(False)
        for i, r in enumerate(plan.rules):
            act = self.rules_menu.addAction(f"Remove  {r.match}  →  {r.scheme}")
            act.triggered.connect(lambda _c=False, i=i: self._remove_rule(i))

    # ---- selection ---------------------------------------------------------------------------
    def _current(self, current, _previous) -> None:
        if current.isValid():
            self.activated.emit(self.model.name_at(self.model_row(current)))

    def show_tensor(self, name: str) -> None:
        if not name or self.doc.model is None or name not in self.doc.model.tensors:
            return
        idx = self.view_index(self.model.row_of(name))
        cur = self.view.currentIndex()
        if cur.isValid() and cur.row() == idx.row():
            return
        self.view.selectionModel().setCurrentIndex(
            idx, QItemSelectionModel.SelectionFlag.ClearAndSelect
            | QItemSelectionModel.SelectionFlag.Rows)
        self.view.scrollTo(idx)

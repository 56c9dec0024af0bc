"""The precision tier board: one column per tier, each weight matrix a card in its tier.

Each column is a QListView over a :class:`TierListModel` (a filtered view of the plan; it and
the placement of the cards, :class:`TierPlacement`, are in :mod:`app.tier_placement`).
Dragging cards to another column drops their names as MIME data; the receiving model's
`dropMimeData` pushes a "move to tier" command, and the table, totals and plots follow
through the document's signals.

Tiers can be added ("Add tier…" on the board, or a header's context menu: inserted after
that tier), renamed and removed; each is an undoable command of :mod:`app.commands`.
"""

from __future__ import annotations

from PySide6.QtCore import QItemSelection, QItemSelectionModel, QRect, QSize, Qt
from PySide6.QtGui import QBrush, QColor, QPainter, QPen
from PySide6.QtWidgets import (QAbstractItemView, QComboBox, QDialog, QDialogButtonBox,
                               QFormLayout, QFrame, QHBoxLayout, QLabel, QLineEdit, QListView,
                               QMenu, QPushButton, QStyle, QStyledItemDelegate, QVBoxLayout,
                               QWidget)

from workbench.core.errors import WorkbenchError
from workbench.api.plans import list_schemes

from .format import db_text, fmt_bytes, fmt_shape, plural
from .theme import MONO_FAMILY, UI_FAMILY, sqnr_colour, tier_colour
from .messages import Messages
from .tier_placement import MIME, NAME_ROLE, TierListModel, TierPlacement
from .tiers import Tier, name_problem, on_board, shown_scheme, tier_index, tier_mix


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
        # no width of its own: a card spans the column however narrow (no horizontal scroll)
        return QSize(1, 46)

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
                   p.fontMetrics().elidedText(short, Qt.TextElideMode.ElideMiddle, text_rect.width()))
        f = p.font()
        f.setFamily(MONO_FAMILY)
        f.setBold(False)
        f.setPointSizeF(8)
        p.setFont(f)
        p.setPen(QColor("#8a92a3"))
        # the scheme first: when the card is narrow, the shape is what gets elided
        shown = scheme if scheme != "keep" else "keep " + info.dtype
        line = f"{shown}  {fmt_shape(info.shape).replace(' × ', '×')}"
        bottom = rect.adjusted(10, 0, -6, -4)
        sq = r.error.sqnr_db if r is not None else None
        sq_text = db_text(sq)
        room = bottom.width() - p.fontMetrics().horizontalAdvance(sq_text) - 8
        p.drawText(bottom, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignBottom,
                   p.fontMetrics().elidedText(line, Qt.TextElideMode.ElideRight, room))
        c = sqnr_colour(sq)
        p.setPen(c if c is not None else QColor("#8a92a3"))
        p.drawText(bottom, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignBottom, sq_text)
        p.restore()


class TierList(QListView):
    """A tier's card list; while a drag hovers over it, it is highlighted as the drop target."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.drop_target = False

    def _highlight(self, on: bool) -> None:
        if on != self.drop_target:
            self.drop_target = on
            self.setProperty("dropTarget", on)
            self.setStyleSheet("QListView { border: 2px solid #4c9aff; background: #1d2a40; }"
                               if on else "")

    def dragEnterEvent(self, event) -> None:
        super().dragEnterEvent(event)
        self._highlight(event.mimeData().hasFormat(MIME))

    def dragLeaveEvent(self, event) -> None:
        self._highlight(False)
        super().dragLeaveEvent(event)

    def dropEvent(self, event) -> None:
        self._highlight(False)
        super().dropEvent(event)


class TierColumn(QFrame):
    def __init__(self, doc, tier: int, on_drop, on_scheme, activated, parent=None,
                 placement: TierPlacement | None = None):
        super().__init__(parent)
        self.doc = doc
        self.tier = tier
        self.on_scheme = on_scheme
        self.setObjectName("TierColumn")
        self.board = parent
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
        self.shown = None         # the scheme the box shows (refresh_header)
        self.placement = placement if placement is not None else TierPlacement(doc)
        self.model = TierListModel(doc, tier, on_drop, self.placement, self)
        self.view = TierList()
        self.view.setModel(self.model)
        self.view.setItemDelegate(CardDelegate(doc, tier, self.view))
        self.view.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.view.setDragEnabled(True)
        self.view.setAcceptDrops(True)
        self.view.setDropIndicatorShown(True)
        self.view.setDragDropMode(QAbstractItemView.DragDropMode.DragDrop)
        self.view.setDefaultDropAction(Qt.DropAction.MoveAction)
        self.view.setUniformItemSizes(True)
        self.view.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.view.setObjectName("TierList")
        self.view.selectionModel().currentChanged.connect(
            lambda cur, _p: cur.isValid() and activated(cur.data(NAME_ROLE)))
        # the header (title, scheme, summary) has the tier's context menu
        self.header = QWidget()
        self.header.setObjectName("TierHeader")
        self.header.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.header.customContextMenuRequested.connect(
            lambda pos: self.tier_menu().exec(self.header.mapToGlobal(pos)))
        self.header.setToolTip("Right-click for Add / Rename / Remove tier")
        head = QHBoxLayout()
        head.setContentsMargins(0, 0, 0, 0)
        head.addWidget(self.title)
        head.addStretch(1)
        hl = QVBoxLayout(self.header)
        hl.setContentsMargins(0, 0, 0, 0)
        hl.setSpacing(4)
        hl.addLayout(head)
        hl.addWidget(self.scheme)
        hl.addWidget(self.summary)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 6, 6, 6)
        lay.setSpacing(4)
        lay.addWidget(self.header)
        lay.addWidget(self.view, 1)

    def detach(self) -> None:
        self.model.detach()

    def tier_menu(self) -> QMenu:
        """Add tier after this one / rename / remove (the header's context menu)."""
        menu = QMenu(self)
        name = self.doc.tiers[self.tier].name
        b = self.board
        menu.addAction(f"Add Tier After '{name}'…", lambda: b.add_tier(self.tier))
        menu.addAction(f"Rename Tier '{name}'…", lambda: b.rename_tier(self.tier))
        remove = menu.addAction(f"Remove Tier '{name}'", lambda: b.remove_tier(self.tier))
        remove.setEnabled(len(self.doc.tiers) > 1)
        return menu

    def _scheme_chosen(self) -> None:
        s = self.scheme.currentText()
        if s != self.shown:
            self.on_scheme(self.tier, s)

    def refresh_header(self) -> None:
        t = self.doc.tiers[self.tier]
        colour = tier_colour(self.tier).name()
        self.title.setText(f"<span style='color:{colour}'>■</span>&nbsp; <b>{t.name}</b>")
        # one source for the box and the summary: the scheme the members share, else the
        # tier's own (tiers.shown_scheme); a drop assigns the same
        pl, k = self.placement, self.tier
        schemes = list(pl.schemes[k]) if k < len(pl.schemes) else []
        self.shown = shown_scheme(t, schemes)
        if self.scheme.findText(self.shown) < 0:      # keep, or a scheme the list lacks
            self.scheme.addItem(self.shown)
        self.scheme.setCurrentText(self.shown)
        if self.doc.model is None:
            return
        # the board's running sums (TierPlacement), not a pass over the members
        share = 100.0 * pl.params[k] / max(self.doc.model.total_params, 1)
        mix = tier_mix(Tier(t.name, self.shown, t.min_bits), schemes)
        self.summary.setText(f"{plural(len(pl.names[k]), 'tensor')} · {share:.1f}% of params · "
                             f"{fmt_bytes(pl.bytes[k])}" + (f" · {mix}" if mix else ""))
        self.mix = mix


class TierDialog(QDialog):
    """Asks for a tier's name (and, when adding, its scheme from the scheme registry)."""

    def __init__(self, tiers, title: str, name: str = "", scheme: str | None = None,
                 ignore: int | None = None, parent=None):
        super().__init__(parent)
        self.setWindowTitle(title)
        self.tiers, self.ignore = tuple(tiers), ignore
        self.name = QLineEdit(name)
        self.name.setPlaceholderText("e.g. INT6")
        self.name.setMaxLength(40)
        self.scheme = None
        form = QFormLayout()
        form.addRow("Name", self.name)
        if scheme is not None:
            self.scheme = QComboBox()
            self.scheme.addItems(list_schemes())
            self.scheme.setMaxVisibleItems(24)
            self.scheme.setCurrentText(scheme)
            form.addRow("Scheme", self.scheme)
        self.problem = QLabel()
        self.problem.setObjectName("Muted")
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok
                                        | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        lay = QVBoxLayout(self)
        lay.addLayout(form)
        lay.addWidget(self.problem)
        lay.addWidget(self.buttons)
        self.name.textChanged.connect(self._check)
        self._check()
        self.name.selectAll()

    def _check(self) -> None:
        problem = name_problem(self.tiers, self.name.text(), self.ignore)
        self.problem.setText(problem or "")
        self.buttons.button(QDialogButtonBox.StandardButton.Ok).setEnabled(problem is None)

    def values(self) -> tuple[str, str | None]:
        return self.name.text().strip(), self.scheme.currentText() if self.scheme else None


class TierBoard(QWidget):
    def __init__(self, doc, push, activated, parent=None, messages=None):
        super().__init__(parent)
        self.doc = doc
        self.push = push
        self._user_activated = activated
        # while the board moves cards itself (an edit's new schemes, a rebuild), a column whose
        # current card left it makes a neighbour current: that is not the user's choice, and
        # the document's current tensor stays (a budget applied kept jumping to lm_head)
        self._moving = 0
        self.activated = self._activated
        self.messages = messages or Messages(self)
        self.run_dialog = lambda dialog: dialog.exec()  # tests answer the dialog instead
        self.columns: list[TierColumn] = []
        self.row = QHBoxLayout()
        self.row.setSpacing(8)
        self.note = QLabel()
        self.note.setObjectName("Muted")
        self.note.setWordWrap(True)
        self.add_button = QPushButton("Add Tier…")
        self.add_button.setToolTip("Add a tier after the current tensor's tier")
        self.add_button.clicked.connect(lambda: self.add_tier())
        foot = QHBoxLayout()
        foot.addWidget(self.note, 1)
        foot.addWidget(self.add_button)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 6, 0, 0)
        lay.addLayout(self.row, 1)
        lay.addLayout(foot)
        self.placement = TierPlacement(doc)
        doc.modelChanged.connect(self.rebuild)
        doc.tiersChanged.connect(self._tiers_changed)
        doc.stateChanged.connect(self._update)
        doc.resultsChanged.connect(self._update)

    def _activated(self, name: str) -> None:
        if not self._moving:
            self._user_activated(name)

    def _tiers_changed(self) -> None:
        if len(self.columns) != len(self.doc.tiers):
            self.rebuild()
            return
        self._moving += 1
        try:
            self.placement.rebuild()
        finally:
            self._moving -= 1
        for c in self.columns:
            c.refresh_header()

    def _update(self, names) -> None:
        """Cards of `names` moved or repainted; each changed column's header refreshed once."""
        if len(self.placement.names) != len(self.columns):
            return
        self._moving += 1
        try:
            changed = self.placement.update(names)
        finally:
            self._moving -= 1
        for t in sorted(changed):
            self.columns[t].refresh_header()

    def rebuild(self) -> None:
        self._moving += 1
        try:
            self._rebuild()
        finally:
            self._moving -= 1

    def _rebuild(self) -> None:
        for c in self.columns:
            c.detach()
            c.setParent(None)
            c.deleteLater()
        self.columns = []
        self.placement.models = []
        self.placement.rebuild(reset=False)
        for i in range(len(self.doc.tiers)):
            col = TierColumn(self.doc, i, self.drop, self.set_scheme, self.activated, self,
                             self.placement)
            self.row.addWidget(col, 1)
            self.columns.append(col)
            self.placement.models.append(col.model)
            col.refresh_header()
        if self.doc.model is not None:
            kept = sum(1 for i in self.doc.model.tensors.values() if not on_board(i))
            self.note.setText(f"Drag cards between tiers to assign the tier's scheme. "
                              f"{kept} vectors / integer tensors are kept as stored and not shown.")

    def drop(self, names, tier: int) -> None:
        from .commands import move_to_tier
        shown = self.columns[tier].shown if 0 <= tier < len(self.columns) else None
        self.push(move_to_tier(self.doc, names, tier, shown))
        self.select_cards(tier, names)

    def select_cards(self, tier: int, names) -> None:
        """Select the cards of `names` in column `tier` (the first one current): dragged cards
        stay selected in the column they were dropped on. Names not in that column (a refused
        move) are skipped."""
        if not 0 <= tier < len(self.columns):
            return
        col = self.columns[tier]
        rows = sorted(r for r in (self.placement.row_of(tier, n) for n in names) if r is not None)
        if not rows:
            return
        sel = QItemSelection()
        for r in rows:
            sel.select(col.model.index(r), col.model.index(r))
        sm = col.view.selectionModel()
        sm.select(sel, QItemSelectionModel.SelectionFlag.ClearAndSelect)
        sm.setCurrentIndex(col.model.index(rows[0]), QItemSelectionModel.SelectionFlag.NoUpdate)
        col.view.setFocus()

    def set_scheme(self, tier: int, scheme: str) -> None:
        from .commands import set_tier_scheme
        self.push(set_tier_scheme(self.doc, tier, scheme, list(self.placement.names[tier])))

    # ---- add / rename / remove tiers -----------------------------------------------------------
    def current_tier(self) -> int:
        """The tier of the current tensor when it is a card; else the last tier."""
        name = self.doc.current
        if self.doc.model is not None and name in self.doc.model.tensors:
            info = self.doc.model.info(name)
            if on_board(info):
                return tier_index(self.doc.tiers, self.doc.scheme_of(name), info)
        return len(self.doc.tiers) - 1

    def _push_checked(self, title: str, make) -> bool:
        try:
            command = make()
        except WorkbenchError as exc:
            self.messages.error(title, str(exc))
            return False
        return self.push(command)

    def add_tier(self, after: int | None = None, name: str | None = None,
                 scheme: str | None = None) -> bool:
        """Add a tier after tier `after` (default: the current tier); asks for what is not given."""
        from .commands import add_tier
        after = self.current_tier() if after is None else after
        if name is None or scheme is None:
            used = {t.scheme for t in self.doc.tiers}
            default = scheme or next((s for s in list_schemes() if s not in used),
                                     self.doc.tiers[after].scheme)
            dlg = TierDialog(self.doc.tiers, f"Add tier after '{self.doc.tiers[after].name}'",
                             name or "", default, parent=self)
            if self.run_dialog(dlg) != QDialog.DialogCode.Accepted:
                return False
            name, scheme = dlg.values()
        return self._push_checked("Cannot add tier", lambda: add_tier(self.doc, after, name, scheme))

    def rename_tier(self, index: int | None = None, name: str | None = None) -> bool:
        from .commands import rename_tier
        index = self.current_tier() if index is None else index
        if name is None:
            old = self.doc.tiers[index].name
            dlg = TierDialog(self.doc.tiers, f"Rename tier '{old}'", old, ignore=index, parent=self)
            if self.run_dialog(dlg) != QDialog.DialogCode.Accepted:
                return False
            name, _ = dlg.values()
        return self._push_checked("Cannot rename tier", lambda: rename_tier(self.doc, index, name))

    def remove_tier(self, index: int | None = None) -> bool:
        """Remove a tier (no question: it is undoable); the last tier is refused with a message."""
        from .commands import remove_tier
        index = self.current_tier() if index is None else index
        return self._push_checked("Cannot remove tier", lambda: remove_tier(self.doc, index))

"""The scheme table's columns at the pane's width (issue 49).

The Tensor column gives up width first (NAME_MAX down to NAME_MIN, names abbreviated); when the
other columns still do not fit beside the Note's header, the least needed columns are hidden
one by one (HIDE_ORDER: the dequant throughput, the max error, the role, ...) instead of the
table scrolling sideways (at 1280×800 its SQNR column sat at the right edge). What is hidden is
named above the table; the header's context menu shows or hides any column, and that choice
holds at every width. A wider pane shows the hidden columns again.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMenu

from .table_model import (C_BYTES, C_GBS, C_MAX, C_METHOD, C_NAME, C_NOTE, C_PARAMS, C_REL,
                          C_ROLE, C_SCHEME, C_SHAPE, COLUMNS)

#: hidden first → last when the pane is narrow; the others (Tensor, Scheme, Bits/w, SQNR dB,
#: Note) always stay
HIDE_ORDER = (C_GBS, C_MAX, C_ROLE, C_PARAMS, C_METHOD, C_BYTES, C_REL, C_SHAPE)
ALWAYS = (C_NAME, C_SCHEME, C_NOTE)


class ColumnFit:
    """Fits the columns of `view` (a QTableView over a model with COLUMNS) to its viewport;
    `label` (a FitLabel) names the columns hidden for the width."""

    def __init__(self, view, label, name_min: int, name_max: int):
        self.view, self.label = view, label
        self.name_min, self.name_max = name_min, name_max
        self.natural: dict[int, int] = {}       # each column's width when shown
        self.user: dict[int, bool] = {}         # the user's own show / hide, by column
        self.auto_hidden: list[int] = []
        self._fitting = False
        hdr = view.horizontalHeader()
        hdr.sectionResized.connect(self._resized)
        hdr.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        hdr.customContextMenuRequested.connect(self._menu)

    def remember_widths(self) -> None:
        """Take the header's current widths as the columns' own (after they are set up)."""
        hdr = self.view.horizontalHeader()
        for c in range(len(COLUMNS)):
            if not hdr.isSectionHidden(c) and c not in (C_NAME, C_NOTE):
                self.natural[c] = hdr.sectionSize(c)

    def _resized(self, col: int, _old: int, new: int) -> None:
        if not self._fitting and col not in (C_NAME, C_NOTE) and new > 0:
            self.natural[col] = new            # the user dragged the column's edge

    def note_floor(self) -> int:
        hdr = self.view.horizontalHeader()
        return hdr.fontMetrics().horizontalAdvance(COLUMNS[C_NOTE]) + 30

    def plan(self, width: int) -> list[int]:
        """The columns to hide at a viewport `width`: the user's hidden ones, then HIDE_ORDER's
        until the rest fits beside the narrowest Tensor column and the Note's header."""
        shown = [c for c in range(len(COLUMNS)) if c in ALWAYS or self.user.get(c, True)]
        need = self.name_min + self.note_floor() + sum(
            self.natural.get(c, 0) for c in shown if c not in (C_NAME, C_NOTE))
        auto = []
        for c in HIDE_ORDER:
            if need <= width:
                break
            if c in shown and c not in self.user:
                shown.remove(c)
                need -= self.natural.get(c, 0)
                auto.append(c)
        self.auto_hidden = auto
        return [c for c in range(len(COLUMNS)) if c not in shown]

    def fit(self) -> None:
        view, hdr = self.view, self.view.horizontalHeader()
        width = view.viewport().width()
        hidden = set(self.plan(width))
        self._fitting = True
        try:
            for c in range(len(COLUMNS)):
                if hdr.isSectionHidden(c) != (c in hidden):
                    hdr.setSectionHidden(c, c in hidden)
                if c not in hidden and c in self.natural and hdr.sectionSize(c) != self.natural[c]:
                    hdr.resizeSection(c, self.natural[c])
            others = sum(hdr.sectionSize(c) for c in range(hdr.count())
                         if c not in (C_NAME, C_NOTE) and not hdr.isSectionHidden(c))
            note = self.note_floor()
            hdr.resizeSection(C_NOTE, note)  # its floor when stretched (else the default 100 px)
            room = width - others - note
            hdr.resizeSection(C_NAME, max(self.name_min, min(self.name_max, room)))
        finally:
            self._fitting = False
        self._show_label()

    def _show_label(self) -> None:
        names = [COLUMNS[c] for c in self.auto_hidden]
        if not names:
            self.label.setText("")
            self.label.setToolTip("")
            return
        cols = ", ".join(names)
        self.label.set_forms([f"hidden at this width: {cols}", f"hidden: {cols}",
                              f"{len(names)} columns hidden"])
        self.label.setToolTip(f"Columns hidden to fit the table's width: {cols}. A wider "
                              "window shows them again; right-click a column header to show "
                              "or hide any column.")

    def set_shown(self, col: int, on: bool) -> None:
        """The user's choice for `col`, kept at every width."""
        if col in ALWAYS:
            return
        self.user[col] = bool(on)
        self.fit()

    def _menu(self, pos) -> None:
        hdr = self.view.horizontalHeader()
        menu = QMenu(hdr)
        for c, name in enumerate(COLUMNS):
            if c in ALWAYS:
                continue
            act = menu.addAction(name + ("  (hidden at this width)" if c in self.auto_hidden else ""))
            act.setCheckable(True)
            act.setChecked(not hdr.isSectionHidden(c))
            act.toggled.connect(lambda on, c=c: self.set_shown(c, on))
        menu.exec(hdr.mapToGlobal(pos))

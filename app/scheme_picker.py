"""The scheme picker: schemes grouped by family (workbench.planning.scheme_choice), each entry with its
bits per weight on the tensor and, once the compute thread has evaluated it, the predicted
error (SQNR) of the selected tensor under it.

Items keep the bare scheme name as their text (so typing completes a name and
`findText(scheme)` works); the family headers are disabled items without a scheme; the popup's
delegate draws the figures beside the name.
"""

from __future__ import annotations

import math

from PySide6.QtCore import QEvent, Qt
from PySide6.QtGui import QBrush, QColor, QFont, QStandardItem, QStandardItemModel
from PySide6.QtWidgets import QComboBox, QStyledItemDelegate

from workbench.api.choices import bits_per_weight, grouped

from .theme import MUTED, mono_font

SCHEME_ROLE = Qt.ItemDataRole.UserRole + 40
BPW_ROLE = Qt.ItemDataRole.UserRole + 41
UNAVAILABLE_ROLE = Qt.ItemDataRole.UserRole + 42   # why a listed scheme cannot take the tensor


def fill(combo: QComboBox, schemes, info=None, unavailable: dict | None = None) -> None:
    """Replace the combo's items by `schemes` grouped by family (headers are not choosable);
    with `info`, each entry carries its bits per weight on that tensor. `unavailable`
    ({scheme: reason}): listed too, in their families, greyed and not choosable, with the
    reason (a typed name of one says why instead of picking another)."""
    model = QStandardItemModel(combo)
    bold = QFont(combo.font())
    bold.setBold(True)
    unavailable = unavailable or {}
    for family, names in grouped(list(schemes) + list(unavailable)):
        head = QStandardItem(f"— {family} —")
        head.setFlags(Qt.ItemFlag.NoItemFlags)
        head.setFont(bold)
        head.setForeground(QBrush(QColor(MUTED)))
        model.appendRow(head)
        for s in names:
            it = QStandardItem(s)
            it.setData(s, SCHEME_ROLE)
            if s in unavailable:
                it.setData(unavailable[s], UNAVAILABLE_ROLE)
                it.setFlags(Qt.ItemFlag.NoItemFlags)
                it.setForeground(QBrush(QColor(MUTED)))
                it.setToolTip(f"{s}: not available for this tensor: {unavailable[s]}")
                model.appendRow(it)
                continue
            if info is not None:
                bpw = bits_per_weight(s, info)
                it.setData(bpw, BPW_ROLE)
                it.setToolTip(f"{s}: {bpw:.3f} bits/weight on this tensor ({family})")
            model.appendRow(it)
    combo.setModel(model)


def scheme_at(combo: QComboBox, i: int) -> str | None:
    return combo.itemData(i, SCHEME_ROLE) if 0 <= i < combo.count() else None


def find_scheme(combo: QComboBox, scheme: str) -> int:
    for i in range(combo.count()):
        if combo.itemData(i, SCHEME_ROLE) == scheme:
            return i
    return -1


def entry_text(scheme: str, bpw: float | None, sqnr: float | None, pending: bool) -> str:
    """'q4_k            4.500 b/w   27.31 dB' — what one popup row shows."""
    b = "" if bpw is None or math.isnan(bpw) else f"{bpw:6.3f} b/w"
    if sqnr is None:
        e = "    … dB" if pending else ""
    elif math.isinf(sqnr):
        e = "   exact"
    else:
        e = f"{sqnr:6.2f} dB"
    return f"{scheme:<18} {b:>10} {e:>9}"


class PickerDelegate(QStyledItemDelegate):
    """Draws 'name  bits/w  SQNR' in the popup; the SQNR of `tensor()` under each scheme comes
    from the document's results (None: not evaluated yet)."""

    def __init__(self, doc, tensor, parent=None):
        super().__init__(parent)
        self.doc = doc
        self.tensor = tensor          # callable -> the tensor name the figures are for
        self._mono = mono_font()

    def initStyleOption(self, option, index):
        super().initStyleOption(option, index)
        scheme = index.data(SCHEME_ROLE)
        if scheme is None:
            return
        why = index.data(UNAVAILABLE_ROLE)
        if why is not None:
            option.text = f"{scheme:<18} unavailable: {why}"
            option.font = self._mono
            return
        name = self.tensor()
        r = self.doc.result_for(name, scheme) if name and self.doc.model is not None else None
        bpw = index.data(BPW_ROLE)
        if bpw is None and name and self.doc.model is not None:
            bpw = bits_per_weight(scheme, self.doc.model.info(name))
        if r is not None and r.params:
            bpw = 8.0 * r.bytes / r.params
        option.text = entry_text(scheme, bpw, None if r is None else r.error.sqnr_db,
                                 pending=bool(name))
        option.font = self._mono


class SchemeCombo(QComboBox):
    """A grouped scheme combo; `on_popup()` is called just before the list opens (the picker
    asks the compute thread for the figures it lacks)."""

    def __init__(self, doc, tensor=None, parent=None):
        super().__init__(parent)
        self.doc = doc
        self.on_popup = None
        self.picker = PickerDelegate(doc, tensor or (lambda: doc.current), self)
        self.setItemDelegate(self.picker)
        doc.resultAdded.connect(self._result)

    def setEditable(self, editable: bool) -> None:
        super().setEditable(editable)
        if editable:
            # a double-click in the text field opens the grouped list (not only Alt+Down)
            self.lineEdit().installEventFilter(self)

    def eventFilter(self, obj, event) -> bool:
        if (event.type() == QEvent.Type.MouseButtonDblClick and obj is self.lineEdit()
                and not self.view().isVisible()):
            self.showPopup()
            return True
        if (event.type() == QEvent.Type.KeyPress and obj is self.view() and self.isEditable()
                and self.view().isVisible() and _typed(event)):
            # typing with the list open types the name (the list's own search would jump to
            # the nearest choosable entry: "q4_k" picked q4_0 where q4_k is unavailable)
            self.hidePopup()
            edit = self.lineEdit()
            edit.setFocus()
            edit.selectAll()
            edit.insert(event.text())
            return True
        return super().eventFilter(obj, event)

    def _result(self, name, _scheme) -> None:
        if name == self.picker.tensor() and self.view().isVisible():
            self.view().viewport().update()

    def showPopup(self) -> None:
        if self.isEditable():
            self.view().installEventFilter(self)
        if self.on_popup is not None:
            self.on_popup()
        view = self.view()
        fm = view.fontMetrics()
        view.setMinimumWidth(max(self.width(), fm.horizontalAdvance("x" * 42) + 40))
        super().showPopup()

    def set_scheme(self, scheme: str) -> None:
        i = find_scheme(self, scheme)
        if i >= 0:
            self.setCurrentIndex(i)
        elif self.isEditable():
            self.setEditText(scheme)

    def scheme(self) -> str | None:
        """The chosen scheme (None: a header, an unavailable scheme or text naming no listed
        scheme)."""
        text = self.currentText().strip()
        i = find_scheme(self, text)
        return text if i >= 0 and self.itemData(i, UNAVAILABLE_ROLE) is None else None

    def unavailable(self) -> str | None:
        """Why the typed scheme cannot take the tensor (None: it can, or it names none)."""
        i = find_scheme(self, self.currentText().strip())
        return self.itemData(i, UNAVAILABLE_ROLE) if i >= 0 else None


def _typed(event) -> bool:
    """A key press that types a character of a scheme name (not navigation or Return)."""
    text = event.text()
    return bool(text) and text.isprintable() and not event.modifiers() & (
        Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.AltModifier)

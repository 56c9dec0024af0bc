"""A one-line label that shows the longest of its forms that fits its width.

`text()` stays the fullest form (what tests and copy read; the tooltip can carry it too);
only the painting picks a shorter form, or the shortest elided on the right, when the label is
narrow — a right-aligned label in a narrow window was clipped mid-word ("nsors · 39 tensors").
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import QLabel, QProgressBar, QSizePolicy, QStyle, QStyleOption


class FitLabel(QLabel):
    def __init__(self, text: str = "", parent=None):
        super().__init__(text, parent)
        self._forms: list[str] = [text]

    def set_forms(self, forms: list[str]) -> None:
        """The forms from the fullest to the shortest; shows the first that fits."""
        forms = [f for f in forms if f is not None] or [""]
        if forms == getattr(self, "_forms", None) and self.text() == forms[0]:
            return      # unchanged: no repaint
        self._forms = list(forms)
        if self.text() != forms[0]:
            super().setText(forms[0])
        self.update()

    def setText(self, text: str) -> None:      # noqa: N802 - Qt's name
        self._forms = [text]
        super().setText(text)

    def shown_text(self) -> str:
        """The form painted at the current width (word-wrapped: the whole text, on as many
        lines as it needs)."""
        if self.wordWrap():
            return self.text()
        self.ensurePolished()
        fm = self.fontMetrics()
        room = max(self.contentsRect().width() - 2 * self.margin() - 2 * max(self.indent(), 0), 1)
        for form in self._forms:
            if fm.horizontalAdvance(form) <= room:
                return form
        return fm.elidedText(self._forms[-1], Qt.TextElideMode.ElideRight, room)

    def paintEvent(self, ev) -> None:   # noqa: N802 - Qt's name
        shown = self.shown_text()
        if shown == self.text():
            super().paintEvent(ev)          # the whole text: QLabel's own (selection, style)
            return
        p = QPainter(self)
        opt = QStyleOption()
        opt.initFrom(self)
        self.style().drawPrimitive(QStyle.PrimitiveElement.PE_Widget, opt, p, self)
        self.style().drawItemText(p, self.contentsRect(), int(self.alignment()), self.palette(),
                                  self.isEnabled(), shown, self.foregroundRole())
        p.end()


def never_widens(widget):
    """`widget` (a label) never widens its row: no minimum width, its width given by the
    layout (a long message is cut or elided, not the window stretched). Returns it."""
    widget.setMinimumWidth(1)
    widget.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
    return widget


def thin_bar(name: str | None = None, fixed: int | None = None,
             maximum: int | None = None) -> QProgressBar:
    """A progress bar in thousandths with no text on it (the figures sit beside it)."""
    bar = QProgressBar()
    if name:
        bar.setObjectName(name)
    bar.setRange(0, 1000)
    bar.setTextVisible(False)
    if fixed is not None:
        bar.setFixedWidth(fixed)
    if maximum is not None:
        bar.setMaximumWidth(maximum)
    return bar

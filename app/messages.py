"""User messages behind one small interface, so tests can record them instead of blocking."""

from __future__ import annotations

from PySide6.QtWidgets import QMessageBox


class Messages:
    """Modal message boxes (the real app)."""

    def __init__(self, parent=None):
        self.parent = parent

    def error(self, title: str, text: str) -> None:
        box = QMessageBox(QMessageBox.Icon.Warning, title, text.split("\n\n")[0],
                          QMessageBox.StandardButton.Ok, self.parent)
        if "\n\n" in text:
            box.setDetailedText(text)
        box.exec()

    def info(self, title: str, text: str) -> None:
        QMessageBox.information(self.parent, title, text)

    def ask(self, title: str, text: str) -> bool:
        return QMessageBox.question(self.parent, title, text) == QMessageBox.StandardButton.Yes

    def confirm(self, title: str, text: str, details: str = "") -> tuple[bool, bool]:
        """Yes/No with a "Don't ask again this session" box: (yes, don't ask again)."""
        from PySide6.QtWidgets import QCheckBox
        box = QMessageBox(QMessageBox.Icon.Question, title, text,
                          QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
                          self.parent)
        box.setDefaultButton(QMessageBox.StandardButton.No)
        if details:
            box.setDetailedText(details)
        again = QCheckBox("Don't ask again this session")
        box.setCheckBox(again)
        yes = box.exec() == QMessageBox.StandardButton.Yes
        return yes, again.isChecked()

    def ask_save(self, title: str, text: str) -> str:
        """'save', 'discard' or 'cancel'."""
        B = QMessageBox.StandardButton
        r = QMessageBox.question(self.parent, title, text, B.Save | B.Discard | B.Cancel, B.Save)
        return {B.Save: "save", B.Discard: "discard"}.get(r, "cancel")


class RecordedMessages:
    """Non-blocking: records every message; `answer` is what ask() returns."""

    def __init__(self, answer: bool = False):
        self.answer = answer
        self.errors: list[tuple[str, str]] = []
        self.infos: list[tuple[str, str]] = []
        self.questions: list[tuple[str, str]] = []

    def error(self, title: str, text: str) -> None:
        self.errors.append((title, text))

    def info(self, title: str, text: str) -> None:
        self.infos.append((title, text))

    def ask(self, title: str, text: str) -> bool:
        self.questions.append((title, text))
        return self.answer

    dont_ask_again = False

    def confirm(self, title: str, text: str, details: str = "") -> tuple[bool, bool]:
        self.questions.append((title, text + ("\n" + details if details else "")))
        return self.answer, self.dont_ask_again

    save_answer = "discard"

    def ask_save(self, title: str, text: str) -> str:
        self.questions.append((title, text))
        return self.save_answer

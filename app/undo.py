"""QUndoStack adapter for the Qt-free commands of :mod:`app.commands`."""

from __future__ import annotations

from PySide6.QtGui import QUndoCommand


class UndoCommand(QUndoCommand):
    def __init__(self, doc, command):
        super().__init__(command.label)
        self.doc = doc
        self.command = command

    def redo(self) -> None:  # QUndoStack.push() calls this once
        self.command.do(self.doc)

    def undo(self) -> None:
        self.command.undo(self.doc)


def push(stack, doc, command) -> bool:
    """Push a command (None = nothing to do). Returns whether something was pushed."""
    if command is None:
        return False
    stack.push(UndoCommand(doc, command))
    return True

"""The one exception type of the project.

Every problem with user input (a file, a plan, a scheme name, a tensor) is raised as a
:class:`WorkbenchError` whose message names the file/tensor and the problem on one line.
The CLI prints that line and exits non-zero; the GUI shows it in a message box.
"""

from __future__ import annotations


class WorkbenchError(Exception):
    """A clear, one-line, user-facing error."""

    def __init__(self, message: str, *, path: str | None = None, tensor: str | None = None):
        self.path = None if path is None else str(path)
        self.tensor = tensor
        parts = []
        if self.path:
            parts.append(self.path)
        if tensor:
            parts.append(f"tensor '{tensor}'")
        prefix = ": ".join(parts)
        super().__init__(one_line(f"{prefix}: {message}" if prefix else message))


def one_line(text: str) -> str:
    """Escape line breaks and other control characters (e.g. in a tensor name from a file)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


class Cancelled(Exception):
    """Raised inside a long job when the user asked it to stop."""

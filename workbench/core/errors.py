"""The one exception type of the project.

Every problem with user input (a file, a plan, a scheme name, a tensor) is raised as a
:class:`WorkbenchError` whose message names the file/tensor and the problem on one line,
``<file>: tensor '<name>': <problem>``. The CLI prints that line and exits non-zero; the GUI
shows it in a message box. Code deep down that does not know the file (a quantizer, a block
decoder) raises with what it knows; the caller that does adds the rest with :func:`context`.
"""

from __future__ import annotations

import contextlib


class WorkbenchError(Exception):
    """A clear, one-line, user-facing error."""

    def __init__(self, message: str, *, path: str | None = None, tensor: str | None = None):
        self.path = None if path is None else str(path)
        self.tensor = tensor
        self.problem = str(message)          # the message without the file/tensor prefix
        parts = []
        if self.path:
            parts.append(self.path)
        if tensor:
            parts.append(f"tensor '{tensor}'")
        prefix = ": ".join(parts)
        super().__init__(one_line(f"{prefix}: {message}" if prefix else message))

    def __reduce__(self):
        # pickled with its parts (a cluster worker's error reaches the client whole), so a
        # caller's context() does not prefix the file a second time
        return (_rebuild, (self.problem, self.path, self.tensor))

    def with_context(self, path: str | None = None, tensor: str | None = None) -> "WorkbenchError":
        """This error with the file / tensor filled in where it had none (else itself)."""
        if (self.path or not path) and (self.tensor or not tensor):
            return self
        new = WorkbenchError(self.problem, path=self.path or path, tensor=self.tensor or tensor)
        new.__cause__ = self.__cause__
        return new


def _rebuild(problem: str, path: str | None, tensor: str | None) -> WorkbenchError:
    return WorkbenchError(problem, path=path, tensor=tensor)


@contextlib.contextmanager
def context(path=None, tensor: str | None = None):
    """Re-raise a WorkbenchError from the block with the file / tensor it lacks filled in."""
    try:
        yield
    except WorkbenchError as exc:
        new = exc.with_context(None if path is None else str(path), tensor)
        if new is exc:
            raise
        raise new from exc.__cause__


def one_line(text: str) -> str:
    """Escape line breaks, other control characters and lone surrogates (e.g. in a tensor
    name from a file), so the message is one printable line that any stream can encode."""
    if text.isprintable() and not any("\ud800" <= c <= "\udfff" for c in text):
        return text
    return "".join(c if c.isprintable() and not "\ud800" <= c <= "\udfff"
                   else c.encode("unicode_escape", "backslashreplace").decode("ascii")
                   for c in text)


class Cancelled(Exception):
    """Raised inside a long job when the user asked it to stop."""

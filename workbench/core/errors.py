"""The one exception type of the project.

Every problem with user input (a file, a plan, a scheme name, a tensor) is raised as a
:class:`WorkbenchError` whose message names the file/tensor and the problem on one line,
``<file>: tensor '<name>': <problem>``. The CLI prints that line and exits non-zero; the GUI
shows it in a message box. Code deep down that does not know the file (a quantizer, a block
decoder) raises with what it knows; the caller that does adds the rest with :func:`context`.

A message speaks in the API's terms: a parameter it names is written ``name=`` (``give calib=,
not imatrix=``), with its value after it where it says one (``ctx=3``, ``measure='fisher'``),
and listed in ``params``; :meth:`WorkbenchError.flagged` tells it in a command line's terms
(``--calib``, ``--ctx 3``, ``--measure fisher``): the CLI names each parameter's flag.
"""

from __future__ import annotations

import contextlib
import re


class WorkbenchError(Exception):
    """A clear, one-line, user-facing error."""

    def __init__(self, message: str, *, path: str | None = None, tensor: str | None = None,
                 params: tuple[str, ...] = ()):
        self.path = None if path is None else str(path)
        self.tensor = tensor
        #: the parameters the message names (``name=``), for :meth:`flagged`
        self.params = tuple(params)
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
        return (_rebuild, (self.problem, self.path, self.tensor, self.params))

    def with_context(self, path: str | None = None, tensor: str | None = None) -> "WorkbenchError":
        """This error with the file / tensor filled in where it had none (else itself)."""
        if (self.path or not path) and (self.tensor or not tensor):
            return self
        new = WorkbenchError(self.problem, path=self.path or path, tensor=self.tensor or tensor,
                             params=self.params)
        new.__cause__ = self.__cause__
        return new

    def flagged(self, flag_of) -> "WorkbenchError":
        """This error told under a command line's flags: each parameter in `params` whose
        `flag_of(name)` is a flag (None: it stays as it is) is said as that flag, its value
        after a space (``ctx=3`` -> ``--ctx 3``, ``measure='fisher'`` -> ``--measure fisher``,
        ``calib=`` -> ``--calib``, a switch ``strict=True`` -> ``--strict``)."""
        problem = self.problem
        for name in self.params:
            flag = flag_of(name)
            if flag:
                problem = _mention(name).sub(lambda m, f=flag: _as_flag(f, m.group(1)), problem)
        if problem == self.problem:
            return self
        new = WorkbenchError(problem, path=self.path, tensor=self.tensor)
        new.__cause__ = self.__cause__
        return new


def _mention(name: str) -> "re.Pattern":
    """``name=`` in a message, with the value after it: quoted (a repr: ``'...'`` or
    ``"..."``) or up to a space or one of ``,;:)``."""
    return re.compile(rf"""(?<![\w.-]){re.escape(name)}=('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|[^\s,;:)'"]+)?""")


def _as_flag(flag: str, value: str | None) -> str:
    if not value or value == "True":          # a switch (``strict=True``) is its flag alone
        return flag
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        import ast
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            value = value[1:-1]
    return f"{flag} {value}"


def _rebuild(problem: str, path: str | None, tensor: str | None,
             params: tuple = ()) -> WorkbenchError:
    return WorkbenchError(problem, path=path, tensor=tensor, params=params)


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

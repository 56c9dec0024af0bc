"""Argument checks: a number within its bounds, a value of the right type or one of its choices.

Every door (the CLI, the app, scripts calling ``workbench.api``) reaches the same checks, which
live below the CLI. The error names the *parameter* (``samples``), never a flag: it is an
:class:`ArgumentError`, a :class:`WorkbenchError` that carries ``param`` and the problem apart,
so the CLI can print it under its own flag (``--samples``) with :meth:`ArgumentError.named`.
A wrong type is an :class:`ArgumentTypeError`, which is also a ``TypeError``; a bad value is
also a ``ValueError``.
"""

from __future__ import annotations

import math
import numbers
import operator
import os

from workbench.core.errors import WorkbenchError

#: the bounds every door shares (docs/api.md, "Arguments"): calibration samples read (a 512 MiB
#: calibration file holds fewer lines), tokens a chunk (llama-perplexity's -c; 4 leaves two
#: tokens scored), chunks scored, threads
MAX_SAMPLES = 1_000_000
MIN_CTX, MAX_CTX = 4, 1 << 20
MAX_CHUNKS = 1_000_000
MAX_THREADS = 1024


class ArgumentError(WorkbenchError, ValueError):
    """A bad argument: ``param`` (the parameter's name) and ``detail`` (what is wrong with it),
    one line ``<param> <detail>``."""

    def __init__(self, param: str, detail: str, *, path: str | None = None,
                 shown: str | None = None):
        self.param, self.detail = str(param), str(detail)
        self.shown = str(shown or param)          # the name the message says
        super().__init__(f"{self.shown} {self.detail}", path=path)

    def named(self, name: str) -> "ArgumentError":
        """The same error told under another name (the CLI's flag for the parameter)."""
        return type(self)(self.param, self.detail, path=self.path, shown=name)

    def with_context(self, path: str | None = None, tensor: str | None = None):
        if self.path or not path:
            return self
        return type(self)(self.param, self.detail, path=path, shown=self.shown)

    def __reduce__(self):
        return (_rebuild, (type(self), self.param, self.detail, self.path, self.shown))


def _rebuild(cls, param, detail, path, shown):
    return cls(param, detail, path=path, shown=shown)


class ArgumentTypeError(ArgumentError, TypeError):
    """An argument of the wrong type."""


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _what(value) -> str:
    return f"{type(value).__name__} {_shown(value)}"


def check_int(name: str, value, lo: int, hi: int, *, none: bool = False, unit: str = ""):
    """`value` as an int in [lo, hi] (None passes when `none`); a bool, a float or text is a
    type error, a number outside the bounds is refused with the bounds."""
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ArgumentTypeError(name, f"must be a whole number from {lo:,} to {hi:,}{unit}, "
                                      f"not {_what(value)}")
    v = operator.index(value)
    if not lo <= v <= hi:
        raise ArgumentError(name, f"is {v:,}: give a whole number from {lo:,} to {hi:,}{unit}")
    return v


def check_float(name: str, value, lo: float, hi: float, *, none: bool = False,
                lo_open: bool = False, unit: str = ""):
    """`value` as a finite float in [lo, hi] ((lo, hi] with `lo_open`); None passes when
    `none`; NaN and infinities are refused."""
    if value is None and none:
        return None
    span = (f"above {_num(lo)} and at most {_num(hi)}" if lo_open
            else f"from {_num(lo)} to {_num(hi)}")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(name, f"must be a number {span}{unit}, not {_what(value)}")
    v = float(value)
    if not math.isfinite(v) or v < lo or v > hi or (lo_open and v == lo):
        raise ArgumentError(name, f"is {_num(v) if math.isfinite(v) else v}: give a finite "
                                  f"number {span}{unit}")
    return v


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1e6 and float(x).is_integer() and abs(x) < 1e30 else f"{x:g}"


def check_bool(name: str, value) -> bool:
    """True or False (numpy's bools too); 0, 1 or "no" are not taken for one."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    raise ArgumentTypeError(name, f"must be True or False, not {_what(value)}")


def check_choice(name: str, value, choices, *, none: bool = False):
    """One of `choices` (text), None when `none`."""
    if value is None and none:
        return None
    choices = list(choices)
    listed = ", ".join(map(str, choices))
    if not isinstance(value, str):
        raise ArgumentTypeError(name, f"must be one of {listed}, not {_what(value)}")
    if value not in choices:
        raise ArgumentError(name, f"is {_shown(value)}: choose one of {listed}")
    return value


def check_type(name: str, value, types, expected: str, *, none: bool = False, hint: str = ""):
    """`value` an instance of `types` (None passes when `none`); else a type error saying what
    was `expected` and, with `hint`, how to make one."""
    if value is None and none:
        return None
    if not isinstance(value, types):
        more = f" ({hint})" if hint else ""
        raise ArgumentTypeError(name, f"must be {expected}{more}, not {_what(value)}")
    return value


def check_callable(name: str, value, *, none: bool = True):
    """A callable (None passes when `none`)."""
    if (value is None and none) or callable(value):
        return value
    raise ArgumentTypeError(name, f"must be a callable{' or None' if none else ''}, "
                                  f"not {_what(value)}")


def check_path(name: str, value, *, none: bool = False):
    """A file path: text or os.PathLike, not empty, without NUL bytes; None when `none`."""
    if value is None and none:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise ArgumentTypeError(name, f"must be a path (str or os.PathLike"
                                      f"{', or None' if none else ''}), not {_what(value)}")
    text = os.fspath(value)
    if isinstance(text, bytes):
        raise ArgumentTypeError(name, "must be a path as text, not bytes")
    if not text or "\0" in text:
        raise ArgumentError(name, f"is {_shown(text)}: not a path")
    raw = os.fsencode(text)
    if len(raw) > 4096 or any(len(part) > 255 for part in raw.split(b"/")):
        raise ArgumentError(name, f"is a path of {len(text):,} characters: longer than a file "
                                  "name can be (255 bytes a name, 4,096 in all)")
    return value


def check_names(name: str, value, *, none: bool = False, what: str = "names"):
    """A list (any iterable but text) of non-empty strings; one string is refused, as it would
    be read one character at a time."""
    if value is None and none:
        return None
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ArgumentTypeError(name, f"must be a list of {what}, not {_what(value)}")
    items = list(value)
    for item in items:
        if not isinstance(item, str) or not item:
            raise ArgumentTypeError(name, f"must be a list of {what} (text), and holds "
                                          f"{_what(item)}")
    return items

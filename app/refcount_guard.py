"""Work around a PySide6 6.12 bug on Python < 3.12: some calls decref None / True / False.

Every Python call of a QPainter method that returns nothing (drawLine, setPen, save, ...)
drops one reference to None that it never took (measured: 100 calls of `drawLine` lower
`sys.getrefcount(None)` by 100). pyqtgraph paints from Python, so a session of normal use
drives None's count to zero and the interpreter aborts ("none_dealloc"). From Python 3.12
None is immortal and this is harmless. The guard adds permanent references to None
(CPython's `ob_refcnt`, the first field of every object, as Py_IncRef would) whenever the
count runs low, from a timer and from the offscreen renderers. Permanent, not a list of
references: those would be released at interpreter shutdown, before the missing ones.
"""

from __future__ import annotations

import ctypes
import platform
import sys

NEEDED = sys.version_info < (3, 12) and platform.python_implementation() == "CPython"
LOW_WATER = 1 << 24
CHUNK = 1 << 26


_SINGLETONS = (None, True, False)


def top_up() -> None:
    if not NEEDED:
        return
    for obj in _SINGLETONS:
        if sys.getrefcount(obj) < LOW_WATER:
            ctypes.c_ssize_t.from_address(id(obj)).value += CHUNK


def install(app=None) -> None:
    """Top up now and every few seconds while the event loop runs."""
    if not NEEDED:
        return
    top_up()
    if app is not None and not hasattr(app, "_none_guard"):
        from PySide6.QtCore import QTimer
        timer = QTimer(app)
        timer.setInterval(2000)
        timer.timeout.connect(top_up)
        timer.start()
        app._none_guard = timer

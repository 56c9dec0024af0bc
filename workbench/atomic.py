"""Atomic file writes: write a temporary file beside the target, fsync, then rename."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path

from .errors import WorkbenchError


def _read_umask() -> int:
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


_FILE_MODE = 0o666 & ~_read_umask()  # read once at import: os.umask is process-wide


def default_file_mode() -> int:
    """The mode a plain open() would give a new file (mkstemp gives 0600)."""
    return _FILE_MODE


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb"):
    """Yield a file object; on success the target is replaced in one rename.

    On any error the temporary file is removed and the existing target is untouched.
    OSErrors (a full disk, no permission) become a WorkbenchError naming the file.
    """
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise WorkbenchError("output folder does not exist", path=str(target))
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise WorkbenchError(f"cannot write here ({exc.strerror})", path=str(target)) from exc
    try:
        with os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, _FILE_MODE)  # mkstemp makes 0600; give the usual umask mode
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            why = "disk full" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
            raise WorkbenchError(f"write failed ({why}); existing file left unchanged",
                                 path=str(target)) from exc
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    with atomic_write(path, "w") as fh:
        fh.write(text)

"""Atomic file writes: write a temporary file beside the target, fsync, then rename."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import tempfile
import time
from pathlib import Path

from workbench.core.errors import WorkbenchError


def _read_umask() -> int:
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


_FILE_MODE = 0o666 & ~_read_umask()  # read once at import: os.umask is process-wide


def default_file_mode() -> int:
    """The mode a plain open() would give a new file (mkstemp gives 0600)."""
    return _FILE_MODE


TEMP_TAG = "quant-workbench"
# ".<name>.quant-workbench-<pid>-<random>.tmp|.data" files (".probe.tmp": the output door's
# writability probe), ".<name>.quant-workbench-<pid>.tmp|.old" folders (the compressed-tensors
# export)
_STALE = re.compile(r"^\..+\." + TEMP_TAG + r"-(\d+)(-[a-z0-9_]+)?(\.probe)?\.(tmp|data|old)$")
# the ONNX exporter's folders of earlier versions (".qwb-onnx-<random>", no process id): removed
# once untouched for LEGACY_STALE_SECONDS (a kill -9 left them behind for good)
_LEGACY = re.compile(r"^\.qwb-onnx-[a-z0-9_]{8}$")
LEGACY_STALE_SECONDS = 3600


def make_temp(target: Path, suffix: str = ".tmp") -> tuple[int, str]:
    """A new temporary file beside `target`, named so a user recognises it
    (``.<name>.quant-workbench-<pid>-<random>.tmp``); stale ones of killed runs are removed
    first. OSErrors become a WorkbenchError naming the target."""
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise WorkbenchError("output folder does not exist", path=str(target))
    clean_stale_temps(directory)
    try:
        return tempfile.mkstemp(prefix=f".{target.name}.{TEMP_TAG}-{os.getpid()}-", suffix=suffix,
                                dir=directory)
    except OSError as exc:
        why = "disk full" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
        raise WorkbenchError(f"cannot write here ({why})", path=str(target)) from None


def make_temp_dir(directory, label: str) -> Path:
    """A new temporary folder in `directory` (``.<label>.quant-workbench-<pid>-<random>.tmp``),
    removed by clean_stale_temps once its process is gone (a kill -9 leaves it behind), stale
    ones of killed runs removed first. OSErrors (a full disk, a read-only folder) become a
    WorkbenchError naming the folder."""
    directory = Path(directory) if str(directory) else Path(".")
    clean_stale_temps(directory)
    try:
        return Path(tempfile.mkdtemp(prefix=f".{label}.{TEMP_TAG}-{os.getpid()}-",
                                     suffix=".tmp", dir=directory))
    except OSError as exc:
        raise WorkbenchError(f"cannot write here ({write_problem(exc) or exc.strerror})",
                             path=str(directory)) from None


#: errno values that mean the disk (or the quota / file size limit) is full
_FULL = {errno.ENOSPC: "disk full (ENOSPC)", errno.EDQUOT: "disk quota full (EDQUOT)",
         errno.EFBIG: "file too large for this file system or limit (EFBIG)"}


def write_problem(exc: BaseException) -> str | None:
    """What an exception raised while writing says about the disk, where it says anything:
    a full disk (ENOSPC), quota (EDQUOT) or size limit (EFBIG), a read-only file system,
    permission denied; found in the exception or its causes (torch and onnx wrap the OSError,
    or only keep its text). None when it is not a write problem."""
    seen = 0
    e = exc
    while e is not None and seen < 16:
        if isinstance(e, OSError) and e.errno is not None:
            if e.errno in _FULL:
                return _FULL[e.errno]
            if e.errno == errno.EROFS:
                return "read-only file system (EROFS)"
            if e.errno == errno.EACCES:
                return "permission denied (EACCES)"
        text = str(e)
        if "No space left on device" in text:
            return _FULL[errno.ENOSPC]
        if "Disk quota exceeded" in text:
            return _FULL[errno.EDQUOT]
        if "File too large" in text:
            return _FULL[errno.EFBIG]
        e = e.__cause__ or e.__context__
        seen += 1
    return None


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (shared by temp-file cleanup and the app's
    crash detection)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def clean_stale_temps(directory: Path) -> list[str]:
    """Remove this program's temporary files left in `directory` by runs that were killed
    (their process is gone). Returns the names removed."""
    removed = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for e in entries:
        m = _STALE.match(e.name)
        if m is None and _LEGACY.match(e.name):
            with contextlib.suppress(OSError):
                if (e.is_dir(follow_symlinks=False) and time.time()
                        - e.stat(follow_symlinks=False).st_mtime > LEGACY_STALE_SECONDS):
                    import shutil
                    shutil.rmtree(e.path)
                    removed.append(e.name)
            continue
        if m and int(m.group(1)) != os.getpid() and not pid_alive(int(m.group(1))):
            with contextlib.suppress(OSError):
                if e.is_file(follow_symlinks=False):
                    os.unlink(e.path)
                    removed.append(e.name)
                elif e.is_dir(follow_symlinks=False):
                    import shutil
                    shutil.rmtree(e.path)
                    removed.append(e.name)
    return removed


# files beside a single checkpoint file that loaders and exporters read with it
SIDECARS = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "tokenizer.model", "special_tokens_map.json", "vocab.txt", "vocab.json",
            "merges.txt", "added_tokens.json")


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb"):
    """Yield a file object; on success the target is replaced in one rename.

    On any error the temporary file is removed and the existing target is untouched.
    OSErrors (a full disk, no permission) become a WorkbenchError naming the file.
    """
    target = Path(path)
    fd, tmp = make_temp(target)
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
            why = write_problem(exc) or exc.strerror or str(exc)
            raise WorkbenchError(f"write failed ({why}); existing file left unchanged",
                                 path=str(target)) from exc
        raise


def replace_folder(tmp: Path, out_dir: Path) -> None:
    """Put the finished temporary folder `tmp` in place as `out_dir` (its files get the mode a
    plain open() would give; an existing `out_dir` is moved aside, replaced, then removed)."""
    import shutil
    for f in tmp.iterdir():
        os.chmod(f, default_file_mode())
    if out_dir.exists():
        old = out_dir.parent / f".{out_dir.name}.{TEMP_TAG}-{os.getpid()}.old"
        os.replace(out_dir, old)
        os.replace(tmp, out_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out_dir)


def discard_folder(tmp: Path, out_dir: Path, exc: BaseException):
    """Remove an unfinished temporary folder after `exc` and raise: an OSError as a one-line
    WorkbenchError naming `out_dir`, anything else as it is."""
    import shutil
    shutil.rmtree(tmp, ignore_errors=True)
    if isinstance(exc, OSError):
        raise WorkbenchError(f"write failed ({exc.strerror or exc}); nothing written",
                             path=str(out_dir)) from exc
    raise exc


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    with atomic_write(path, "w") as fh:
        fh.write(text)

"""The one rule every on-disk cache follows (the KLD cache of workbench.running.kld, llama.cpp's
base logits in workbench.export.llama_kld, the output measure's values in
workbench.planning.output_measure).

* **Keys cover everything a result depends on.** :func:`make_key` hashes a JSON list of parts;
  a file enters it by its content (:func:`file_key`: size and a SHA-256 of every byte, never
  its path or mtime), so a copy of a model elsewhere hits and an edit anywhere in a file
  misses, whatever its size and mtime say. A file's hash is computed once and remembered
  (:func:`content_hash`) by (device, inode, size, mtime, ctime): ``os.utime`` can put an
  mtime back, never a ctime; a hash is only remembered for a file whose ctime is older than
  the hash (git's rule for "racy" files: a change in the same clock tick as the hashing is
  never hidden).
* **Each entry stores its key and a checksum of its payload** (``NAME.SUFFIX`` and the
  record ``NAME.SUFFIX.json``: the whole key, the payload's size and SHA-256), verified on
  every read: any mismatch (another key, other bytes, a truncated or foreign payload, a
  damaged record) is a miss, and the entry is removed, never served.
* **Only complete, verified payloads take a final name**: a payload is written to a temporary
  name beside the entry, checked by the caller's `verify` (size, parse), hashed, renamed, and
  only then is its record written.
* ``use_cache=False`` (``--no-cache``) is each caller's: nothing is read or written.

Folders: ``$XDG_CACHE_HOME/quant-workbench/<name>`` (``~/.cache`` without it); remembered
hashes in ``.../hashes``. A cache that cannot be written only costs time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import threading
import time
from pathlib import Path

CACHE_FORMAT = "quant-workbench-cache"
_RECORD_LIMIT = 1 << 20          # a record is a few KB; a bigger one is not ours
_RACY_NS = 2_000_000_000         # a ctime this close to the hashing: hashed again next time
_MEMO: dict[tuple, str] = {}
_MEMO_LOCK = threading.Lock()
HASHES_KEEP = 4096


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "quant-workbench"


# ---- content hashes -------------------------------------------------------------------------
def _stat_key(st: os.stat_result) -> tuple:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _memo_file(st: os.stat_result) -> Path:
    return cache_root() / "hashes" / f"{st.st_dev}-{st.st_ino}.json"


def _hash_file(path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def content_hash(path) -> str:
    """SHA-256 of every byte of the file, remembered in this process and on disk by (device,
    inode, size, mtime, ctime) where the file's ctime is safely older than the hash (module
    doc). OSError when the file cannot be read."""
    path = os.fspath(path)
    st = os.stat(path)
    key = _stat_key(st)
    with _MEMO_LOCK:
        hit = _MEMO.get(key)
    if hit is not None:
        return hit
    memo = _memo_file(st)
    with contextlib.suppress(OSError, ValueError, TypeError):
        if memo.stat().st_size < 4096:
            d = json.loads(memo.read_text())
            if isinstance(d, dict) and d.get("stat") == list(key) \
                    and isinstance(d.get("sha256"), str) and len(d["sha256"]) == 64:
                with _MEMO_LOCK:
                    _MEMO[key] = d["sha256"]
                return d["sha256"]
    started = time.time_ns()
    digest = _hash_file(path)
    after = os.stat(path)
    if _stat_key(after) == key and st.st_ctime_ns < started - _RACY_NS:
        with _MEMO_LOCK:
            _MEMO[key] = digest
        _write_small(memo, json.dumps({"stat": list(key), "sha256": digest}))
        _prune(memo.parent, "*.json", HASHES_KEEP)
    return digest


def file_key(path) -> list:
    """What a key holds for a file it depends on: [size, SHA-256 of the content] (no path: the
    same bytes elsewhere are the same input); [None] for a file that cannot be read."""
    try:
        return [os.stat(path).st_size, content_hash(path)]
    except OSError:
        return [None]


def make_key(parts) -> str:
    """The key of a list of JSON-able parts (canonical JSON, SHA-256 hex)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, separators=(",", ":"),
                                     default=str).encode()).hexdigest()


def model_files(model) -> list[Path]:
    """The files a model's result depends on: each tensor's file and, from the folder of its
    config (the companion folder of a GGUF read as a Hugging Face model, else beside the
    weights), config.json and generation_config.json where present. (Tokenizer files reach
    results through the token ids, which keys hold themselves.)"""
    files = {Path(getattr(model.info(n), "file", "") or model.path) for n in model.tensors}
    folder = getattr(model, "folder", None)
    if not folder:
        p = Path(model.path)
        folder = p if p.is_dir() else p.parent
    for name in ("config.json", "generation_config.json"):
        if (Path(folder) / name).is_file():
            files.add(Path(folder) / name)
    return sorted(files)


def model_key(model) -> list:
    """The content of the model's files (:func:`model_files`), for a key: a sorted list of
    file_key (no paths: a model copied or converted again into a fresh folder is the same)."""
    return sorted((file_key(f) for f in model_files(model)), key=json.dumps)


# ---- entries --------------------------------------------------------------------------------
class Cache:
    """A folder of verified entries (module doc): ``get`` returns the path of a payload whose
    record holds this key and whose bytes hash to the record's checksum, else None (a bad
    entry removed); ``put_bytes`` / ``put_file`` store a payload under a key after `verify`;
    the `keep` most recently used entries stay (and, with `max_bytes`, only as many of the
    most recently used as hold that many payload bytes)."""

    def __init__(self, name: str, suffix: str, keep: int, folder=None,
                 max_bytes: int | None = None):
        self.folder = Path(folder) if folder else cache_root() / name
        self.suffix = suffix
        self.keep = keep
        self.max_bytes = max_bytes

    def path(self, key: str) -> Path:
        return self.folder / f"{key[:32]}{self.suffix}"

    def record(self, key: str) -> Path:
        p = self.path(key)
        return p.with_name(p.name + ".json")

    def remove(self, key: str) -> None:
        """Remove the entry's payload and record (a folder under their name is left alone)."""
        for p in (self.record(key), self.path(key)):
            with contextlib.suppress(OSError):
                p.unlink()

    def get(self, key: str, verify=None) -> Path | None:
        """The payload's path on a verified hit (`verify(path)`, when given, also true), else
        None; a mismatch of any kind removes the entry."""
        payload, rec = self.path(key), self.record(key)
        if not rec.exists() and not payload.exists():
            return None
        ok = False
        with contextlib.suppress(OSError, ValueError, TypeError, UnicodeDecodeError):
            rst, pst = os.stat(rec, follow_symlinks=False), os.stat(payload, follow_symlinks=False)
            # regular files only (a link, FIFO or folder under an entry's name is not ours)
            if stat.S_ISREG(rst.st_mode) and stat.S_ISREG(pst.st_mode) \
                    and rst.st_size <= _RECORD_LIMIT:
                d = json.loads(rec.read_text(encoding="utf-8"))
                ok = (isinstance(d, dict) and d.get("format") == CACHE_FORMAT
                      and d.get("key") == key and isinstance(d.get("bytes"), int)
                      and pst.st_size == d["bytes"]
                      and content_hash(payload) == d.get("sha256")
                      and (verify is None or bool(verify(payload))))
        if not ok:
            self.remove(key)
            return None
        with contextlib.suppress(OSError):
            os.utime(rec)                     # the most recently used are kept
        return payload

    def get_bytes(self, key: str) -> bytes | None:
        p = self.get(key)
        if p is None:
            return None
        try:
            data = p.read_bytes()
        except OSError:
            return None
        if hashlib.sha256(data).hexdigest() != content_hash(p):   # changed since the check
            self.remove(key)
            return None
        return data

    def temp(self, key: str) -> Path | None:
        """A fresh temporary name beside the entry (removed by clean_stale_temps once its
        process is gone), None where the folder cannot be written."""
        from workbench.core.atomic import make_temp
        from workbench.core.errors import WorkbenchError
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, name = make_temp(self.path(key))
        except (OSError, WorkbenchError):
            return None
        os.close(fd)
        return Path(name)

    def put_file(self, key: str, tmp, verify=None) -> Path | None:
        """Move the complete file `tmp` (in the cache folder: see :meth:`temp`) into the cache
        under `key` once `verify(tmp)` holds; the payload's final path. None when `verify`
        fails (tmp removed) or the cache cannot be written (tmp left to the caller)."""
        tmp = Path(tmp)
        if verify is not None and not verify(tmp):
            with contextlib.suppress(OSError):
                tmp.unlink()
            return None
        payload = self.path(key)
        try:
            size = tmp.stat().st_size
            digest = _hash_file(tmp)
            self.remove(key)
            os.replace(tmp, payload)
        except OSError:
            return None
        rec = json.dumps({"format": CACHE_FORMAT, "version": 1, "key": key, "bytes": size,
                          "sha256": digest})
        if not _write_small(self.record(key), rec):
            with contextlib.suppress(OSError):
                os.replace(payload, tmp)
            self.remove(key)
            return None
        self.prune()
        return payload

    def put_bytes(self, key: str, data: bytes) -> bool:
        tmp = self.temp(key)
        if tmp is None:
            return False
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
            return False
        if self.put_file(key, tmp, lambda p: p.stat().st_size == len(data)) is None:
            with contextlib.suppress(OSError):
                tmp.unlink()
            return False
        return True

    def prune(self) -> None:
        """Only the `keep` most recently used entries stay (a hit touches its record); payloads
        without a record are removed once a minute old (a writer is between its two steps for
        less)."""
        _prune(self.folder, f"*{self.suffix}.json", self.keep, companion=len(".json"),
               max_bytes=self.max_bytes)
        now = time.time()
        with contextlib.suppress(OSError):
            for p in self.folder.glob(f"*{self.suffix}"):
                with contextlib.suppress(OSError):
                    if not p.with_name(p.name + ".json").exists() \
                            and now - p.stat().st_mtime > 60:
                        p.unlink()


def _write_small(path: Path, text: str) -> bool:
    """An atomic write of a small file; False where it cannot be written."""
    from workbench.core.atomic import write_text_atomic
    from workbench.core.errors import WorkbenchError
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, text)
        return True
    except (OSError, WorkbenchError):
        return False


def _prune(folder: Path, pattern: str, keep: int, companion: int = 0,
           max_bytes: int | None = None) -> None:
    """Remove all but the `keep` newest files matching `pattern` (with, for `companion` > 0,
    the file named without the last `companion` characters); with `max_bytes`, also those
    past the newest whose companions (payloads) hold that many bytes (the newest stays)."""
    with contextlib.suppress(OSError):
        files = []
        for p in folder.glob(pattern):
            with contextlib.suppress(OSError):
                files.append((p.stat().st_mtime, p))
        files.sort(reverse=True)
        cut = keep
        if max_bytes is not None and companion:
            total = 0
            for i, (_, p) in enumerate(files[:keep]):
                with contextlib.suppress(OSError):
                    total += p.with_name(p.name[:-companion]).stat().st_size
                if total > max_bytes and i > 0:
                    cut = i
                    break
        for _, p in files[cut:]:
            with contextlib.suppress(OSError):
                p.unlink()
            if companion:
                with contextlib.suppress(OSError):
                    p.with_name(p.name[:-companion]).unlink()

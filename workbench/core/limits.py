"""Limits on what a file may claim, enforced where data enters (every loader, plan, session and
index), so memory and time stay bounded by the file, not by what its header says.

* Shapes: at most ``MAX_RANK`` dimensions, each a non-negative integer below ``MAX_DIM``; a
  tensor with no elements may not claim more than ``MAX_EMPTY_ROWS`` rows (statistics allocate
  per row); a tensor's logical bytes may not exceed the bytes its file holds.
* JSON (plans, sessions, shard indexes, quantized metadata, config.json): at most
  ``MAX_JSON_BYTES``, nesting depth ``MAX_JSON_DEPTH``, integers of ``MAX_INT_DIGITS`` digits,
  and no duplicate keys (a second value for a key would silently win).
* GGUF: the key/value section is scanned with these bounds before the `gguf` reader sees it:
  ``MAX_GGUF_ARRAY`` items per array, ``MAX_GGUF_ITEMS`` in all, ``MAX_GGUF_DEPTH`` nested
  arrays, strings within the file.
* Regular expressions (plan rules, filters): `workbench.core.patterns`, a linear-time engine.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import struct

import numpy as np

from workbench.core.errors import WorkbenchError

MAX_RANK = 8
MAX_DIM = 1 << 40
MAX_EMPTY_ROWS = 1 << 20
MAX_JSON_BYTES = 64 << 20
MAX_JSON_DEPTH = 64
MAX_INT_DIGITS = 40
MAX_GGUF_ARRAY = 4 << 20
MAX_GGUF_ITEMS = 8 << 20
MAX_GGUF_DEPTH = 3
MAX_GGUF_STRING = 16 << 20


def check_shape(shape, path=None, tensor=None, nbytes: int | None = None,
                file_size: int | None = None) -> tuple[int, ...]:
    """The shape as a tuple of ints, or a WorkbenchError naming the file and tensor."""
    if type(shape) is tuple and len(shape) <= MAX_RANK and nbytes is None:   # the common case
        numel = 1
        for d in shape:
            if type(d) is not int or not 0 <= d < MAX_DIM:
                break
            numel *= d
        else:
            if numel or (shape[0] if len(shape) >= 2 else 1) <= MAX_EMPTY_ROWS:
                return shape
    try:
        dims = tuple(shape)
    except TypeError:
        raise WorkbenchError("shape is not a list of integers", path=path, tensor=tensor) from None
    if len(dims) > MAX_RANK:
        raise WorkbenchError(f"shape has {len(dims)} dimensions (at most {MAX_RANK})",
                             path=path, tensor=tensor)
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int) or d < 0 or d >= MAX_DIM:
            raise WorkbenchError(f"invalid dimension {str(d)[:40]} in shape", path=path,
                                 tensor=tensor)
    numel = math.prod(dims)
    rows = dims[0] if len(dims) >= 2 else 1
    if numel == 0 and rows > MAX_EMPTY_ROWS:
        raise WorkbenchError(f"empty tensor claims {rows:,} rows", path=path, tensor=tensor)
    if nbytes is not None and file_size is not None and nbytes > file_size:
        raise WorkbenchError(f"tensor claims {nbytes:,} bytes but the file holds {file_size:,}",
                             path=path, tensor=tensor)
    return dims


@contextlib.contextmanager
def gc_paused():
    """Automatic garbage collection off while an input is read into objects that are all kept
    (a 300,000-tensor catalog, a 100,000-rule plan: no cycles), where the collections its
    allocations trigger cost a sixth of the time. Left off if it was off (the GUI collects in
    its own thread)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# ---- JSON ---------------------------------------------------------------------------------
def _no_duplicates(pairs):
    out = dict(pairs)
    if len(out) != len(pairs):   # rare: find the key named twice
        seen = set()
        for k, _ in pairs:
            if k in seen:
                raise ValueError(f"duplicate key {k[:80]!r}")
            seen.add(k)
    return out


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"integer of {len(text)} digits")
    return int(text)


# digits as '0', everything else a space: a run of MAX_INT_DIGITS + 1 digits is then a substring
# search (C speed; a regular expression scan of a 26 MB header took 0.18 s)
_DIGITS_AS_ZERO = bytes(0x30 if 0x30 <= c <= 0x39 else 0x20 for c in range(256))
_LONG_RUN = b"0" * (MAX_INT_DIGITS + 1)


def _has_long_digits(raw: bytes) -> bool:
    return _LONG_RUN in raw.translate(_DIGITS_AS_ZERO)


def _depth(obj, limit: int) -> None:
    stack = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if d > limit:
            raise ValueError(f"nested more than {limit} levels deep")
        if isinstance(o, dict):
            stack.extend((v, d + 1) for v in o.values())
        elif isinstance(o, list):
            stack.extend((v, d + 1) for v in o)


_NOT_STRUCTURE = bytes(c for c in range(256) if c not in b'[]{}":')


def _outside_strings(text: bytes, drop: bytes) -> tuple[np.ndarray, np.ndarray]:
    """The characters of a JSON text (one that parsed) that `drop` keeps, as uint8, and
    whether each stands outside strings: escaped backslashes and quotes removed, then a
    character is outside when an even number of quotes precede it."""
    r = text.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, drop)
    a = np.frombuffer(r, np.uint8)
    return a, (np.cumsum(a == 0x22) & 1) == 0 if a.size else np.zeros(0, bool)


def _count_keys(obj) -> int:
    """The keys of every object in a parsed JSON document."""
    n = 0
    stack = [obj]
    pop, push = stack.pop, stack.append
    while stack:
        o = pop()
        if type(o) is dict:
            n += len(o)
            for v in o.values():
                if type(v) is dict or type(v) is list:
                    push(v)
        else:
            for v in o:
                if type(v) is dict or type(v) is list:
                    push(v)
    return n


def _text_structure(text: bytes) -> tuple[int, int]:
    """(deepest bracket nesting, key/value pairs written) of a JSON text that parsed, at C /
    numpy speed: brackets and colons outside strings (escaped backslashes and quotes removed,
    everything but brackets, colons and quotes dropped; a character is outside when an even
    number of quotes precede it)."""
    a, outside = _outside_strings(text, _NOT_STRUCTURE)
    if not a.size:
        return 0, 0
    pairs = int(np.count_nonzero((a == 0x3A) & outside))
    opens = ((a == 0x5B) | (a == 0x7B)) & outside
    closes = ((a == 0x5D) | (a == 0x7D)) & outside
    step = opens.astype(np.int32) - closes
    return (int(np.cumsum(step).max()) if step.size else 0), pairs


def loads(text, path=None, what: str = "JSON"):
    """json.loads with the limits above; errors are WorkbenchErrors naming the file.
    Linear in the text with small constants (a 300,000-tensor safetensors header parses at the
    speed of json.loads): integer lengths and depth are checked on the text, duplicate keys
    by comparing the keys of the parsed objects with the pairs written (the colons outside
    strings); only a document with a duplicate is parsed again to name it."""
    if isinstance(text, (bytes, bytearray)):
        if len(text) > MAX_JSON_BYTES:
            raise WorkbenchError(f"{what} is larger than {MAX_JSON_BYTES >> 20} MiB", path=path)
        raw = bytes(text)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise WorkbenchError(f"{what} is not UTF-8", path=path) from None
    else:
        if len(text) > MAX_JSON_BYTES:
            raise WorkbenchError(f"{what} is larger than {MAX_JSON_BYTES >> 20} MiB", path=path)
        raw = text.encode("utf-8", "surrogatepass")
    try:
        long_ints = _has_long_digits(raw)
        obj = json.loads(text, parse_int=_parse_int if long_ints else None)
        if isinstance(obj, (dict, list)):
            depth, pairs = _text_structure(raw)
            if _count_keys(obj) != pairs:
                # a key written twice in one object (its second value silently won): parsed
                # again, object by object, to name it
                json.loads(text, object_pairs_hook=_no_duplicates,
                           parse_int=_parse_int if long_ints else None)
                raise ValueError("duplicate key")   # pragma: no cover - the hook names it
            # a scalar inside the deepest container is one level deeper than its brackets
            if depth >= MAX_JSON_DEPTH:
                _depth(obj, MAX_JSON_DEPTH)
        return obj
    except json.JSONDecodeError as exc:
        raise WorkbenchError(f"malformed {what} ({exc.msg} at line {exc.lineno})",
                             path=path) from None
    except RecursionError:
        raise WorkbenchError(f"{what} is nested too deeply", path=path) from None
    except ValueError as exc:
        raise WorkbenchError(f"malformed {what} ({exc})", path=path) from None


# ---- GGUF ---------------------------------------------------------------------------------
_GGUF_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


def prescan_gguf(path, size: int | None = None) -> None:
    """Walk a GGUF file's header and key/value section within the limits above (reading only
    what it checks); a WorkbenchError for anything that would make a reader allocate without
    bound."""
    import os
    size = os.path.getsize(path) if size is None else size
    with open(path, "rb") as fh:
        def read(n):
            b = fh.read(n)
            if len(b) != n:
                raise WorkbenchError("truncated GGUF header", path=str(path))
            return b

        if read(4) != b"GGUF":
            raise WorkbenchError("not a GGUF file", path=str(path))
        version = struct.unpack("<I", read(4))[0]
        if version not in (2, 3):
            raise WorkbenchError(f"unsupported GGUF version {version}", path=str(path))
        n_tensors, n_kv = struct.unpack("<QQ", read(16))
        if n_kv > size // 13 or n_tensors > size // 24:
            raise WorkbenchError(f"GGUF header claims {n_kv:,} keys and {n_tensors:,} tensors, "
                                 f"more than a {size:,}-byte file can hold", path=str(path))
        items = 0

        def string(what):
            n = struct.unpack("<Q", read(8))[0]
            if n > MAX_GGUF_STRING or fh.tell() + n > size:
                raise WorkbenchError(f"GGUF {what} of {n:,} bytes runs past the file",
                                     path=str(path))
            fh.seek(n, 1)

        def value(t, depth):
            nonlocal items
            if t in _GGUF_FIXED:
                fh.seek(_GGUF_FIXED[t], 1)
            elif t == _STRING:
                string("string")
            elif t == _ARRAY:
                if depth >= MAX_GGUF_DEPTH:
                    raise WorkbenchError(f"GGUF arrays nested more than {MAX_GGUF_DEPTH} deep",
                                         path=str(path))
                sub = struct.unpack("<I", read(4))[0]
                n = struct.unpack("<Q", read(8))[0]
                items += n
                if n > MAX_GGUF_ARRAY or items > MAX_GGUF_ITEMS:
                    raise WorkbenchError(f"GGUF array of {n:,} items (limit "
                                         f"{MAX_GGUF_ARRAY:,})", path=str(path))
                if sub in _GGUF_FIXED:
                    if fh.tell() + n * _GGUF_FIXED[sub] > size:
                        raise WorkbenchError(f"GGUF array of {n:,} items runs past the file",
                                             path=str(path))
                    fh.seek(n * _GGUF_FIXED[sub], 1)
                else:
                    if n * 8 > size:
                        raise WorkbenchError(f"GGUF array of {n:,} items runs past the file",
                                             path=str(path))
                    if sub == _STRING:      # a vocabulary: walked in memory, not item by item
                        _skip_strings(fh, n, size, str(path))
                    else:
                        for _ in range(n):
                            value(sub, depth + 1)
            else:
                raise WorkbenchError(f"unknown GGUF value type {t}", path=str(path))
            if fh.tell() > size:
                raise WorkbenchError("GGUF key/value section runs past the file", path=str(path))

        for _ in range(n_kv):
            string("key")
            value(struct.unpack("<I", read(4))[0], 0)
        for _ in range(n_tensors):
            string("tensor name")
            n_dims = struct.unpack("<I", read(4))[0]
            if n_dims > 4:
                raise WorkbenchError(f"GGUF tensor with {n_dims} dimensions", path=str(path))
            dims = struct.unpack(f"<{n_dims}Q", read(8 * n_dims))
            if any(d >= MAX_DIM for d in dims):
                raise WorkbenchError("GGUF tensor dimension out of range", path=str(path))
            read(4 + 8)


def _skip_strings(fh, n: int, size: int, path: str) -> None:
    """Move `fh` past `n` length-prefixed GGUF strings, each within MAX_GGUF_STRING and the
    file, reading the file in chunks (millions of tokens in about a second)."""
    unpack = struct.unpack_from
    base, buf, off = fh.tell(), b"", 0
    for _ in range(n):
        if off + 8 > len(buf):
            fh.seek(base + off)
            base, buf, off = base + off, fh.read(1 << 20), 0
            if len(buf) < 8:
                raise WorkbenchError("truncated GGUF header", path=path)
        (ln,) = unpack("<Q", buf, off)
        if ln > MAX_GGUF_STRING or base + off + 8 + ln > size:
            raise WorkbenchError(f"GGUF string of {ln:,} bytes runs past the file", path=path)
        off += 8 + ln
    fh.seek(base + off)


# ---- files --------------------------------------------------------------------------------
def check_regular_file(path, what: str = "file") -> None:
    """A WorkbenchError unless `path` is a regular file (a FIFO or device would block or
    never end)."""
    import os
    import stat
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise WorkbenchError(f"{what} not found", path=str(path)) from None
    except OSError as exc:
        raise WorkbenchError(f"cannot read {what} ({exc.strerror})", path=str(path)) from None
    if not stat.S_ISREG(st.st_mode):
        raise WorkbenchError(f"{what} is not a regular file", path=str(path))


def shard_path(index_path, name: str):
    """The shard `name` listed by an index: a plain relative name inside the index's folder
    (no absolute paths, no '..', no symlink leading outside), and a regular file."""
    from pathlib import Path, PurePosixPath
    index_path = Path(index_path)
    folder = index_path.parent.resolve()
    parts = PurePosixPath(name.replace("\\", "/")).parts
    if not name or PurePosixPath(name).is_absolute() or ".." in parts or "\0" in name:
        raise WorkbenchError(f"index lists a shard outside its folder ({name[:120]!r})",
                             path=str(index_path))
    p = (folder / name)
    try:
        real = p.resolve()
    except (OSError, RuntimeError):
        raise WorkbenchError(f"cannot resolve shard {name[:120]!r}", path=str(index_path)) from None
    if folder not in real.parents:
        raise WorkbenchError(f"shard {name[:120]!r} leads outside the model folder",
                             path=str(index_path))
    check_regular_file(p, "shard")
    return p


# ---- sidecar files ------------------------------------------------------------------------
# The files read beside the weights (config.json, tokenizer files, shard indexes, chat
# templates): the size is checked on the file before any byte is read, so an 8 GB (sparse)
# tokenizer.json is refused in microseconds; over the limit is an error naming the file and
# the limit, never "absent".
MAX_SIDECAR = 16 << 20
SIDECAR_LIMITS = {"tokenizer.json": MAX_JSON_BYTES, "tokenizer_config.json": MAX_JSON_BYTES,
                  "vocab.json": MAX_JSON_BYTES, "vocab.txt": MAX_JSON_BYTES,
                  "merges.txt": MAX_JSON_BYTES, "tokenizer.model": MAX_JSON_BYTES,
                  "spiece.model": MAX_JSON_BYTES, "added_tokens.json": MAX_JSON_BYTES}


def sidecar_limit(path) -> int:
    """The most bytes the sidecar file `path` may have: 64 MiB for tokenizer files and shard
    indexes (`*.index.json`), 16 MiB for the others (config.json, generation_config.json,
    special_tokens_map.json, chat templates, sentence-transformers' modules.json ...)."""
    from pathlib import Path
    name = Path(path).name.lower()
    if name.endswith(".index.json"):
        return MAX_JSON_BYTES
    return SIDECAR_LIMITS.get(name, MAX_SIDECAR)


def _mib(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and not n % (1 << 20) else f"{n:,} bytes"


def check_sidecar(path, what: str | None = None, limit: int | None = None) -> int:
    """The size of the sidecar file `path`, or a WorkbenchError naming it when it is over its
    limit (`limit`, default sidecar_limit) or not a regular file. Nothing is read."""
    import os
    import stat
    from pathlib import Path
    what = what or Path(path).name
    try:
        st = os.stat(path)
    except OSError as exc:
        raise WorkbenchError(f"cannot read {what} ({exc.strerror})", path=str(path)) from None
    if not stat.S_ISREG(st.st_mode):
        raise WorkbenchError(f"{what} is not a regular file", path=str(path))
    limit = sidecar_limit(path) if limit is None else limit
    if st.st_size > limit:
        raise WorkbenchError(f"{what} is {st.st_size:,} bytes, over the {_mib(limit)} limit "
                             "for this file: refused, not read", path=str(path))
    return st.st_size


def read_sidecar(path, what: str | None = None, limit: int | None = None) -> bytes:
    """The bytes of a sidecar file (or any JSON input: plans, sessions, with `limit`) within
    its limit (check_sidecar first; a file that grew past the limit meanwhile is refused the
    same way)."""
    from pathlib import Path
    what = what or Path(path).name
    limit = sidecar_limit(path) if limit is None else limit
    check_sidecar(path, what, limit)
    try:
        with open(path, "rb") as fh:
            # sized by the file, not the limit: read(limit + 1) allocates the whole limit
            # (64 MiB) for a 1 KB file (a MemoryError under an address-space limit)
            data = fh.read(min(os.fstat(fh.fileno()).st_size, limit) + 1)
            while len(data) <= limit:          # a file that grew while read: on to the limit
                more = fh.read(min(1 << 20, limit + 1 - len(data)))
                if not more:
                    break
                data += more
    except OSError as exc:
        raise WorkbenchError(f"cannot read {what} ({exc.strerror})", path=str(path)) from None
    if len(data) > limit:
        raise WorkbenchError(f"{what} is over the {_mib(limit)} limit for this file: refused",
                             path=str(path))
    return data


def load_sidecar_json(path, what: str | None = None):
    """A sidecar JSON file parsed with the limits above (size, depth, integers, duplicates);
    every error names the file."""
    from pathlib import Path
    what = what or Path(path).name
    return loads(read_sidecar(path, what), str(path), what)

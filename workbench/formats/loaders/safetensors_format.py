"""safetensors: a single file, a sharded checkpoint (index JSON) or a Hugging Face folder.

The header is parsed here (8-byte little-endian length, then JSON) so it can be validated
strictly and fuzzed; tensor data is read on demand with pread (loaders.region: a large
tensor row chunk by row chunk), one tensor at a time, so a model of any size opens in
milliseconds, statistics run in bounded memory, and a file truncated meanwhile is an error.
Format: https://github.com/huggingface/safetensors (header rules: offsets relative to the
end of the header, contiguous, non-overlapping, sizes = numel * itemsize).
"""

from __future__ import annotations

import math
import mmap
import os
from pathlib import Path

import numpy as np

from workbench.formats.dtypes import STORAGE
from workbench.core.errors import WorkbenchError
from workbench.formats.model import Model, TensorInfo

MAX_HEADER = 100 * 1024 * 1024
QUANT_META_KEY = "quant_workbench"


def parse_header(buf: bytes, file_size: int, path: str = "") -> tuple[dict, dict, int]:
    """Validate a safetensors header. Returns (entries, metadata, data_start).

    `buf` holds at least the first 8 + header-length bytes of the file.
    entries: name -> (dtype, shape tuple, begin, end) with offsets relative to data_start.
    """
    if len(buf) < 8 or file_size < 8:
        raise WorkbenchError("truncated file: no safetensors header", path=path)
    n = int.from_bytes(buf[:8], "little")
    if n == 0 or n > MAX_HEADER:
        raise WorkbenchError(f"not a safetensors file (header length {n} is invalid)", path=path)
    if 8 + n > file_size:
        raise WorkbenchError(f"truncated file: header says {n} bytes, file has {file_size - 8}",
                             path=path)
    raw = bytes(buf[8:8 + n])
    if len(raw) < n:
        raise WorkbenchError("truncated header", path=path)
    fast = _canonical_header(raw, file_size - 8 - n, path)
    if fast is not None:
        return fast[0], fast[1], 8 + n
    from workbench.core.limits import loads
    try:
        header = loads(raw, path, "safetensors header")
    except WorkbenchError as exc:
        msg = str(exc)
        msg = msg[len(path) + 2:] if path and msg.startswith(f"{path}: ") else msg
        if msg.startswith("malformed "):
            msg = msg[len("malformed "):]
        raise WorkbenchError(msg if msg.startswith("corrupt") else f"corrupt {msg}",
                             path=path) from None
    if not isinstance(header, dict):
        raise WorkbenchError("corrupt safetensors header (not a JSON object)", path=path)
    data_start = 8 + n
    data_size = file_size - data_start
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise WorkbenchError("corrupt safetensors header (__metadata__ is not an object)", path=path)
    entries = {}
    spans = []
    storage = STORAGE
    for name, e in header.items():
        # the common case in a few type checks; anything unusual takes _check_entry's path,
        # which names the problem (linear in the header, small constant per tensor)
        if type(e) is dict:
            dtype, shape, offs = e.get("dtype"), e.get("shape"), e.get("data_offsets")
            st = storage.get(dtype) if type(dtype) is str else None
            if (st is not None and type(shape) is list and type(offs) is list and len(offs) == 2
                    and type(offs[0]) is int and type(offs[1]) is int
                    and all(type(x) is int and x >= 0 for x in shape)):
                begin, end = offs
                n = 1
                for x in shape:
                    n *= x
                if 0 <= begin <= end <= data_size and end - begin == n * st[1]:
                    entries[name] = (dtype, tuple(shape), begin, end)
                    if end > begin:
                        spans.append((begin, end, name))
                    continue
        _check_entry(name, e, data_size, path)   # raises with the reason
        raise WorkbenchError("invalid header entry", path=path, tensor=name)  # pragma: no cover
    _check_spans(spans, path)
    return entries, {str(k): str(v) for k, v in metadata.items()}, data_start


# The header as safetensors writers lay it out (the Rust crate, the Python package, json.dumps
# with or without sort_keys): one object of tensor entries {"dtype", "shape", "data_offsets"},
# keys in that order or sorted, and at most one flat "__metadata__" object. Such a header is
# read with two regular-expression passes (about twice json.loads' speed on 300,000 entries;
# the same entries and errors); anything else takes the JSON path.
_W = r"[ \t\n\r]*"
_INT = r"(?:0|[1-9][0-9]{0,39})"      # JSON integers of at most limits.MAX_INT_DIGITS digits
_NAME = r'"([^"\\\x00-\x1f]*)"'    # a JSON string without escapes (checked: no backslash)
_FIELDS = {"dtype": rf'"dtype"{_W}:{_W}"([A-Za-z0-9_]+)"',
           "shape": rf'"shape"{_W}:{_W}\[{_W}((?:{_INT}(?:{_W},{_W}{_INT})*)?){_W}\]',
           "data_offsets": rf'"data_offsets"{_W}:{_W}\[{_W}({_INT}){_W},{_W}({_INT}){_W}\]'}
_META = rf'("__metadata__"{_W}:{_W}\{{[^{{}}\[\]]*\}})'


def _header_patterns():
    import re
    import sys
    out = []
    for order in (("dtype", "shape", "data_offsets"), ("data_offsets", "dtype", "shape")):
        body = f"{_W},{_W}".join(_FIELDS[k] for k in order)
        entry = rf"{_NAME}{_W}:{_W}\{{{_W}{body}{_W}\}}"
        item = rf"(?:{entry}|{_META})"
        plain = re.sub(r"\((?!\?)", "(?:", item)          # the same without capturing groups
        many = "*+" if sys.version_info >= (3, 11) else "*"   # possessive: 4x faster
        whole = re.compile(rf"{_W}\{{{_W}(?:{plain}(?:{_W},{_W}{plain}){many})?{_W}\}}{_W}")
        # the field groups of each order, as (dtype, shape, begin, end)
        groups = {"dtype": (1,), "shape": (2,), "data_offsets": (3, 4)}
        pos, k = {}, 1
        for f in order:
            for _ in groups[f]:
                pos.setdefault(f, []).append(k)
                k += 1
        sel = (pos["dtype"][0], pos["shape"][0], pos["data_offsets"][0], pos["data_offsets"][1])
        out.append((whole, re.compile(item), sel))
    return out


_PATTERNS = None


def _canonical_header(raw: bytes, data_size: int, path: str):
    """(entries, metadata) of a valid header in the layout above; None for any other header
    (the JSON path reads it then, and names its problem: an invalid entry, a duplicate name,
    an entry named __metadata__, two metadata objects)."""
    global _PATTERNS
    from workbench.core.limits import MAX_JSON_BYTES
    if b"\\" in raw or len(raw) > MAX_JSON_BYTES:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if _PATTERNS is None:
        _PATTERNS = _header_patterns()
    for whole, item, sel in _PATTERNS:
        if whole.fullmatch(text) is not None:
            break
    else:
        return None
    found = item.findall(text)
    if sel != (1, 2, 3, 4):   # the sorted key order: fields as (dtype, shape, begin, end)
        i_dt, i_sh, i_b, i_e = sel
        found = [(g[0], g[i_dt], g[i_sh], g[i_b], g[i_e], g[5]) for g in found]
    entries, spans, metas = {}, [], []
    shapes: dict[str, tuple] = {}
    storage = STORAGE
    for name, dtype, sh, b, e, meta in found:
        if meta:
            metas.append(meta)
            continue
        begin, end = int(b), int(e)
        shape = shapes.get(sh)
        if shape is None:
            dims = tuple(int(x) for x in sh.split(",")) if sh else ()
            n = 1
            for x in dims:
                n *= x
            shape = shapes[sh] = (dims, n)
        dims, n = shape
        st = storage.get(dtype)
        if st is None or not (end - begin == n * st[1] and begin <= end <= data_size):
            return None   # the JSON path names the problem (after a duplicate key, if any)
        entries[name] = (dtype, dims, begin, end)
        if end > begin:
            spans.append((begin, end, name))
    if len(metas) > 1 or len(entries) + len(metas) != len(found) or "__metadata__" in entries:
        return None
    metadata = {}
    if metas:
        from workbench.core.limits import loads
        try:
            obj = loads(metas[0][metas[0].index(":") + 1:], path, "safetensors header")
        except WorkbenchError:
            return None
        metadata = {str(k): str(v) for k, v in obj.items()}
    _check_spans(spans, path)
    return entries, metadata


def _check_spans(spans: list, path: str) -> None:
    spans.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise WorkbenchError(f"tensors '{n0}' and '{n1}' overlap in the file", path=path)


def _check_entry(name, e, data_size: int, path: str) -> None:
    """The reason a header entry is invalid, raised as a WorkbenchError."""
    if not isinstance(e, dict):
        raise WorkbenchError("header entry is not an object", path=path, tensor=name)
    dtype, shape, offs = e.get("dtype"), e.get("shape"), e.get("data_offsets")
    if not isinstance(dtype, str):
        raise WorkbenchError("header entry has no dtype", path=path, tensor=name)
    if dtype not in STORAGE:
        raise WorkbenchError(f"unsupported dtype {dtype}", path=path, tensor=name)
    if (not isinstance(shape, list)
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape)):
        raise WorkbenchError(f"invalid shape {shape!r}"[:200], path=path, tensor=name)
    if (not isinstance(offs, list) or len(offs) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offs)):
        raise WorkbenchError(f"invalid data_offsets {offs!r}"[:200], path=path, tensor=name)
    begin, end = offs
    expected = math.prod(shape) * STORAGE[dtype][1]
    if begin < 0 or end < begin:
        raise WorkbenchError(f"invalid data_offsets {offs}", path=path, tensor=name)
    if end - begin != expected:
        raise WorkbenchError(f"header says {end - begin} bytes but shape {shape} of {dtype} "
                             f"needs {expected}", path=path, tensor=name)
    if end > data_size:
        raise WorkbenchError(f"data ends at byte {end} but the file has only {data_size} data "
                             "bytes (truncated or lying header)", path=path, tensor=name)


class _File:
    """One safetensors file: header parsed eagerly, data mapped per tensor on demand."""

    def __init__(self, path: Path):
        self.path = str(path)
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            raise WorkbenchError("file not found", path=self.path) from None
        except OSError as exc:
            raise WorkbenchError(f"cannot open ({exc.strerror})", path=self.path) from None
        try:
            size = os.fstat(fd).st_size
            head = os.pread(fd, 8, 0)
            n = int.from_bytes(head, "little") if len(head) == 8 else 0
            buf = head + (os.pread(fd, min(n, MAX_HEADER), 8) if 0 < n <= MAX_HEADER else b"")
        finally:
            os.close(fd)
        self.size = size
        self.entries, self.metadata, self.data_start = parse_header(buf, size, self.path)

    def raw(self, name: str) -> np.ndarray:
        dtype, shape, begin, end = self.entries[name]
        np_dtype = STORAGE[dtype][0]
        n = math.prod(shape)
        if n == 0:
            return np.zeros(shape, dtype=np_dtype)
        try:
            # pread, not a memory map: a file truncated meanwhile is an error, not a SIGBUS
            from workbench.formats.loaders.region import tensor_region
            return tensor_region(self.path, self.data_start + begin, end - begin,
                               np_dtype).reshape(shape)
        except (OSError, ValueError) as exc:
            raise WorkbenchError(f"cannot map tensor data ({exc})", path=self.path,
                                 tensor=name) from None


_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
# tensors above this many bytes are mapped without MAP_POPULATE: populating a 1-2 GB embedding
# up front makes all of it resident at once, while chunked passes release the pages they are
# done with (workbench.core.pages) and keep the resident set to a chunk
POPULATE_MAX = 64 << 20


def map_region(path: str, offset: int, length: int, dtype) -> np.ndarray:
    """A read-only memory map of just these bytes of the file, as a 1-D array (no loader
    maps tensor data any more: a file truncated under a mapping ends the process with SIGBUS,
    loaders.region reads with pread; kept for workbench.core.pages' tests and callers of its own).

    The mapping is released when the array is. MAP_POPULATE (Linux) builds the page
    tables in one call instead of one page fault per 4 KiB while a kernel reads it, which
    made parallel statistics several times faster on page-cached files; regions above
    POPULATE_MAX are faulted in as they are read instead (bounded resident memory).
    """
    if not hasattr(mmap, "MAP_SHARED"):  # Windows
        return np.memmap(path, dtype=dtype, mode="r", offset=offset,
                         shape=(length // np.dtype(dtype).itemsize,))
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    fd = os.open(path, os.O_RDONLY)
    try:
        populate = _POPULATE if length <= POPULATE_MAX else 0
        mm = mmap.mmap(fd, length + (offset - start), flags=mmap.MAP_SHARED | populate,
                       prot=mmap.PROT_READ, offset=start)
    finally:
        os.close(fd)
    dtype = np.dtype(dtype)
    return np.frombuffer(mm, dtype=dtype, count=length // dtype.itemsize, offset=offset - start)


def _shard_files(path: Path) -> list[Path]:
    """Files that make up the checkpoint at `path` (file, index JSON or folder)."""
    if path.is_dir():
        idx = sorted(path.glob("*.safetensors.index.json"))
        if idx:
            return _shard_files(idx[0])
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise WorkbenchError("folder has no .safetensors files", path=str(path))
        return files
    if path.name.endswith(".index.json"):
        try:
            from workbench.core.limits import load_sidecar_json
            index = load_sidecar_json(path, "safetensors index")
            weight_map = index["weight_map"]
            shards = sorted(set(weight_map.values()))
            bad = [s for s in shards if not isinstance(s, str) or not s or "\0" in s]
            if bad or not shards:
                raise ValueError(f"weight_map must map tensor names to shard file names, "
                                 f"got {bad[0] if bad else 'nothing'!r}")
        except FileNotFoundError:
            raise WorkbenchError("file not found", path=str(path)) from None
        except WorkbenchError:
            raise
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise WorkbenchError(f"malformed safetensors index ({type(exc).__name__}: {exc})",
                                 path=str(path)) from None
        from workbench.core.limits import shard_path
        return [shard_path(path, s) for s in shards]
    return [path]


def _check_index_listing(root: Path, tensors: dict) -> None:
    """Every tensor an index lists must be in its shard (else it would silently vanish)."""
    idx = root if root.name.endswith(".index.json") else (
        next(iter(sorted(root.glob("*.safetensors.index.json"))), None) if root.is_dir() else None)
    if idx is None:
        return
    from workbench.core.limits import load_sidecar_json
    weight_map = load_sidecar_json(idx, "safetensors index")["weight_map"]
    missing = [n for n in weight_map if n not in tensors]
    if missing:
        raise WorkbenchError(f"the index lists {len(missing)} tensors that are not in their "
                             f"shards: {', '.join(str(m)[:80] for m in missing[:5])}",
                             path=str(idx))


def open_safetensors(path: str | os.PathLike) -> Model:
    from workbench.core.limits import gc_paused
    with gc_paused():   # 300,000 header entries and their infos, all kept
        return _open_safetensors(path)


def _open_safetensors(path: str | os.PathLike) -> Model:
    root = Path(path)
    files = [_File(p) for p in _shard_files(root)]
    owner: dict[str, _File] = {}
    tensors: dict[str, TensorInfo] = {}
    metadata: dict = {}
    if len(files) == 1:   # one pass at C speed where it can (a header may list 300,000)
        f = files[0]
        metadata.update(f.metadata)
        owner = dict.fromkeys(f.entries, f)
        tensors = {name: TensorInfo(name, shape, dtype, end - begin, f.path)
                   for name, (dtype, shape, begin, end) in f.entries.items()}
    for f in files if len(files) > 1 else ():
        metadata.update(f.metadata)
        for name, (dtype, shape, begin, end) in f.entries.items():
            if name in owner:
                raise WorkbenchError(f"tensor appears in two shards ({owner[name].path})",
                                     path=f.path, tensor=name)
            owner[name] = f
            tensors[name] = TensorInfo(name, shape, dtype, end - begin, f.path)

    _check_index_listing(root, tensors)
    if QUANT_META_KEY in metadata:
        from workbench.formats.loaders.quantized_format import open_quantized
        return open_quantized(str(root), files, tensors, owner, metadata)

    def raw(name: str) -> np.ndarray:
        info = tensors[name]
        return owner[name].raw(name).reshape(info.matrix_shape)

    return Model(str(root), "safetensors", tensors, raw, metadata)

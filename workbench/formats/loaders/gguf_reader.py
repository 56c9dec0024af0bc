"""A GGUF reader: the header parsed once with struct over the file's first bytes (read as far
as the header goes, never the whole file: a valid GGUF followed by 100 GB of sparse padding
costs its header's bytes), tensor data read with pread (workbench.formats.loaders.region).

The `gguf` package's GGUFReader builds a numpy view for every part of every key/value, which
takes 2.3 s on MiniLM's 30,522-token vocabulary (and grows with the vocabulary); this parses
the same header in tens of milliseconds. The file is assumed to have passed
``workbench.core.limits.prescan_gguf`` (bounded arrays, strings within the file); everything it
reads is still range-checked here, and any inconsistency is a WorkbenchError naming the file.

    f = GGUFFile(path)
    f.fields["general.architecture"].contents()  -> "llama"
    f.fields[key].types   -> [GGUFValueType.ARRAY, GGUFValueType.STRING] for a string array
    f.fields[key].value   -> scalars as Python values (strings as bytes); number arrays as
                             numpy arrays; string arrays as lists of bytes; nested arrays as lists
    t = f.tensors[0]; t.name, t.shape (ne, innermost first), t.tensor_type, t.n_bytes, t.data
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

import numpy as np

from workbench.core.errors import WorkbenchError

_FIXED = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1",
          10: "<u8", 11: "<i8", 12: "<f8"}
_STRUCT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B",
           10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY, _BOOL = 8, 9, 7
DEFAULT_ALIGNMENT = 32

# numpy dtype of the plain tensor types' data (quantized types are uint8 blocks)
_PLAIN_NP = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64,
             "I8": np.int8, "I16": np.int16, "I32": np.int32, "I64": np.int64}


@dataclass
class GGUFField:
    name: str
    types: list            # [main type] or [ARRAY, item type(, nested item type ...)]
    value: object

    def contents(self):
        """The value as plain Python: strings decoded (UTF-8, invalid bytes replaced), arrays
        as lists."""
        return _plain(self.value)


def _plain(v):
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


@dataclass
class GGUFTensor:
    name: str
    shape: list            # ne: innermost (row length) first, as GGUF stores it
    tensor_type: object    # gguf.GGMLQuantizationType
    n_elements: int
    n_bytes: int
    data_offset: int       # absolute offset in the file
    _file: "GGUFFile" = field(repr=False, default=None)

    @property
    def data(self) -> np.ndarray:
        """A read-only flat view of the tensor's data: float/int for the plain types (BF16 as
        uint16 bits), uint8 bytes for block types."""
        np_t = _PLAIN_NP.get(self.tensor_type.name)
        if self.n_bytes == 0:
            return np.zeros(0, np_t or np.uint8)
        # pread, not the header's memory map: a file truncated meanwhile is an error naming
        # it, not a SIGBUS (workbench.formats.loaders.region)
        from workbench.formats.loaders.region import tensor_region
        return tensor_region(self._file.path, self.data_offset, self.n_bytes, np_t or np.uint8)


class GGUFFile:
    def __init__(self, path: str | os.PathLike):
        import gguf
        self.path = str(path)
        self._fh = open(self.path, "rb")
        try:
            self._parse(gguf)
        finally:
            self.close()   # the header is parsed; tensor data is read with pread

    def _parse(self, gguf) -> None:
        size = os.fstat(self._fh.fileno()).st_size
        if size < 24:
            raise WorkbenchError("truncated GGUF header", path=self.path)
        self._mm = b""     # the file's first bytes, read as the header needs them (_have)
        self.size = size
        self._pos = 0
        self.fields: dict[str, GGUFField] = {}
        self.tensors: list[GGUFTensor] = []
        VT = gguf.GGUFValueType
        if self._read(4) != b"GGUF":
            raise WorkbenchError("not a GGUF file", path=self.path)
        version = self._unpack("<I")
        if version not in (2, 3):
            raise WorkbenchError(f"unsupported GGUF version {version}"
                                 + (" (a big-endian file?)" if version > 0xFFFF else ""),
                                 path=self.path)
        self.version = version
        n_tensors, n_kv = self._unpack("<Q"), self._unpack("<Q")
        if n_kv > size // 13 or n_tensors > size // 24:
            raise WorkbenchError(f"GGUF header claims {n_kv:,} keys and {n_tensors:,} tensors, "
                                 f"more than a {size:,}-byte file can hold", path=self.path)
        for _ in range(n_kv):
            key = self._string("key").decode("utf-8", "replace")
            t = self._unpack("<I")
            types: list = []
            value = self._value(t, types, 0, VT)
            if key in self.fields:
                raise WorkbenchError(f"GGUF key {key!r} appears twice", path=self.path)
            self.fields[key] = GGUFField(key, types, value)
        align = self.fields.get("general.alignment")
        self.alignment = DEFAULT_ALIGNMENT
        if align is not None:
            a = align.value
            if align.types != [VT.UINT32] or not a or a & (a - 1):
                raise WorkbenchError(f"GGUF general.alignment {align.contents()!r} is not a "
                                     "power of two (uint32)", path=self.path)
            self.alignment = int(a)
        infos = []
        seen = set()
        for _ in range(n_tensors):
            name = self._string("tensor name").decode("utf-8", "replace")
            if name in seen:
                raise WorkbenchError(f"GGUF tensor {name!r} appears twice", path=self.path)
            seen.add(name)
            n_dims = self._unpack("<I")
            if n_dims > 4:
                raise WorkbenchError(f"GGUF tensor with {n_dims} dimensions", path=self.path,
                                     tensor=name)
            dims = [self._unpack("<Q") for _ in range(n_dims)]
            ttype, offset = self._unpack("<I"), self._unpack("<Q")
            infos.append((name, dims, ttype, offset))
        self.data_offset = -(-self._pos // self.alignment) * self.alignment
        for name, dims, ttype, offset in infos:
            try:
                qt = gguf.GGMLQuantizationType(ttype)
                block, type_size = gguf.GGML_QUANT_SIZES[qt]
            except (ValueError, KeyError):
                raise WorkbenchError(f"unknown GGML tensor type {ttype}", path=self.path,
                                     tensor=name) from None
            n = 1
            for d in dims:
                n *= int(d)
            if n % block:
                raise WorkbenchError(f"{qt.name} tensor of {n} values is not whole blocks of "
                                     f"{block}", path=self.path, tensor=name)
            nbytes = n // block * type_size
            if offset % self.alignment:
                raise WorkbenchError(f"tensor data offset {offset:,} breaks the file's "
                                     f"{self.alignment}-byte alignment (shifted or corrupt "
                                     "tensor info)", path=self.path, tensor=name)
            start = self.data_offset + offset
            if offset > size or start + nbytes > size:
                raise WorkbenchError(f"tensor data ({nbytes:,} bytes at offset {offset:,}) runs "
                                     "past the end of the file", path=self.path, tensor=name)
            self.tensors.append(GGUFTensor(name, dims, qt, n, nbytes, start, self))

    # -- parsing ---------------------------------------------------------------------------
    HEADER_STEP = 1 << 20   # the header is read in steps of at least this (doubling)

    def _have(self, end: int) -> None:
        """The file's bytes up to `end` (within the file) in self._mm."""
        if end <= len(self._mm):
            return
        want = min(self.size, max(end, 2 * len(self._mm), self.HEADER_STEP))
        self._fh.seek(len(self._mm))
        more = self._fh.read(want - len(self._mm))
        if len(self._mm) + len(more) < end:
            raise WorkbenchError("truncated GGUF header (the file shrank while read)",
                                 path=self.path)
        self._mm = self._mm + more

    def _need(self, n: int) -> None:
        if n < 0 or self._pos + n > self.size:
            raise WorkbenchError("truncated GGUF header", path=self.path)
        self._have(self._pos + n)

    def _read(self, n: int) -> bytes:
        self._need(n)
        b = self._mm[self._pos:self._pos + n]
        self._pos += n
        return b

    def _unpack(self, fmt: str):
        n = struct.calcsize(fmt)
        self._need(n)
        (v,) = struct.unpack_from(fmt, self._mm, self._pos)
        self._pos += n
        return v

    def _string(self, what: str) -> bytes:
        n = self._unpack("<Q")
        if n > self.size - self._pos:
            raise WorkbenchError(f"GGUF {what} of {n:,} bytes runs past the file", path=self.path)
        return self._read(n)

    def _value(self, t: int, types: list, depth: int, VT):
        try:
            types.append(VT(t))
        except ValueError:
            raise WorkbenchError(f"unknown GGUF value type {t}", path=self.path) from None
        if t in _FIXED:
            v = self._unpack(_STRUCT[t])
            return bool(v) if t == _BOOL else v
        if t == _STRING:
            return self._string("string")
        if depth >= 3:
            raise WorkbenchError("GGUF arrays nested more than 3 deep", path=self.path)
        sub = self._unpack("<I")
        n = self._unpack("<Q")
        if sub in _FIXED:
            dt = np.dtype(_FIXED[sub])
            if n > (self.size - self._pos) // dt.itemsize:
                raise WorkbenchError(f"GGUF array of {n:,} items runs past the file",
                                     path=self.path)
            self._have(self._pos + n * dt.itemsize)
            arr = np.frombuffer(self._mm, dt, n, self._pos).copy()  # not a view of the map
            self._pos += n * dt.itemsize
            try:
                types.append(VT(sub))
            except ValueError:
                raise WorkbenchError(f"unknown GGUF value type {sub}", path=self.path) from None
            return arr.astype(bool) if sub == _BOOL else arr
        if n > (self.size - self._pos) // 8:
            raise WorkbenchError(f"GGUF array of {n:,} items runs past the file", path=self.path)
        if sub == _STRING:
            try:
                types.append(VT(sub))
            except ValueError:  # pragma: no cover - STRING is a member
                raise
            out = []
            mm, pos, size = self._mm, self._pos, self.size
            have = len(mm)
            unpack = struct.unpack_from
            for _ in range(n):
                if pos + 8 > size:
                    raise WorkbenchError("truncated GGUF header", path=self.path)
                if pos + 8 > have:
                    self._have(pos + 8)
                    mm = self._mm
                    have = len(mm)
                (ln,) = unpack("<Q", mm, pos)
                pos += 8
                if ln > size - pos:
                    raise WorkbenchError(f"GGUF string of {ln:,} bytes runs past the file",
                                         path=self.path)
                if pos + ln > have:
                    self._have(pos + ln)
                    mm = self._mm
                    have = len(mm)
                out.append(mm[pos:pos + ln])
                pos += ln
            self._pos = pos
            return out
        if sub != _ARRAY:
            raise WorkbenchError(f"unknown GGUF value type {sub}", path=self.path)
        out = []
        sub_types: list = []
        for _ in range(n):
            sub_types = []
            out.append(self._value(sub, sub_types, depth + 1, VT))
        types.extend(sub_types or [VT.ARRAY])
        return out

    def close(self) -> None:
        fh = getattr(self, "_fh", None)
        if fh is not None:
            fh.close()
        self._mm = b""

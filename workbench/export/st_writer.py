"""A streaming safetensors writer: tensors are written one at a time, never all held.

The data section is streamed to a temporary file while the header is collected, then the
final file (header + data) is assembled in a second temporary file and renamed over the
target, so an existing file is never left half-written. The `safetensors` library's
`save_file` needs every tensor in memory at once, which a multi-GB export cannot afford.
"""

from __future__ import annotations

import errno
import contextlib
import json
import math
import os
import shutil
from pathlib import Path

import numpy as np

from workbench.core.atomic import atomic_write, make_temp
from workbench.formats.dtypes import NUMPY_TO_ST
from workbench.core.errors import WorkbenchError


def _write_error(path, exc: OSError) -> WorkbenchError:
    why = "disk full" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
    return WorkbenchError(f"write failed ({why}); existing file left unchanged", path=str(path))


class StreamingSafetensorsWriter:
    def __init__(self, path, metadata: dict[str, str] | None = None):
        self.path = Path(path)
        self.metadata = dict(metadata or {})
        self.header: dict = {}
        self.offset = 0
        fd, self._tmp = make_temp(self.path, ".data")
        self._fh = os.fdopen(fd, "wb")

    def add(self, name: str, array: np.ndarray, dtype: str | None = None) -> None:
        """Append one tensor. `dtype` overrides the safetensors dtype (e.g. BF16 for uint16 bits)."""
        if name in self.header:
            raise WorkbenchError("duplicate tensor name in export", path=str(self.path), tensor=name)
        arr = np.ascontiguousarray(array)
        st = dtype or NUMPY_TO_ST.get(arr.dtype)
        if st is None:
            raise WorkbenchError(f"cannot store dtype {arr.dtype}", path=str(self.path), tensor=name)
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        data = arr.tobytes()
        try:
            self._fh.write(data)
        except OSError as exc:
            self.abort()
            raise _write_error(self.path, exc) from None
        self.header[name] = {"dtype": st, "shape": list(arr.shape),
                             "data_offsets": [self.offset, self.offset + len(data)]}
        self.offset += len(data)

    def add_stream(self, name: str, parts, dtype: str | None = None,
                   shape: tuple | None = None) -> tuple[int, ...]:
        """Append one tensor given as row blocks (arrays concatenated along axis 0, each
        written as it comes: the whole tensor is never held). Returns its shape: the blocks'
        rows and row shape, or `shape` when given (the blocks then hold its bytes in order,
        e.g. flat slices)."""
        if name in self.header:
            raise WorkbenchError("duplicate tensor name in export", path=str(self.path), tensor=name)
        begin, rows, tail, st = self.offset, 0, None, dtype
        for part in parts:
            arr = np.ascontiguousarray(part)
            if arr.dtype.byteorder == ">":
                arr = arr.astype(arr.dtype.newbyteorder("<"))
            st = st or NUMPY_TO_ST.get(arr.dtype)
            if st is None:
                raise WorkbenchError(f"cannot store dtype {arr.dtype}", path=str(self.path),
                                     tensor=name)
            if tail is not None and arr.shape[1:] != tail:
                raise WorkbenchError("internal error: row blocks of different shapes",
                                     path=str(self.path), tensor=name)
            tail = arr.shape[1:]
            rows += arr.shape[0] if arr.ndim else 1
            try:
                self._fh.write(memoryview(arr.reshape(-1).view(np.uint8)))
            except OSError as exc:
                self.abort()
                raise _write_error(self.path, exc) from None
            self.offset += arr.nbytes
        if shape is None:
            shape = (rows, *(tail or ()))
        else:
            shape = tuple(int(s) for s in shape)
            itemsize = arr.dtype.itemsize if tail is not None else 0
            if math.prod(shape) * itemsize != self.offset - begin or (
                    tail is None and math.prod(shape)):
                raise WorkbenchError("internal error: streamed bytes do not fill the shape",
                                     path=str(self.path), tensor=name)
        self.header[name] = {"dtype": st, "shape": list(shape),
                             "data_offsets": [begin, self.offset]}
        return shape

    def finish(self) -> None:
        try:
            try:
                self._fh.close()  # flushes the last buffered data: may hit a full disk
            except OSError as exc:
                raise _write_error(self.path, exc) from None
            head = dict(self.header)
            if self.metadata:
                head["__metadata__"] = self.metadata
            blob = json.dumps(head, separators=(",", ":")).encode("utf-8")
            blob += b" " * ((-len(blob)) % 8)
            with atomic_write(self.path, "wb") as out:
                out.write(len(blob).to_bytes(8, "little"))
                out.write(blob)
                with open(self._tmp, "rb") as src:
                    shutil.copyfileobj(src, out, 16 << 20)
        finally:
            self.abort()

    def abort(self) -> None:
        """Remove the temporary data; never raises (a full disk must not hide the first error)."""
        try:
            if not self._fh.closed:
                self._fh.close()
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                os.unlink(self._tmp)

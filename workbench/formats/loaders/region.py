"""Reading tensor bytes so that an input shrinking under a running job is an error, not a crash.

A memory map of a file that another process truncates delivers SIGBUS on the next touch of a
page past the new end: the process dies with nothing printed. Tensor data is therefore never
read through a memory map: up to ``PREAD_LIMIT`` bytes it is read whole with pread into a
buffer of its own (one tensor at a time, as every model-level job holds it); a larger tensor
is a :class:`Region`, which reads the rows asked for with pread when sliced (the chunked
passes take ~64 MB of rows at a time, so memory stays bounded whatever the tensor's size). A
short read is a WorkbenchError naming the file, raised before anything is written, and the
exporters' atomic writes leave no partial output.
"""

from __future__ import annotations

import os

import numpy as np

from workbench.core.errors import WorkbenchError


#: tensors above this many bytes are Regions (read by rows); QW_PREAD_LIMIT sets it (tests
#: exercise the Region path on small files with it)
PREAD_LIMIT = int(os.environ.get("QW_PREAD_LIMIT", 512 << 20))


def tensor_region(path: str, offset: int, length: int, dtype):
    """The tensor's bytes as a read-only 1-D array of `dtype` read with pread, up to
    PREAD_LIMIT bytes; above it a Region of them (rows read when sliced)."""
    if length <= PREAD_LIMIT:
        return read_region(path, offset, length, dtype)
    dtype = np.dtype(dtype)
    return Region(path, offset, dtype, (length // dtype.itemsize,))


class Region:
    """A tensor's bytes in a file, read with pread on demand: the few ndarray operations the
    chunked passes use, on the first axis, without reading the rest.

    * ``shape``, ``dtype``, ``ndim``, ``size``, ``nbytes``, ``len()``: no read;
    * ``reshape(...)`` (``-1`` allowed) and ``view(dtype)`` of the same item size: another
      Region over the same bytes, no read;
    * ``region[r0:r1]`` / ``region[i]`` / ``region[index array]`` (rows, a step of 1):
      those rows read into a read-only ndarray; a tuple index reads its first axis's rows,
      then applies the rest;
    * anything else (``np.asarray(region)``, other indexing, ndarray methods): the whole
      tensor read once into an ndarray, then the operation on it (correct, but it holds the
      tensor: the streaming passes only slice rows).
    """

    __slots__ = ("path", "offset", "dtype", "shape")

    def __init__(self, path: str, offset: int, dtype, shape: tuple):
        self.path, self.offset = path, offset
        self.dtype, self.shape = np.dtype(dtype), tuple(int(s) for s in shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __repr__(self) -> str:
        return (f"Region({self.path!r}, offset={self.offset}, dtype={self.dtype}, "
                f"shape={self.shape})")

    def reshape(self, *shape) -> "Region":
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = tuple(int(s) for s in shape)
        if shape.count(-1) == 1:
            rest = 1
            for s in shape:
                rest *= s if s != -1 else 1
            if rest == 0 or self.size % rest:
                raise ValueError(f"cannot reshape a region of {self.size} items into {shape}")
            shape = tuple(self.size // rest if s == -1 else s for s in shape)
        n = 1
        for s in shape:
            n *= s
        if n != self.size or any(s < 0 for s in shape):
            raise ValueError(f"cannot reshape a region of {self.size} items into {shape}")
        return Region(self.path, self.offset, self.dtype, shape)

    def view(self, dtype=None, *args, **kw):
        dt = np.dtype(dtype) if dtype is not None else self.dtype
        if not args and not kw and dt.itemsize == self.dtype.itemsize:
            return Region(self.path, self.offset, dt, self.shape)
        return np.asarray(self).view(dtype, *args, **kw)

    def _row_bytes(self) -> int:
        n = self.dtype.itemsize
        for s in self.shape[1:]:
            n *= s
        return n

    def _rows(self, r0: int, r1: int) -> np.ndarray:
        rb = self._row_bytes()
        n = max(0, r1 - r0)
        out = read_region(self.path, self.offset + r0 * rb, n * rb, self.dtype)
        return out.reshape((n, *self.shape[1:]))

    def __getitem__(self, key):
        if isinstance(key, tuple):
            if not key:
                return np.asarray(self)
            first = self[key[0]] if not isinstance(key[0], type(Ellipsis)) else np.asarray(self)
            rest = key[1:]
            if isinstance(key[0], (int, np.integer)):
                return first[rest] if rest else first
            return first[(slice(None), *rest)] if rest else first
        if not self.shape:
            return np.asarray(self)[key]
        rows = self.shape[0]
        if isinstance(key, slice):
            start, stop, step = key.indices(rows)
            if step == 1:
                return self._rows(start, max(start, stop))
            return np.asarray(self)[key]
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            i = int(key)
            if not -rows <= i < rows:
                raise IndexError(f"index {i} is out of bounds for axis 0 with size {rows}")
            i %= rows
            return self._rows(i, i + 1)[0]
        idx = np.asarray(key)
        if idx.dtype.kind in "iu" and idx.ndim == 1:
            if idx.size and (idx.min() < -rows or idx.max() >= rows):
                raise IndexError(f"index out of bounds for axis 0 with size {rows}")
            idx = idx % rows if rows else idx
            out = np.empty((idx.size, *self.shape[1:]), self.dtype)
            order = np.argsort(idx, kind="stable")
            k = 0
            while k < idx.size:   # runs of consecutive rows, one read each
                j = k
                while j + 1 < idx.size and idx[order[j + 1]] <= idx[order[j]] + 1:
                    j += 1
                lo, hi = int(idx[order[k]]), int(idx[order[j]]) + 1
                block = self._rows(lo, hi)
                for m in range(k, j + 1):
                    out[order[m]] = block[int(idx[order[m]]) - lo]
                k = j + 1
            out.flags.writeable = False
            return out
        return np.asarray(self)[key]

    def __array__(self, dtype=None, copy=None):
        a = read_region(self.path, self.offset, self.nbytes, self.dtype).reshape(self.shape)
        return a if dtype is None else a.astype(dtype)

    def __getattr__(self, name):
        # any other ndarray attribute or method: on the whole tensor, read once
        if name.startswith("__") or name in Region.__slots__:
            raise AttributeError(name)
        return getattr(np.asarray(self), name)


def read_region(path: str, offset: int, length: int, dtype) -> np.ndarray:
    """`length` bytes of the file at `offset` as a read-only 1-D array of `dtype` (copied with
    pread; a file that ends early is a WorkbenchError naming it)."""
    dtype = np.dtype(dtype)
    out = np.empty(length // dtype.itemsize, dtype)
    buf = memoryview(out.view(np.uint8).reshape(-1))
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise WorkbenchError(f"cannot reopen the file ({exc.strerror}): it was removed or "
                             "replaced while in use", path=path) from None
    try:
        got = 0
        while got < length:
            try:
                k = os.preadv(fd, [buf[got:]], offset + got)
            except OSError as exc:
                raise WorkbenchError(f"read failed at byte {offset + got:,} ({exc.strerror})",
                                     path=path) from None
            if k == 0:
                raise WorkbenchError(f"the file ends at byte {offset + got:,}, before the tensor "
                                     f"data it held ({offset + length:,}): it was truncated or "
                                     "replaced while in use; nothing was written", path=path)
            got += k
    finally:
        os.close(fd)
    out.flags.writeable = False
    return out

"""Reading tensor bytes so that an input shrinking under a running job is an error, not a crash.

A memory map of a file that another process truncates delivers SIGBUS on the next touch of a
page past the new end: the process dies with nothing printed. Tensor data up to
``PREAD_LIMIT`` bytes is therefore read with pread into a buffer of its own (one tensor at a
time, as every model-level job holds it): a short read is a WorkbenchError naming the file,
raised before anything is written, and the exporters' atomic writes leave no partial output.
Larger tensors stay memory-mapped (streamed row chunk by row chunk, never all resident).
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import WorkbenchError


PREAD_LIMIT = 512 << 20


def tensor_region(path: str, offset: int, length: int, dtype) -> np.ndarray:
    """The tensor's bytes as a read-only 1-D array: read with pread up to PREAD_LIMIT bytes,
    a memory map of just this region above it."""
    if length <= PREAD_LIMIT:
        return read_region(path, offset, length, dtype)
    from .safetensors_format import map_region
    return map_region(path, offset, length, dtype)


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

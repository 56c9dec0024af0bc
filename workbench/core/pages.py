"""Resident memory of memory-mapped tensor data: let go of pages a pass is done with.

Touching a page of a file mapping makes it part of the process's resident set (RSS) for as
long as the mapping lives, so one pass over a 1 GB embedding held in one mapping grows RSS by
1 GB, and a pass over a checkpoint larger than RAM would make the kernel reclaim other
memory first. `release(view)` drops the pages under a view of a mapping (madvise
MADV_DONTNEED): the data stays in the page cache and is read back if touched again, so it
is always safe, only a cost if the same rows are read again soon. Chunked passes call it
after each chunk; a view that is not of a mapping (an in-memory array) is left alone.
"""

from __future__ import annotations

import mmap

import numpy as np

PAGE = mmap.PAGESIZE
_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)


def _mapping(arr):
    """The mmap under a numpy view (through .base / memoryview.obj), else None."""
    x = arr
    for _ in range(16):
        if isinstance(x, mmap.mmap):
            return x
        if isinstance(x, np.ndarray):
            x = x.base
        elif isinstance(x, memoryview):
            x = x.obj
        else:
            return None
    return None


def release(view) -> int:
    """Drop the resident pages under `view` (a contiguous view of a mapping); bytes released.
    0 when it is not a mapped view or the platform has no madvise."""
    if _DONTNEED is None or not isinstance(view, np.ndarray) or view.size == 0:
        return 0
    mm = _mapping(view)
    if mm is None or mm.closed:
        return 0
    try:
        start = view.ctypes.data - np.frombuffer(mm, np.uint8, count=1).ctypes.data
        length = view.nbytes if view.flags.c_contiguous else (
            view[-1].ctypes.data + view[-1].nbytes - view.ctypes.data if view.ndim else view.nbytes)
        lo = max(0, start - start % PAGE)
        hi = min(len(mm), start + length)
        if hi <= lo:
            return 0
        mm.madvise(_DONTNEED, lo, hi - lo)
        return hi - lo
    except (ValueError, OSError, TypeError, BufferError):
        return 0

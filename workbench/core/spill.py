"""Arrays on disk for model-level work whose results outgrow RAM.

A model's per-parameter results are as large as the model: the Fisher diagonal of an 8 B
model is 32 GB as float32, GPTQ's Hessians of its 224 Linear layers 78 GB as float64. They are
produced one block at a time and read back one tensor (or one row chunk) at a time, so they
live in memory-mapped files:

* ``zeros(shape)``: a float32 (or other) array backed by a file in the temporary folder
  (``QUANT_WORKBENCH_SPILL_DIR``, else the system's); the file is unlinked as soon as it is
  mapped, so the disk space returns when the last view of the array goes, whatever happens
  (no cleanup to forget, nothing left after a crash);
* ``to_disk(a)``: a copy of an in-memory array in such a file (the RAM copy can then go);
* ``add_squares``, ``add_into``, ``contiguous``, ``any_nonzero``: passes over such arrays a
  row chunk at a time that release each chunk's pages after it (`workbench.core.pages.release`),
  and the whole array at the end (a page fault maps up to 64 kB of neighbouring cached pages
  back in: the kernel's fault-around), so resident memory stays about one chunk whatever the
  array's size.

Small arrays (below ``MIN_BYTES``) stay in RAM: a file per norm weight would cost more than
it saves.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

from workbench.core.pages import release

MIN_BYTES = 1 << 20            # smaller arrays stay in memory
CHUNK_ELEMENTS = 1 << 24       # elements per pass chunk (64 MB float32)


def spill_dir() -> str:
    return os.environ.get("QUANT_WORKBENCH_SPILL_DIR") or tempfile.gettempdir()


def zeros(shape, dtype=np.float32) -> np.ndarray:
    """A zero-filled array of `shape`: in RAM when small, else a memory-mapped unlinked file."""
    shape = tuple(int(s) for s in shape)
    dtype = np.dtype(dtype)
    if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize < MIN_BYTES:
        return np.zeros(shape, dtype)
    fd, path = tempfile.mkstemp(prefix="qw-spill-", suffix=".bin", dir=spill_dir())
    try:
        os.close(fd)
        arr = np.memmap(path, dtype=dtype, mode="w+", shape=shape)
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    return arr


def _rows(a: np.ndarray) -> np.ndarray:
    """`a` as a 2-D view (rows = the first axis; a scalar or 1-D array is one row)."""
    if a.ndim == 0:
        return a.reshape(1, 1)
    if a.ndim == 1:
        return a.reshape(1, -1)
    return a.reshape(a.shape[0], -1)


def _step(cols: int) -> int:
    return max(1, CHUNK_ELEMENTS // max(int(cols), 1))


def to_disk(a) -> np.ndarray:
    """`a` (an array) copied into `zeros` of its shape and dtype (returned as is when small)."""
    a = np.asarray(a)
    out = zeros(a.shape, a.dtype)
    if not isinstance(out, np.memmap):
        out[...] = a
        return out
    add_into(out, a, assign=True)
    return out


def add_into(dst: np.ndarray, src, assign: bool = False) -> None:
    """dst += src (or dst[...] = src with `assign`) a row chunk at a time, releasing the
    chunks of a mapped `dst` and `src` as it goes. Same shapes; `dst` C-contiguous."""
    d2 = _rows(dst)
    s2 = _rows(np.asarray(src))
    step = _step(d2.shape[1])
    for r0 in range(0, d2.shape[0], step):
        d, s = d2[r0:r0 + step], s2[r0:r0 + step]
        if assign:
            d[...] = s
        else:
            d += s
        release(d)
        release(s)
    release(dst)


def add_squares(dst: np.ndarray, grad, scale: float = 1.0) -> None:
    """dst += scale * grad**2, a row chunk at a time (`grad`: a torch tensor on any device, or
    an array, of dst's shape); a mapped `dst`'s pages are released after each chunk."""
    d2 = _rows(dst)
    is_torch = not isinstance(grad, np.ndarray)
    g2 = grad.reshape(d2.shape[0], -1) if is_torch else _rows(np.asarray(grad))
    if is_torch and not isinstance(dst, np.memmap) and d2.flags.c_contiguous \
            and dst.dtype == np.float32 and g2.dtype == _torch_f32() and g2.device.type == "cpu":
        import torch                     # in RAM: one multithreaded pass, no temporaries
        torch.from_numpy(d2).addcmul_(g2.detach(), g2.detach(), value=float(scale))
        return
    step = _step(d2.shape[1])
    for r0 in range(0, d2.shape[0], step):
        g = g2[r0:r0 + step]
        if is_torch:
            g = g.detach().float().cpu().numpy()
        sq = np.square(g, dtype=np.float32)
        if scale != 1.0:
            sq *= np.float32(scale)
        d = d2[r0:r0 + step]
        d += sq
        release(d)
    release(dst)        # the kernel's fault-around re-maps neighbours of later chunks


def _torch_f32():
    import torch
    return torch.float32


def add_row_squares(dst: np.ndarray, rows, grad, scale: float = 1.0) -> None:
    """dst[rows] += scale * grad**2 for distinct `rows` (a sparse gradient's: an embedding's
    rows seen in a batch; `grad` a torch tensor or an array, one row per index), a row chunk
    at a time, squared as `add_squares` squares them."""
    d2 = _rows(dst)
    rows = np.asarray(rows, np.int64).reshape(-1)
    is_torch = not isinstance(grad, np.ndarray)
    g2 = grad.reshape(len(rows), -1) if is_torch else np.asarray(grad).reshape(len(rows), -1)
    step = _step(d2.shape[1])
    for r0 in range(0, len(rows), step):
        g = g2[r0:r0 + step]
        if is_torch:
            g = g.detach().float().cpu().numpy()
        sq = np.square(g, dtype=np.float32)
        if scale != 1.0:
            sq *= np.float32(scale)
        d2[rows[r0:r0 + step]] += sq
    release(dst)


def contiguous(a: np.ndarray) -> np.ndarray:
    """A C-contiguous float32 array with `a`'s values: `a` itself when it already is one, else
    a copy made a row chunk at a time (into a mapped file when large)."""
    if a.flags.c_contiguous and a.dtype == np.float32:
        return a
    out = zeros(a.shape, np.float32)
    if a.ndim < 2:
        out[...] = a
        return out
    step = _step(int(np.prod(a.shape[1:])))
    for r0 in range(0, a.shape[0], step):
        out[r0:r0 + step] = a[r0:r0 + step]
        release(out[r0:r0 + step])
    release(out)
    return out


def any_nonzero(a: np.ndarray) -> bool:
    """Whether any element of `a` is non-zero, a row chunk at a time (pages released)."""
    a2 = _rows(a)
    step = _step(a2.shape[1])
    for r0 in range(0, a2.shape[0], step):
        c = a2[r0:r0 + step]
        hit = bool(np.any(c))
        release(c)
        if hit:
            release(a)
            return True
    release(a)
    return False

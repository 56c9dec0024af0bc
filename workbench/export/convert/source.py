"""A GGUF's tensors as float32, read row chunk by row chunk, each through an optional change.

:class:`FloatView` decodes a GGUF model's tensors with the project's own dequantizer (the
kernels through ``accel.dequantize`` for the GGML block types the scheme registry has, the
loader's ``decode_rows`` otherwise) and applies a per-tensor :class:`Change` (row and column
scales, or a constant fill: workbench.export.convert.off_grid). Nothing is held beyond the rows asked
for. :meth:`FloatView.as_model` wraps the view as a float32 ``Model`` with the source's names,
metadata and GGUF reader, so the runner (tensor-name mapping, rope un-permutation) and the GGUF
exporter (metadata copied from the source) read the changed tensors as if they were stored.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.formats.dtypes import STORAGE, decode_rows
from workbench.core.errors import WorkbenchError, context
from workbench.formats.model import Model, TensorInfo

CHUNK_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class Change:
    """W' = diag(rows) · W · diag(cols) of a tensor's (rows x cols) matrix, or the constant
    `fill` (an identity norm)."""
    rows: np.ndarray | None = None
    cols: np.ndarray | None = None
    fill: float | None = None

    def apply(self, w: np.ndarray, r0: int) -> np.ndarray:
        if self.fill is not None:
            return np.full(w.shape, self.fill, np.float32)
        w = np.array(w, np.float32)            # a copy: the decoded rows may be a shared buffer
        if self.cols is not None:
            w *= self.cols[None, :]
        if self.rows is not None:
            w *= self.rows[r0:r0 + w.shape[0], None]
        return w


def decode(model: Model, name: str, r0: int, r1: int) -> np.ndarray:
    """float32 rows r0:r1 of a loader's tensor (matrix form)."""
    info = model.info(name)
    raw = model.raw(name)[r0:r1]
    if info.dtype not in STORAGE and np.size(raw):
        try:
            from workbench.quant.accel import dequantize
            from workbench.schemes import get_scheme
            from workbench.schemes.base import QuantizedTensor
            scheme = get_scheme(info.dtype.lower())
            qt = QuantizedTensor(scheme.name, (int(raw.shape[0]), info.cols),
                                 {"blocks": np.ascontiguousarray(raw, np.uint8)})
            with context(info.file or model.path, name):
                return np.asarray(dequantize(qt, backend="cpu"), np.float32).reshape(
                    raw.shape[0], info.cols)
        except (WorkbenchError, ImportError, KeyError):
            pass                                 # a type only the loader's decoder knows
    with context(info.file or model.path, name):
        return decode_rows(raw, info)


class FloatView:
    def __init__(self, model: Model, changes: dict | None = None):
        self.model = model
        self.changes = dict(changes or {})
        self.zeros: dict[str, int] = {}     # added 1-D tensors of zeros: name -> length
        self.in_config: dict[str, str] = {}  # tensors the config carries: name -> its key

    def add_zeros(self, name: str, n: int) -> None:
        """A 1-D tensor of `n` zeros the source lacks (an absent bias: llama.cpp adds none),
        read like the source's own tensors (workbench.export.convert.carry)."""
        self.zeros[name] = int(n)

    def info(self, name: str) -> TensorInfo:
        if name in self.zeros:
            return TensorInfo(name, (self.zeros[name],), "F32", 4 * self.zeros[name], "")
        return self.model.info(name)

    def rows(self, name: str, r0: int, r1: int) -> np.ndarray:
        if name in self.zeros:
            return np.zeros((max(0, min(r1, 1) - r0), self.zeros[name]), np.float32)
        w = decode(self.model, name, r0, r1)
        ch = self.changes.get(name)
        return w if ch is None else ch.apply(w, r0)

    def read(self, name: str) -> np.ndarray:
        """The whole (changed) tensor as a float32 matrix."""
        return self.rows(name, 0, self.info(name).rows)

    def iter_rows(self, name: str, max_elements: int = CHUNK_ELEMENTS):
        info = self.info(name)
        step = max(1, max_elements // max(info.cols, 1))
        for r0 in range(0, info.rows, step):
            yield r0, self.rows(name, r0, min(info.rows, r0 + step))

    def as_model(self, path: str | None = None) -> Model:
        """The view as a float32 Model (same names, metadata and GGUF reader as the source)
        read at `path` (default the source's): the runner reads config.json beside it."""
        src = self.model
        tensors = {n: TensorInfo(n, i.shape, "F32", 4 * i.numel, i.file)
                   for n, i in src.tensors.items()}
        tensors.update((n, self.info(n)) for n in self.zeros)
        return Model(str(path or src.path), src.format, tensors, lambda n: _rows_of(self, n),
                     dict(src.metadata), source=src.source)


class LazyRows:
    """A computed tensor as the loaders' raw storage (rows x cols float32): `read_rows(r0, r1)`
    when a row range is sliced (where `sliceable`), `read_whole()` for anything else
    (np.asarray). The whole matrix, once read for a slice, is kept for this reader's next
    slices (a row-chunk loop) and dropped with it."""

    def __init__(self, rows: int, cols: int, read_rows, read_whole, sliceable: bool = True):
        self.shape = (rows, cols)
        self.dtype = np.dtype(np.float32)
        self.ndim = 2
        self._read_rows, self._read_whole, self._sliceable = read_rows, read_whole, sliceable
        self._whole = None

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key):
        if isinstance(key, slice) and key.step in (None, 1) and self._sliceable:
            r0, r1, _ = key.indices(self.shape[0])
            return self._read_rows(r0, max(r0, r1))
        if self._whole is None:
            self._whole = self._read_whole()
        return self._whole[key]

    def __array__(self, dtype=None, copy=None):
        w = self._whole if self._whole is not None else self._read_whole()
        return w if dtype is None else w.astype(dtype, copy=False)


def _rows_of(view: FloatView, name: str) -> LazyRows:
    info = view.info(name)
    return LazyRows(info.rows, info.cols, lambda r0, r1: view.rows(name, r0, r1),
                    lambda: view.read(name))

"""The tensor catalog of an opened checkpoint: lazy, header-only until data is asked for."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from workbench.formats import catalog
from workbench.formats.dtypes import decode_rows, is_float


class _cached:
    """functools.cached_property without its lock (Python 3.11 takes one per first access,
    which costs more than the value when 300,000 tensors are listed); a value worked out
    twice by two threads is the same value."""

    def __init__(self, fn):
        self.fn = fn
        self.name = fn.__name__
        self.__doc__ = fn.__doc__

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, obj, cls=None):
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


@dataclass(frozen=True)
class TensorInfo:
    """What the catalog knows about a tensor without reading its data."""

    name: str
    shape: tuple[int, ...]
    dtype: str          # F32, BF16, ... or a GGML type name such as Q4_K
    nbytes: int         # bytes on disk
    file: str = ""
    quant: str | None = None  # scheme of a tensor stored quantized (data decodes to float32)

    @_cached
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def rows(self) -> int:
        """Output channels: dim 0 (1 for 0-d/1-d tensors); a merged 3-D expert tensor
        (n_expert, rows, cols) has n_expert * rows (every expert's output channels)."""
        if self.merged_experts:
            return self.shape[0] * self.shape[1]
        return self.shape[0] if self.ndim >= 2 else 1

    @property
    def cols(self) -> int:
        """Input dimension: product of all dims after the first (a merged expert tensor's
        last dim)."""
        if self.merged_experts:
            return self.shape[2]
        if self.ndim >= 2:
            return math.prod(self.shape[1:])
        return self.shape[0] if self.ndim == 1 else 1

    @property
    def matrix_shape(self) -> tuple[int, int]:
        return (self.rows, self.cols)

    @property
    def is_float(self) -> bool:
        return is_float(self.dtype)

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.nbytes / self.numel if self.numel else 0.0

    @_cached
    def role(self) -> str:
        return catalog.infer_role(self.name, self.ndim)

    @_cached
    def merged_experts(self) -> bool:
        """A 3-D tensor holding every expert of a layer, numpy shape (n_expert, rows, cols)
        (GGUF ``ffn_*_exps``): read as an (n_expert * rows, cols) matrix, expert e's rows
        at e * rows ... (e + 1) * rows."""
        return catalog.is_merged_experts(self.name, self.ndim)

    @property
    def n_experts(self) -> int:
        """Experts held: n_expert for a merged tensor, 1 for a per-expert tensor, else 0."""
        if self.merged_experts:
            return self.shape[0]
        return 1 if self.role == "expert" else 0

    @property
    def expert(self) -> int | None:
        """The expert index of a Hugging Face per-expert tensor (None: merged or not an
        expert)."""
        return catalog.expert_index(self.name)

    @property
    def projection(self) -> str | None:
        """gate / up / down / gate_up for expert and shared-expert tensors."""
        return catalog.projection(self.name)

    @property
    def expert_group(self) -> str | None:
        """'layer N experts PROJ': one projection's experts of one layer (one llama.cpp
        tensor)."""
        return catalog.expert_group(self.name)

    @property
    def block(self) -> int | None:
        return catalog.block_index(self.name)

    @property
    def group(self) -> str:
        return catalog.group_of(self.name, self.role)

    @property
    def display_dtype(self) -> str:
        return self.quant or self.dtype

    def to_dict(self) -> dict:
        d = {"name": self.name, "shape": list(self.shape), "dtype": self.display_dtype,
             "params": self.numel, "bytes": self.nbytes, "block": self.block,
             "role": self.role}
        if self.role in catalog.MOE_ROLES:
            if self.role != "router":
                d["projection"] = self.projection
            if self.role == "expert":
                d["expert"] = self.expert
                d["experts"] = self.n_experts
        return d


@dataclass
class Model:
    """An opened checkpoint.

    Subclass-free: each loader builds a Model from the infos and a `raw` callable that
    returns the tensor's storage as a 2-D array (rows x storage items per row): an ndarray
    read with pread, or for a large tensor a loaders.region.Region whose rows are read as they
    are sliced. :func:`workbench.formats.dtypes.decode_rows` turns row chunks of it into float32, so
    a tensor can be streamed in bounded memory.
    """

    path: str
    format: str
    tensors: dict[str, TensorInfo]
    _raw: Callable[[str], np.ndarray]
    metadata: dict = field(default_factory=dict)
    _closer: Callable[[], None] | None = None
    source: object = None  # the loader's own handle (e.g. a GGUFReader), for exporters
    # where its companions (config.json, tokenizer files) are, when not beside `path` (a GGUF
    # read as a Hugging Face model: workbench.export.convert.live)
    folder: str | None = None

    def __post_init__(self):
        # the limits policy (workbench.core.limits): every loader's shapes pass here
        from workbench.core.limits import check_shape
        # a shape object shared by many tensors (the safetensors loader shares equal shapes)
        # is checked once
        checked: dict[int, tuple] = {}
        for info in self.tensors.values():
            shape = info.shape
            if checked.get(id(shape)) is shape:
                continue
            check_shape(shape, info.file or self.path, info.name)
            if len(checked) < 65536:
                checked[id(shape)] = shape

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def __len__(self) -> int:
        return len(self.tensors)

    def names(self) -> list[str]:
        return list(self.tensors)

    def info(self, name: str) -> TensorInfo:
        from workbench.core.errors import WorkbenchError
        try:
            return self.tensors[name]
        except KeyError:
            raise WorkbenchError("no such tensor in this model", path=self.path, tensor=name) from None

    def raw(self, name: str) -> np.ndarray:
        """The tensor's storage as a 2-D array (rows x storage items): an ndarray read with
        pread, or for a large tensor a loaders.region.Region that reads the rows sliced."""
        self.info(name)
        return self._raw(name)

    def read_matrix(self, name: str) -> np.ndarray:
        """The tensor as a float32 2-D (output channels x inputs) array."""
        info = self.info(name)
        from workbench.core.errors import context
        with context(info.file or self.path, name):   # a block type it cannot decode, ...
            return decode_rows(self._raw(name), info)

    def read(self, name: str) -> np.ndarray:
        """The whole tensor as float32 in its original shape."""
        return self.read_matrix(name).reshape(self.info(name).shape)

    def iter_rows(self, name: str, max_elements: int = 1 << 22) -> Iterator[tuple[int, np.ndarray]]:
        """Stream a tensor as float32 row chunks of at most ~max_elements: (row_start, chunk)."""
        info = self.info(name)
        rows, cols = info.matrix_shape
        raw = self._raw(name)
        step = max(1, max_elements // max(cols, 1))
        from workbench.core.errors import context
        from workbench.core.pages import release
        for r0 in range(0, rows, step):
            with context(info.file or self.path, name):
                part = raw[r0:r0 + step]   # read here (pread) when raw is a loaders.region.Region
                chunk = decode_rows(part, info)
            yield r0, chunk
            release(part)   # done with these rows: pages of a mapped view leave RSS
            del part, chunk

    @property
    def total_params(self) -> int:
        # summed once per catalog (a 100,000-tensor one takes ~0.1 s; windows ask often)
        key = (id(self.tensors), len(self.tensors))
        hit = self.__dict__.get("_total_params")
        if hit is None or hit[0] != key:
            hit = self.__dict__["_total_params"] = (key, sum(t.numel for t in self.tensors.values()))
        return hit[1]

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    def close(self) -> None:
        if self._closer is not None:
            self._closer()
            self._closer = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

"""The scheme base class, the quantized-tensor container and the registry.

One scheme = one small class, registered once (DESIGN.md example 1). A class that sets
``name`` is one scheme; a class that implements ``names()`` and ``parse()`` is a family of
parametric schemes (``int4-g128-asym@mse``). The GUI pickers, the CLI's ``--scheme``
choices and the test matrix all come from :func:`list_schemes`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import ClassVar

import numpy as np

from workbench.core.errors import WorkbenchError


@dataclass
class QuantizedTensor:
    """A tensor in a scheme's real storage layout: its bytes are its real size."""

    scheme: str
    shape: tuple[int, ...]
    arrays: dict[str, np.ndarray]
    meta: dict = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in self.arrays.values()))

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def matrix_shape(self) -> tuple[int, int]:
        return matrix_shape(self.shape)

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.nbytes / self.numel if self.numel else 0.0


def matrix_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    """Rows = output channels (dim 0), cols = everything after. 0-d/1-d are one row."""
    shape = tuple(int(s) for s in shape)
    if len(shape) >= 2:
        return shape[0], math.prod(shape[1:])
    return 1, (shape[0] if shape else 1)


class Scheme:
    """Base of every scheme. Subclasses implement `_quantize` / `_dequantize` on 2-D data."""

    name: ClassVar[str] = ""
    #: a coarse precision class used for the tier board and sorting: 32, 16, 8, 6, 5, 4, 3, 2
    nominal_bits: ClassVar[float] = 0
    #: the input dimension (cols) must be a multiple of this (None: any length)
    block_size: ClassVar[int | None] = None
    #: float casts pass NaN/Inf through; quantizers refuse them
    accepts_nonfinite: ClassVar[bool] = False
    #: quantizers with float32 scales refuse |w| above this (None: no limit checked here):
    #: their scale arithmetic (a range hi - lo, a power-of-two scale rounded up, q * scale)
    #: needs headroom below float32's largest value 3.4e38, else it overflows to Inf/NaN
    max_abs_weight: ClassVar[float | None] = None
    #: rows are quantized independently (scales per row or per block within a row), so a
    #: tensor quantized in row chunks gives the same codes: big tensors are then streamed in
    #: bounded memory (workbench.quant.streaming). False for a scale shared by the whole tensor.
    row_local: ClassVar[bool] = True
    #: the runtimes besides the workbench's own that run this scheme (quant.runtimes)
    runtimes: ClassVar[tuple[str, ...]] = ()
    #: the tensor type as llama.cpp's ggml_type_name spells it (None: llama.cpp has none)
    llama_type: ClassVar[str | None] = None
    #: the scheme whose compiled kernels this one shares (bench.warm's tasks; None: its own)
    kernel_family: ClassVar[str | None] = None

    _fixed: ClassVar[dict[str, type]] = {}
    _families: ClassVar[list[type]] = []

    def __init_subclass__(cls, register: bool = True, **kwargs):
        super().__init_subclass__(**kwargs)
        if not register:
            return
        if "name" in cls.__dict__ and cls.__dict__["name"]:
            if cls.name in Scheme._fixed:
                raise RuntimeError(f"scheme {cls.name} registered twice")
            Scheme._fixed[cls.name] = cls
        elif "parse" in cls.__dict__:
            Scheme._families.append(cls)

    # ---- family protocol (parametric schemes override) -------------------------------
    @classmethod
    def names(cls) -> list[str]:
        return [cls.name] if cls.name else []

    @classmethod
    def parse(cls, name: str) -> "Scheme | None":
        return cls() if name == cls.name else None

    # ---- sizes --------------------------------------------------------------------------
    def nbytes(self, shape: tuple[int, ...]) -> int:
        """Exact stored bytes of a tensor of this shape (codes + scales + zero points)."""
        raise NotImplementedError

    def bits_per_weight(self, shape: tuple[int, ...] | None = None) -> float:
        """Exact bits per weight including scale overhead (for `shape`, or a 4096x4096 matrix)."""
        shape = (4096, 4096) if shape is None else tuple(shape)
        n = math.prod(shape)
        return 8.0 * self.nbytes(shape) / n if n else 0.0

    def ineligible_reason(self, shape: tuple[int, ...]) -> str | None:
        """None when this scheme can take a tensor of `shape`, else why not."""
        rows, cols = matrix_shape(shape)
        if self.block_size and cols % self.block_size:
            return (f"{self.name} needs the input dimension to be a multiple of "
                    f"{self.block_size}, got {cols}")
        return None

    def can_take(self, shape: tuple[int, ...]) -> bool:
        return self.ineligible_reason(shape) is None

    # ---- the public API -----------------------------------------------------------------
    def quantize(self, w: np.ndarray, *, tensor: str | None = None) -> QuantizedTensor:
        w = np.asarray(w)
        shape = tuple(int(s) for s in w.shape)
        reason = self.ineligible_reason(shape)
        if reason:
            raise WorkbenchError(reason, tensor=tensor)
        w2 = np.ascontiguousarray(w, dtype=np.float32).reshape(matrix_shape(shape))
        if not self.accepts_nonfinite and w2.size:
            amax = float(np.max(np.abs(w2)))
            if not np.isfinite(amax):
                bad = int(np.count_nonzero(~np.isfinite(w2)))
                raise WorkbenchError(f"cannot quantize with {self.name}: {bad} NaN/Inf weight(s)",
                                     tensor=tensor)
            if self.max_abs_weight is not None and amax > self.max_abs_weight:
                raise WorkbenchError(
                    f"{self.name} cannot represent value {amax:.3g} (its float32 scale "
                    f"arithmetic would overflow; it takes |w| <= {self.max_abs_weight:.3g})",
                    tensor=tensor)
        self.check_range(w2, tensor)
        try:
            arrays = self._quantize(w2)
        except WorkbenchError as exc:
            raise exc.with_context(tensor=tensor) from None
        return QuantizedTensor(self.name, shape, arrays)

    def check_range(self, w2: np.ndarray, tensor: str | None = None) -> None:
        """Refuse finite weights the storage cannot represent, before quantizing (schemes
        override; the kernel path calls it too). The non-GGML schemes refuse inside
        ``_quantize`` per block instead, and :meth:`reference_needed` sends the kernel path
        there."""

    def kernel_layout(self) -> dict | None:
        """The storage layout as plain data for the kernel layer (``kernels.spec.make_spec``
        documents the keys); None: no kernel, the numpy reference does everything."""
        return None

    def reference_needed(self, qt: QuantizedTensor) -> bool:
        """True when `qt` (e.g. from a numba kernel) holds a scale in the range where only
        the reference implementation handles the edge case (a saturated float16 scale, a float32
        scale whose inverse overflows): the caller then quantizes again with :meth:`quantize`,
        which refuses or handles it. Looks only at the small per-block arrays."""
        return False

    def dequantize(self, qt: QuantizedTensor) -> np.ndarray:
        if qt.scheme != self.name:
            raise WorkbenchError(f"tensor was quantized with {qt.scheme}, not {self.name}")
        rows, cols = matrix_shape(qt.shape)
        out = self._dequantize(qt.arrays, rows, cols)
        return out.reshape(qt.shape)

    def _quantize(self, w: np.ndarray) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def _dequantize(self, arrays: dict[str, np.ndarray], rows: int, cols: int) -> np.ndarray:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<Scheme {self.name}>"


def _import_all() -> None:
    # importing the modules registers their classes
    from workbench.schemes import floats, integer, codebook  # noqa: F401
    from workbench.schemes import microscaling  # noqa: F401  (vLLM's NVFP4/MXFP4/FP8 block)
    from workbench.schemes import mlx  # noqa: F401  (Apple MLX's modes)
    try:
        from workbench.schemes import ggml  # noqa: F401  (GGML block formats)
    except ImportError as exc:   # gguf-py is a dependency: a failed import is a broken install
        raise ImportError(f"the GGML schemes cannot be imported ({exc}); gguf-py and the "
                          f"workbench.schemes.ggml package are required") from exc


@lru_cache(maxsize=None)
def get_scheme(name: str) -> Scheme:
    """The scheme called `name` (canonical or with explicit default suffixes)."""
    _import_all()
    key = str(name).strip().lower()
    cls = Scheme._fixed.get(key)
    if cls is not None:
        return cls()
    for fam in Scheme._families:
        s = fam.parse(key)
        if s is not None:
            return s if s.name == key else get_scheme(s.name)
    raise WorkbenchError(f"unknown scheme '{name}' (see `quant-workbench schemes`)")


def list_schemes(variants: bool = False) -> list[str]:
    """Canonical scheme names. With variants=True, also the @clip/@pot variants."""
    _import_all()
    names = list(Scheme._fixed)
    for fam in Scheme._families:
        names.extend(fam.names(variants=variants) if "variants" in fam.names.__code__.co_varnames
                     else fam.names())
    return names

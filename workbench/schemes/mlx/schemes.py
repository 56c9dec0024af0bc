"""MLX's quantization modes as schemes: ``mlx-q{B}-g{G}`` (affine, B ∈ {2,3,4,5,6,8},
G ∈ {32,64,128}), ``mlx-mxfp4`` (G 32), ``mlx-nvfp4`` (G 16) and ``mlx-mxfp8`` (G 32).

The arrays are those an mlx-lm folder stores for a quantized module (what ``mlx.core.quantize``
returns), so the export writes them as they are:

* ``weight`` uint32 ``[rows, cols·B/32]``: codes from the least significant bit, crossing word
  boundaries for B = 3, 5, 6;
* ``scales`` ``[rows, cols/G]``: affine: the float dtype's storage (float16, or bfloat16 as its
  uint16 bits); mxfp4 / mxfp8: E8M0 bytes; nvfp4: E4M3 bytes;
* ``biases`` (affine) like ``scales``.

Quantization is along the last axis (mlx's), so the last dimension must be a multiple of G.
The arrays are shaped by the tensor's matrix rows (``matrix_shape``: a 3-D ``[E, out, in]`` of
stacked experts has ``weight [E, out·in·B/32]``); the groups are those of mlx's ``[E, out,
in·B/32]``, which the export writes by a reshape.

**The float dtype.** mlx stores affine scales and biases in the weight's dtype and computes the
microscaling quotient w / scale in it. A scheme object carries that dtype (``dtype``: "F16",
"BF16" or "F32", :meth:`MLXScheme.for_dtype`; ``mlx-q4-g64@bf16`` by name, unlisted). The
registered ones (``get_scheme("mlx-q4-g64")``) have ``F32``: the weight as given, its affine scales and biases stored as **float16**. A float16/bfloat16 one first rounds the
weight to its dtype (what mlx quantizes), then quantizes as mlx does. Affine scales
are always 2 bytes, so the sizes here are exact for every export: the MLX export
(workbench.export.mlx_folder) writes float16/bfloat16 models' scales in the model's dtype, as
mlx-lm's convert does, and a float32 model's as float16 (mlx-lm would write 4-byte float32
scales; mlx's quantized matmul takes float16 scales beside float32 activations).
"""

from __future__ import annotations

import math
import re
from typing import ClassVar

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.schemes.base import Scheme
from workbench.schemes.mlx import reference as ref

AFFINE_BITS = (2, 3, 4, 5, 6, 8)
AFFINE_GROUPS = (32, 64, 128)
#: mlx's microscaling modes: name -> (bits, group)
FP_MODES = {"mxfp4": (4, 32), "nvfp4": (4, 16), "mxfp8": (8, 32)}
_AFFINE = re.compile(r"^mlx-q([2-8])-g(32|64|128)$")
DTYPES = ("F16", "BF16", "F32")
#: the name suffix of a scheme object for a float16 / bfloat16 export (float32: none)
DTYPE_SUFFIX = {"F32": "", "F16": "@f16", "BF16": "@bf16"}
F16_MAX = 65504.0


class MLXScheme(Scheme):
    """One MLX mode with its bits and group size."""

    runtimes: ClassVar[tuple[str, ...]] = ("mlx",)
    #: the family it is listed under (planning.scheme_choice.FAMILIES)
    family: ClassVar[str] = "MLX"
    max_abs_weight = 1e38

    def __init__(self, mode: str, bits: int, group: int, dtype: str = "F32"):
        if dtype not in DTYPES:
            raise WorkbenchError(f"MLX schemes store F16, BF16 or F32 models, not {dtype}")
        self.mode, self.bits, self.group, self.dtype = mode, int(bits), int(group), dtype
        self.block_size = self.group
        self.nominal_bits = self.bits
        self.name = (f"mlx-q{bits}-g{group}" if mode == "affine" else f"mlx-{mode}") + \
            DTYPE_SUFFIX[dtype]

    # ---- registry protocol --------------------------------------------------------------
    @classmethod
    def names(cls) -> list[str]:
        return ([f"mlx-q{b}-g{g}" for b in AFFINE_BITS for g in AFFINE_GROUPS]
                + [f"mlx-{m}" for m in FP_MODES])

    @classmethod
    def parse(cls, name: str) -> "MLXScheme | None":
        dtype = "F32"
        for dt, suffix in DTYPE_SUFFIX.items():
            if suffix and name.endswith(suffix):
                name, dtype = name[:-len(suffix)], dt
        m = _AFFINE.match(name)
        if m and int(m.group(1)) in AFFINE_BITS:
            return cls("affine", int(m.group(1)), int(m.group(2)), dtype)
        if name.startswith("mlx-") and name[4:] in FP_MODES:
            bits, group = FP_MODES[name[4:]]
            return cls(name[4:], bits, group, dtype)
        return None

    @property
    def base_name(self) -> str:
        """The registered scheme's name (without the dtype suffix)."""
        return self.name[:-len(DTYPE_SUFFIX[self.dtype])] if DTYPE_SUFFIX[self.dtype] else \
            self.name

    def for_dtype(self, dtype: str) -> "MLXScheme":
        """This scheme as an export of a `dtype` model quantizes ("F16", "BF16", "F32"): its
        name carries the dtype (``mlx-q4-g64@bf16``), so ``get_scheme`` of a QuantizedTensor's
        scheme finds it again."""
        return MLXScheme(self.mode, self.bits, self.group, dtype)

    # ---- facts ----------------------------------------------------------------------------
    @property
    def mlx_config(self) -> dict:
        """The entry of config.json's "quantization" object for a module of this scheme."""
        return {"group_size": self.group, "bits": self.bits, "mode": self.mode}

    @property
    def scale_dtype(self) -> str:
        """The storage of affine scales and biases: the dtype, float16 for a float32 model."""
        return "F16" if self.dtype == "F32" else self.dtype

    def scale_bytes(self) -> int:
        return 2 if self.mode == "affine" else 1

    def nbytes(self, shape) -> int:
        n = math.prod(int(s) for s in shape)
        groups = n // self.group
        per = 2 * self.scale_bytes() if self.mode == "affine" else 1
        return n * self.bits // 8 + groups * per

    def ineligible_reason(self, shape) -> str | None:
        shape = tuple(int(s) for s in shape)
        if len(shape) < 2:
            return f"{self.name} quantizes weights of 2 or more dimensions, got {list(shape)}"
        if shape[-1] % self.group:
            return (f"{self.name} needs the input dimension to be a multiple of {self.group}, "
                    f"got {shape[-1]}")
        return None

    def check_range(self, w2: np.ndarray, tensor: str | None = None) -> None:
        """float16 holds at most 65504: a float16 export's weights, and the float16 affine
        scales and biases of a float32 one (the bias is a group's extreme weight), refuse a
        weight beyond that (never stored as Inf). Otherwise |w| up to 1e38: a group's range,
        and a microscaling value rounded up to the next step, stay below float32's maximum."""
        if not w2.size:
            return
        f16 = self.dtype == "F16" or (self.mode == "affine" and self.scale_dtype == "F16")
        limit = F16_MAX if f16 else self.max_abs_weight
        amax = float(np.max(np.abs(w2)))
        if amax > limit:
            why = ("stores float16" if f16 else "would overflow float32 (its range or a value "
                   "rounded up)")
            raise WorkbenchError(f"{self.name} {why} and cannot represent value {amax:.3g} "
                                 f"(|w| <= {limit:.6g}"
                                 + ("; a bfloat16 export can)" if f16 else ")"), tensor=tensor)

    def kernel_layout(self) -> dict:
        """The kernel layer's view (kernels.spec: the "mlx" family, keyed by mode number)."""
        return {"family": "mlx", "mode": self.mode, "bits": self.bits, "gran": self.group,
                "dtype": self.dtype, "scale_dtype": self.scale_dtype, "name": self.name,
                "values": None if self.mode == "affine" else (
                    ref.FP8_E4M3_TABLE if self.mode == "mxfp8" else ref.E2M1_VALUES),
                "scale_values": None if self.mode == "affine" else ref.fp_scale_values(
                    np.arange(256, dtype=np.uint8), self.mode)}

    # ---- the primitives (2-D: the tensor's matrix_shape rows; groups never cross a row of
    # the last axis, since it is a multiple of the group) -----------------------------------
    def _quantize(self, w: np.ndarray) -> dict[str, np.ndarray]:
        if self.dtype != "F32":        # mlx quantizes the weight in the model's dtype
            w = ref.round_to(w, self.dtype)
        if self.mode == "affine":
            return ref.quantize_affine(w, self.bits, self.group, self.scale_dtype)
        return ref.quantize_fp(w, self.mode, self.group, self.dtype)

    def _dequantize(self, arrays, rows, cols) -> np.ndarray:
        a = {k: np.asarray(v).reshape(rows, -1) for k, v in arrays.items()}
        return ref.dequantize(a, self.mlx_config, self.scale_dtype).reshape(rows, cols)

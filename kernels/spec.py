"""What kernel a scheme needs: read from the scheme object's attributes, never its name.

A :class:`Spec` says which generic kernel family decodes a scheme and with which parameters.
Families (each one generic kernel per backend, see ``cpu.py`` / ``cuda.py``):

``affine``  packed B-bit codes -> ``(lut[code] - zero[block]) * scale[block]``. Covers every
            integer affine scheme (lut = code - offset), NF4 (lut = codebook), ternary
            (lut = code - 1) and FP8 (B = 8, lut = the FP8 decode table, one scale per row).
            Blocks are a tensor, a row or a group of the row (``geometry``).
``u16``     16-bit floats (fp16, bf16) decoded through a 65536-entry table.
``f32``     float32 kept as is (a copy).
``ggml``    llama.cpp / GGUF block formats, one block decoder per ``ggml_type``.

``quant`` names the quantize kernel (``None``: quantize falls back to the numpy reference).
This module imports no numba, so ``import kernels`` stays cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from . import tables

#: GGML types with a dequantize kernel -> (internal id, weights per block, bytes per block)
GGML_TYPES = {
    "Q4_0": (0, 32, 18), "Q4_1": (1, 32, 20), "Q5_0": (2, 32, 22), "Q5_1": (3, 32, 24),
    "Q8_0": (4, 32, 34), "Q2_K": (5, 256, 84), "Q3_K": (6, 256, 110), "Q4_K": (7, 256, 144),
    "Q5_K": (8, 256, 176), "Q6_K": (9, 256, 210), "IQ4_NL": (10, 32, 18),
}
#: GGML types with a quantize kernel (bit-identical to gguf-py / llama.cpp reference)
GGML_QUANT = ("Q4_0", "Q8_0", "Q4_1", "Q5_0", "Q5_1")


@dataclass(frozen=True, eq=False)
class Spec:
    family: str                      # "affine" | "u16" | "f32" | "ggml"
    quant: str | None = None         # "int" | "nf4" | "fp8" | "ternary" | "ggml" | None
    # affine
    bits: int = 0
    lut: np.ndarray | None = None
    code_key: str = "codes"
    scale_key: str = "scales"
    zero_key: str | None = None
    gran: object = "row"             # "tensor" | "row" | int (group size along the row)
    # u16
    table: str = ""
    # ggml
    ggml_name: str = ""
    ggml_id: int = -1
    qk: int = 0
    bpb: int = 0

    def geometry(self, rows: int, cols: int) -> tuple[int, int]:
        """(group length along a row, blocks per row); block of (r, c) = r*bpr + c//gs."""
        if self.gran == "tensor":
            return max(cols, 1), 0
        if self.gran == "row":
            return max(cols, 1), 1
        gs = int(self.gran)
        return gs, cols // gs


def _gran_of(g) -> object:
    size = getattr(g, "size", None)
    if size is not None:
        return int(size)
    label = getattr(g, "label", "")
    return "tensor" if label == "tensor" else "row"


@lru_cache(maxsize=None)
def _spec_cached(scheme) -> Spec | None:
    from workbench.schemes import codebook, floats

    ggml_type = getattr(scheme, "ggml_type", None)
    if ggml_type is not None:
        name = getattr(ggml_type, "name", None)
        if name is None:
            try:
                import gguf
                name = gguf.GGMLQuantizationType(int(ggml_type)).name
            except (ImportError, ValueError, TypeError):
                name = str(ggml_type)
        name = str(name).upper()
        if name not in GGML_TYPES:
            return None
        tid, qk, bpb = GGML_TYPES[name]
        return Spec("ggml", "ggml" if name in GGML_QUANT else None, ggml_name=name,
                    ggml_id=tid, qk=qk, bpb=bpb)
    if all(hasattr(scheme, a) for a in ("bits", "gran", "asym", "offset", "qmin", "qmax",
                                        "choose_qparams")):
        return Spec("affine", "int", bits=int(scheme.bits), lut=tables.int_lut(int(scheme.offset)),
                    zero_key="zeros" if scheme.asym else None, gran=_gran_of(scheme.gran))
    if hasattr(scheme, "table") and hasattr(scheme, "fmax"):          # FP8 with a row scale
        return Spec("affine", "fp8", bits=8, lut=tables.padded_lut(scheme.table), gran="row")
    if isinstance(scheme, codebook.NF4):
        return Spec("affine", "nf4", bits=4, lut=tables.padded_lut(codebook.NF4_CODEBOOK),
                    scale_key="absmax", gran=int(scheme.block_size))
    if isinstance(scheme, codebook.Ternary):
        return Spec("affine", "ternary", bits=2, lut=tables.int_lut(1), gran=int(scheme.block_size))
    if isinstance(scheme, floats.FP32):
        return Spec("f32")
    if isinstance(scheme, floats.FP16):
        return Spec("u16", table="f16")
    if isinstance(scheme, floats.BF16):
        return Spec("u16", table="bf16")
    return None


def spec_for(scheme) -> Spec | None:
    """The kernel spec of a scheme object (or name); None when no kernel covers it."""
    if isinstance(scheme, str):
        from workbench.schemes import get_scheme
        scheme = get_scheme(scheme)
    try:
        return _spec_cached(scheme)
    except TypeError:          # unhashable scheme object
        return _spec_cached.__wrapped__(scheme)

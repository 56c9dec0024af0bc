"""What kernel a scheme needs, as data: a scheme declares its storage layout
(``Scheme.kernel_layout()``, a plain dict) and :func:`make_spec` turns it into a :class:`Spec`.

A :class:`Spec` says which generic kernel family decodes a scheme and with which parameters.
Families (each one generic kernel per backend, see ``cpu.py`` / ``cuda.py``):

``affine``  packed B-bit codes -> ``(lut[code] - zero[block]) * scale[block]``. Covers every
            integer affine scheme (lut = code - offset), NF4 (lut = codebook), ternary
            (lut = code - 1) and FP8 (B = 8, lut = the FP8 decode table, one scale per row).
            Blocks are a tensor, a row or a group of the row (``geometry``).
``u16``     16-bit floats (fp16, bf16) decoded through a 65536-entry table.
``f32``     float32 kept as is (a copy).
``ggml``    llama.cpp / GGUF block formats, one block decoder per GGML type number (the
            scheme's ``ggml_type``, passed in its layout with the block geometry).
``mlx``     Apple MLX's modes (kernels.cpu_mlx), one decoder per mode number (MLX_MODES):
            affine ``round(round(scale * q) + bias)`` in the export's float dtype, and the
            microscaling modes ``value[code] * scale``; codes a little-endian bit stream.

``quant`` names the quantize kernel (``None``: quantize falls back to the numpy reference).
Like the rest of ``kernels/``, this module imports nothing from ``workbench``: a GGML type's
number, block size and bytes come in its layout; it imports no numba, so ``import kernels``
stays cheap.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import tables

#: the GGML type numbers (gguf.GGMLQuantizationType) the block decoders cover, on the CPU
#: (cpu_ggml) and CUDA (cuda_kernels.GGML_DEVICE): a layout naming another type gets no spec
#: (its scheme runs the numpy reference), never a decoder that does not exist
GGML_DECODERS = frozenset({2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 16, 17, 18, 19, 20, 21, 22, 23, 29,
                           34, 35, 39, 40})
#: Apple MLX's quantization modes by number (the "mlx" family's decoders, CPU and CUDA), and
#: the float dtypes its affine arithmetic rounds to
MLX_MODES = {"affine": 0, "mxfp4": 1, "nvfp4": 2, "mxfp8": 3}
MLX_DTYPES = {"F32": 0, "F16": 1, "BF16": 2}
#: the GGML quantize kernels (a scheme's ``quant_kernel``, a key of cpu_ops.GGML_ENCODERS)
#: that run a searching quantizer and so need the layout's ``search`` parameters
SEARCH_KERNELS = ("affine_k", "sym_k")


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
    ggml_id: int = -1                # the GGML type number (gguf.GGMLQuantizationType)
    kernel: str = ""                 # the GGML quantize kernel (cpu_ops.GGML_ENCODERS key)
    qk: int = 0
    bpb: int = 0
    # quantize parameters (integer: qmin..qmax codes, code = q + offset; fp8: fmax; nf4: mids)
    name: str = ""
    asym: bool = False
    qmin: int = 0
    qmax: int = 0
    offset: int = 0
    scale_f16: bool = False
    clip: str = "minmax"
    pot: bool = False
    divs: tuple = ()                 # symmetric integer: the scale search's divisors
    fmax: float = 0.0
    fp8_table: np.ndarray | None = None
    mids: np.ndarray | None = None
    # ggml searching quantizers: (candidate steps, super-scale divisors, iters, rounds)
    search: tuple = ()
    # affine codes whose stored scales are decoded on the host (host.affine_args): "" (float
    # scales), "e8m0" (2^(e-127) bytes), "e4m3g" (FP8 E4M3 bytes / a float32 "global_scale"),
    # "block128" (float32 per 128x128 block, expanded to groups of each row: 128 wide, or the
    # largest power of two dividing the row length when 128 does not)
    scale_decode: str = ""
    scale_table: np.ndarray | None = None
    # mlx: the mode number (MLX_MODES), the dtype numbers (MLX_DTYPES) of the microscaling
    # quotient (the weight's dtype) and of the affine scales' arithmetic
    mlx_mode: int = -1
    dtype: int = 0
    scale_dtype: int = 0

    def geometry(self, rows: int, cols: int) -> tuple[int, int]:
        """(group length along a row, blocks per row); block of (r, c) = r*bpr + c//gs."""
        if self.gran == "tensor":
            return max(cols, 1), 0
        if self.gran == "row":
            return max(cols, 1), 1
        gs = int(self.gran)
        return gs, cols // gs


def make_spec(layout: dict | None) -> Spec | None:
    """The Spec of a scheme's declared layout (``Scheme.kernel_layout()``); None when no kernel
    covers it. Layout keys by family:

    * ``{"family": "ggml", "ggml_name": "Q4_K", "ggml_type": 12, "qk": 256, "bpb": 144,
      "quant_kernel": "affine_k" | ... | None}`` (the GGML type number and block geometry, as
      the scheme read them from gguf.GGML_QUANT_SIZES; SEARCH_KERNELS: plus ``"search":
      {"cands", "divs", "iters", "rounds"}``, the parameters of their searching quantizer)
    * ``{"family": "affine", "quant": "int", "bits", "offset", "asym", "gran", "qmin", "qmax",
      "scale_f16", "clip", "pot", "divs"}`` (gran: "tensor" | "row" | group size)
    * ``{"family": "affine", "quant": "fp8", "values": <256-code decode table>, "fmax"}``
    * ``{"family": "affine", "quant": "nf4", "values": <16 levels>, "mids", "gran"}``
    * ``{"family": "affine", "quant": "ternary", "gran"}``
    * ``{"family": "affine", "quant": "fp4", "values": <16 code values>, "gran", "scale_decode":
      "e8m0" | "e4m3g", "scale_values": <256-code E4M3 table, for e4m3g>}`` (dequantize only)
    * ``{"family": "affine", "quant": "fp8-block", "values": <256-code decode table>}``
      (dequantize only; float32 scales per 128x128 block)
    * ``{"family": "f32"}``, ``{"family": "u16", "table": "f16" | "bf16"}``
    * ``{"family": "mlx", "mode": "affine" | "mxfp4" | "nvfp4" | "mxfp8", "bits", "gran",
      "dtype", "scale_dtype": "F32" | "F16" | "BF16", "values": <code values, microscaling>,
      "scale_values": <the 256 scale bytes' values, microscaling>}``
    """
    if not layout:
        return None
    fam, name = layout["family"], layout.get("name", "")
    if fam == "ggml":
        g = str(layout["ggml_name"]).upper()
        if layout.get("ggml_type") not in GGML_DECODERS:
            return None
        kernel = layout.get("quant_kernel") or ""
        search = ()
        if kernel in SEARCH_KERNELS:
            se = layout.get("search")
            if se:
                search = (tuple(float(c) for c in se["cands"]),
                          tuple(float(d) for d in se["divs"]), int(se["iters"]), int(se["rounds"]))
            else:
                kernel = ""          # a searching kernel without its parameters: none
        return Spec("ggml", "ggml" if kernel else None, ggml_name=g,
                    ggml_id=int(layout["ggml_type"]), qk=int(layout["qk"]),
                    bpb=int(layout["bpb"]), name=name, search=search, kernel=kernel)
    if fam == "mlx":
        vals, sv = layout.get("values"), layout.get("scale_values")
        return Spec("mlx", "mlx", bits=int(layout["bits"]), gran=int(layout["gran"]),
                    code_key="weight", zero_key="biases" if layout["mode"] == "affine" else None,
                    name=name, lut=None if vals is None else tables.padded_lut(vals),
                    scale_table=None if sv is None else np.asarray(sv, np.float32),
                    mlx_mode=MLX_MODES[layout["mode"]], dtype=MLX_DTYPES[layout["dtype"]],
                    scale_dtype=MLX_DTYPES[layout["scale_dtype"]])
    if fam in ("f32", "u16"):
        return Spec(fam, table=layout.get("table", ""), name=name)
    if fam != "affine":
        return None
    q = layout["quant"]
    if q == "int":
        return Spec("affine", "int", bits=int(layout["bits"]),
                    lut=tables.int_lut(int(layout["offset"])),
                    zero_key="zeros" if layout["asym"] else None, gran=layout["gran"],
                    name=name, asym=bool(layout["asym"]), qmin=int(layout["qmin"]),
                    qmax=int(layout["qmax"]), offset=int(layout["offset"]),
                    scale_f16=bool(layout["scale_f16"]), clip=layout.get("clip", "minmax"),
                    pot=bool(layout.get("pot", False)),
                    divs=tuple(float(d) for d in layout.get("divs", ())))
    if q == "fp8":
        table = np.asarray(layout["values"], np.float32)
        return Spec("affine", "fp8", bits=8, lut=tables.padded_lut(table), gran="row",
                    name=name, fmax=float(layout["fmax"]), fp8_table=table)
    if q == "nf4":
        return Spec("affine", "nf4", bits=4, lut=tables.padded_lut(layout["values"]),
                    scale_key="absmax", gran=int(layout["gran"]), name=name,
                    mids=np.asarray(layout["mids"], np.float32))
    if q == "fp4":
        st = layout.get("scale_values")
        return Spec("affine", None, bits=4, lut=tables.padded_lut(layout["values"]),
                    code_key="packed", scale_key="scales", gran=int(layout["gran"]), name=name,
                    scale_decode=str(layout["scale_decode"]),
                    scale_table=None if st is None else np.asarray(st, np.float32))
    if q == "fp8-block":
        return Spec("affine", None, bits=8, lut=tables.padded_lut(layout["values"]),
                    gran=128, name=name, scale_decode="block128")
    if q == "ternary":
        return Spec("affine", "ternary", bits=2, lut=tables.int_lut(1), gran=int(layout["gran"]),
                    name=name, qmin=-1, qmax=1, offset=1)
    return None

"""The shared machinery of the GGML block formats (llama.cpp / GGUF).

Each format is one small registered class (DESIGN.md example 1) that declares its packed
block as a numpy structured dtype with a size check (example 2) and implements two
block-level functions:

    encode(x)  float32 (n_blocks, QK)          -> structured array (n_blocks,) of block_dtype
    decode(b)  structured array (n_blocks,)    -> float32 (n_blocks, QK)

Everything else lives here: the storage contract (``arrays == {"blocks": uint8 rows}``,
exactly the bytes GGUF stores, row r = the blocks of output channel r), chunking so that
quantizing a 4096x4096 matrix runs in bounded memory, the check that block scales fit in
float16, and ``dequantize_blocks(raw_rows)`` used by the GGUF loader.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.schemes.base import QuantizedTensor, Scheme, matrix_shape

QK_K = 256            # weights per K-quant super-block
FP16_MAX = 65504.0
GROUP_EPS = 1e-15     # a (sub-)block whose largest |w| is below this is all zeros
ENCODE_CHUNK_WEIGHTS = 1 << 20  # weights per encode call (bounded, cache-friendly temporaries)
DECODE_CHUNK = 1 << 16


class ScaleOverflow(WorkbenchError):
    """The block scale of some weights does not fit in float16."""


def block_dtype(fields: list, size: int) -> np.dtype:
    """A packed (unaligned, like ggml's structs) block layout, checked against its size."""
    dt = np.dtype(fields, align=False)
    assert dt.itemsize == size, f"{fields}: {dt.itemsize} bytes, expected {size}"
    return dt


def to_fp16(x: np.ndarray) -> np.ndarray:
    """float32 -> float16 with round-to-nearest-even (what ggml's FP32_TO_FP16 does)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(x, dtype=np.float32).astype(np.float16)


def fp16_field(x: np.ndarray) -> np.ndarray:
    """A float16 field of a block array as float32."""
    return np.asarray(x).astype(np.float32)


def safe_recip(d: np.ndarray) -> np.ndarray:
    """1/d in float32, 0 where d == 0 or where 1/d overflows (|d| < 2**-128, a subnormal
    float32 scale: its float16 is 0, so the block decodes to 0 whatever the codes; ggml's
    ``x * (1/d)`` would then cast +-Inf/NaN to an integer, which C leaves undefined). The
    codes are then those of x * 0 (Q4_0: 8, Q8_0: 0), here and in the kernels alike."""
    d = np.asarray(d, dtype=np.float32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inv = np.float32(1.0) / d
    return np.where((d == 0) | ~np.isfinite(inv), np.float32(0.0), inv).astype(np.float32)


def pack_nibbles(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Byte = lo | hi << 4 (both uint8 code arrays of the same shape, values < 16)."""
    return (lo.astype(np.uint8) & np.uint8(15)) | (hi.astype(np.uint8) << np.uint8(4))


def unpack_nibbles(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return b & np.uint8(15), b >> np.uint8(4)


def pack_bit_planes(bits: np.ndarray) -> np.ndarray:
    """bits (n, P, M) of 0/1 -> bytes (n, M): bit p of byte m is bits[:, p, m] (P <= 8)."""
    n, planes, m = bits.shape
    out = np.zeros((n, m), np.uint8)
    for p in range(planes):
        out |= (bits[:, p, :].astype(np.uint8) & np.uint8(1)) << np.uint8(p)
    return out


def unpack_bit_planes(b: np.ndarray, planes: int) -> np.ndarray:
    """bytes (n, M) -> bits (n, planes, M)."""
    shifts = np.arange(planes, dtype=np.uint8).reshape(1, planes, 1)
    return (b[:, None, :] >> shifts) & np.uint8(1)


def pow2_normalize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Scale each block (row of x) by a power of two so that its max |x| lies in [0.5, 1).

    Exact (no rounding), it keeps the scale searches of the K-quants free of float32
    overflow/underflow for huge or tiny weights. Returns (x_normalized, e) with
    x = x_normalized * 2**e. Blocks below GROUP_EPS become zeros (they quantize to zero in
    every GGML format anyway: the smallest float16 scale is 6e-8).
    """
    amax = np.abs(x).max(axis=1)
    _, e = np.frexp(amax)
    e = e.astype(np.int32)
    tiny = amax < GROUP_EPS
    e[tiny] = 0
    xn = np.ldexp(x, -e[:, None]).astype(np.float32)
    xn[tiny] = 0.0
    return xn, e


def denormalize(v: np.ndarray, e: np.ndarray) -> np.ndarray:
    """v * 2**e (per block; e broadcast over trailing dims of v)."""
    e = e.reshape(e.shape + (1,) * (v.ndim - e.ndim))
    with np.errstate(over="ignore"):
        return np.ldexp(v, e).astype(np.float32)


def renormalize(v: np.ndarray, e: np.ndarray) -> np.ndarray:
    return denormalize(v, -e)


class NearestIndex:
    """Index of the nearest entry of a sorted codebook (ties to the larger entry).

    Equivalent to searchsorted on the midpoints, but several times faster on big arrays: a
    lookup table over unit cells of the value axis gives the index at the cell's left end,
    and one comparison with the (at most one) midpoint inside the cell finishes the job.
    Needs entries at least 2 apart (true for integer codebooks such as IQ4_NL's).
    """

    def __init__(self, values):
        v = np.asarray(values, dtype=np.float64)
        assert np.all(np.diff(v) >= 2), "codebook entries must be at least 2 apart"
        self.mids = ((v[1:] + v[:-1]) / 2).astype(np.float32)
        self.lo = int(np.floor(v[0])) - 2
        hi = int(np.ceil(v[-1])) + 2
        cells = np.arange(self.lo, hi + 1, dtype=np.float64)
        self.base = np.searchsorted(self.mids, cells, side="right").astype(np.uint8)
        nxt = np.full(cells.shape, np.inf, np.float32)
        for m in self.mids:
            k = int(np.floor(m))
            if m > k:  # a midpoint strictly inside cell [k, k+1)
                nxt[k - self.lo] = m
        self.next_mid = nxt
        self.n_cells = cells.size

    def __call__(self, x: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            cell = np.clip(np.floor(x), self.lo, self.lo + self.n_cells - 1).astype(np.intp)
        cell -= self.lo
        return self.base[cell] + (x >= self.next_mid[cell]).astype(np.uint8)


class GGMLScheme(Scheme, register=False):
    """Base of the GGML block formats. Subclasses set the class attributes and the codecs.

    The class is the one place a GGML type is described (docs/architecture.md, "Adding a
    GGML type"): its ``ggml_type`` (the GGUF type number; weights and bytes per block are read
    from ``gguf.GGML_QUANT_SIZES``), the runtimes that run it and its llama.cpp fallback, and
    its kernel entry points. Every table elsewhere is built from the registry
    (``workbench.schemes.ggml.registry``)."""

    #: the GGUF tensor type (a gguf.GGMLQuantizationType)
    ggml_type: ClassVar[object] = None
    #: the declared packed layout of one block (its size is checked against gguf's)
    block_dtype: ClassVar[np.dtype] = None
    #: weights per block (QK) and bytes per block: set from gguf.GGML_QUANT_SIZES[ggml_type]
    block_size: ClassVar[int] = 0
    type_size: ClassVar[int] = 0
    #: the fp16 fields whose overflow means "weights too large for this format"
    scale_fields: ClassVar[tuple[str, ...]] = ("d",)
    #: llama.cpp runs every GGML type (llama-quant.cpp writes it, ggml decodes it)
    runtimes = ("llama.cpp",)
    #: llama-quant.cpp ``tensor_type_fallback``: the type used when the row length is not a
    #: multiple of this type's block (None: F16, as for the 32-weight types)
    llama_fallback: ClassVar[str | None] = None
    #: a default allocation candidate only at low budgets (quant.runtimes.LOW_BIT_ONLY)
    low_bit_only: ClassVar[bool] = False
    #: the family it is listed under (planning.scheme_choice.FAMILIES)
    family: ClassVar[str] = "Codebooks"
    #: kernel entry points: the CPU quantize kernel (a key of kernels.cpu_ops.GGML_ENCODERS;
    #: None: quantize runs the numpy reference) ...
    quant_kernel: ClassVar[str | None] = None
    #: ... and the importance-weighted encoder (quant.methods.ggml_weighted.ENCODERS key and
    #: its arguments; None: no weighted quantization)
    weighted_encoder: ClassVar[tuple | None] = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "ggml_type" not in cls.__dict__ or cls.ggml_type is None:
            return
        import gguf
        qk, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(cls.ggml_type)]
        cls.block_size, cls.type_size = int(qk), int(size)
        if cls.block_dtype is None or cls.block_dtype.itemsize != size:
            got = None if cls.block_dtype is None else cls.block_dtype.itemsize
            raise TypeError(f"{cls.__name__}: block_dtype is {got} bytes, "
                            f"gguf.GGML_QUANT_SIZES says {size} for {cls.ggml_type.name}")
        name = cls.ggml_type.name.lower()
        # llama.cpp's ggml_type_name spells the K-quants with a capital K (q4_K)
        cls.llama_type = name[:-2] + "_K" if name.endswith("_k") else name

    @property
    def ggml_name(self) -> str:
        return self.ggml_type.name

    def kernel_layout(self) -> dict:
        """The GGML type number, block geometry and kernel entry, as data (kernels.spec)."""
        return {"family": "ggml", "ggml_name": self.ggml_type.name,
                "ggml_type": int(self.ggml_type), "qk": self.block_size,
                "bpb": self.type_size, "quant_kernel": self.quant_kernel, "name": self.name}

    # ---- sizes ---------------------------------------------------------------------------
    def nbytes(self, shape) -> int:
        rows, cols = matrix_shape(shape)
        return rows * (-(-cols // self.block_size)) * self.type_size

    def bits_per_weight(self, shape=None) -> float:
        if shape is None:
            return 8.0 * self.type_size / self.block_size
        return super().bits_per_weight(shape)

    def ineligible_reason(self, shape) -> str | None:
        """GGML blocks run along the innermost dimension (ggml's ne[0], the row)."""
        shape = tuple(int(s) for s in shape)
        row = shape[-1] if shape else 1
        if row % self.block_size:
            return (f"{self.name} needs the row length (innermost dimension) to be a multiple "
                    f"of {self.block_size}, got {row}")
        return None

    # ---- public API ----------------------------------------------------------------------
    def quantize(self, w: np.ndarray, *, tensor: str | None = None) -> QuantizedTensor:
        try:
            return super().quantize(w, tensor=tensor)
        except ScaleOverflow as exc:
            raise WorkbenchError(str(exc), tensor=tensor) from None

    def quantize_blocks(self, x: np.ndarray) -> np.ndarray:
        """float32 (n_blocks, QK) -> packed blocks as uint8 (n_blocks, type_size)."""
        x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, self.block_size)
        out = np.empty(x.shape[0], dtype=self.block_dtype)
        step = max(1, ENCODE_CHUNK_WEIGHTS // self.block_size)
        for s in range(0, x.shape[0], step):
            chunk = x[s:s + step]
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                enc = self.encode(chunk)
            self._check_scales(enc, chunk)
            if self.zero_when_worse:
                self._zero_worse_blocks(enc, chunk)
            out[s:s + step] = enc
        return out.view(np.uint8).reshape(x.shape[0], self.type_size)

    def dequantize_blocks(self, raw: np.ndarray) -> np.ndarray:
        """Raw GGML rows, uint8 (rows, bytes per row) -> float32 (rows, cols)."""
        raw = np.asarray(raw)
        if raw.dtype != np.uint8:
            raw = raw.view(np.uint8)
        if raw.ndim == 1:
            raw = raw.reshape(1, -1)
        raw = raw.reshape(raw.shape[0], -1)
        rows, nb = raw.shape
        if nb % self.type_size:
            raise WorkbenchError(f"{self.ggml_name} rows must be a multiple of {self.type_size} "
                                 f"bytes, got {nb}")
        blocks = np.ascontiguousarray(raw).reshape(-1).view(self.block_dtype)
        out = np.empty((blocks.shape[0], self.block_size), np.float32)
        for s in range(0, blocks.shape[0], DECODE_CHUNK):
            out[s:s + DECODE_CHUNK] = self.decode(blocks[s:s + DECODE_CHUNK])
        return out.reshape(rows, (nb // self.type_size) * self.block_size)

    # ---- Scheme hooks --------------------------------------------------------------------
    def _quantize(self, w: np.ndarray) -> dict[str, np.ndarray]:
        rows, cols = w.shape
        raw = self.quantize_blocks(w.reshape(-1, self.block_size) if w.size else
                                   np.zeros((0, self.block_size), np.float32))
        return {"blocks": raw.reshape(rows, (cols // self.block_size) * self.type_size)}

    def _dequantize(self, arrays, rows, cols) -> np.ndarray:
        if rows * cols == 0:
            return np.zeros((rows, cols), np.float32)
        return self.dequantize_blocks(arrays["blocks"]).reshape(rows, cols)

    # ---- subclass codecs -----------------------------------------------------------------
    def encode(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def decode(self, blocks: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    #: affine formats (a float16 min): for weights near float16's smallest steps the rounded
    #: min alone can put a block further from its weights than zeros would be
    zero_when_worse = False

    def _zero_worse_blocks(self, enc: np.ndarray, x: np.ndarray) -> None:
        """Blocks whose decoding is worse than all zeros are stored as zeros (relative error
        never above 1, e.g. weights of std 1e-8 under q4_1/q4_k)."""
        with np.errstate(over="ignore", invalid="ignore"):
            dec = self.decode(enc).reshape(x.shape).astype(np.float64)
            xd = x.astype(np.float64)
            worse = ((dec - xd) ** 2).sum(axis=1) > (xd * xd).sum(axis=1)
        if worse.any():
            enc[worse] = self.encode(np.zeros((int(worse.sum()), self.block_size), np.float32))

    def _check_scales(self, enc: np.ndarray, x: np.ndarray) -> None:
        for f in self.scale_fields:
            v = enc[f]
            if not np.isfinite(v).all():
                amax = float(np.abs(x).max())
                raise ScaleOverflow(
                    f"cannot quantize with {self.name}: weights too large (max |w| = {amax:.4g}); "
                    f"the float16 block scale '{f}' overflows (limit {FP16_MAX:g})")

    def __repr__(self) -> str:
        return f"<GGML scheme {self.name} ({self.bits_per_weight():g} bits/weight)>"


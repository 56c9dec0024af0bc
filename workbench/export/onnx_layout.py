"""The workbench's quantized tensors in ONNX Runtime's ``com.microsoft.MatMulNBits`` layout.

MatMulNBits computes ``Y = A · dequant(B)ᵀ`` for a Linear of weight W (N out × K in) with
attributes K, N, bits, block_size (a power of two >= 16) and accuracy_level. Blocks run along K
(each row of W in turn): ``B`` is uint8 [N, ceil(K / block), block · bits / 8], weight i of a block
at bit i · bits of its little-endian bytes (the padding of a last, partial block is zeros);
``scales`` float32 [N · n_blocks]; ``zero_points`` optional, either uint8 packed like B
(``ceil(n_blocks · bits / 8)`` bytes per row, default 2^(bits-1)) with
``dequant = (q - zp) · scale``, or float32 [N · n_blocks] with ``dequant = q · scale - fl(zp · scale)``.
Verified by round-tripping known codes through onnxruntime 1.32's CPU kernel (an identity A gives
Y = dequant(B)ᵀ), see tests/workbench/test_onnx_layout.py; that kernel takes bits 2, 4 and 8 only
("additional bits support is planned") and no float zero points with 8 bits.

How each scheme maps (:func:`matmulnbits_arrays`), its dequantized weight bit-identical to
``scheme.dequantize``:

* ``int{2,4,8}-g{32..256}[-asym]``: block = the group; codes as stored (symmetric codes are
  q + 2^(bits-1), the default zero point); asymmetric zero points packed uint8.
* ``int{2,4,8}-channel`` / ``-tensor``: one block per row, block = the next power of two >= K (at
  least 16), the tail padded; a per-tensor scale is repeated per row.
* ``q4_0`` (d·(q-8)) and ``q8_0`` (d·q, codes q + 128): block 32, the float16 d widened to float32;
  ggml's nibble order (weight j and j + 16 in byte j) re-packed to consecutive order.
* ``q4_1`` (d·q + m): float32 zero points z with fl(z · d) = -m, so ORT's q·d - fl(z·d) is
  d·q + m. A float32 z with that property exists for most blocks but not all (about 90% of
  random blocks): where none does, the block's dequantized weights differ from ggml's by at most
  one rounding of m (the note says how many blocks); bit-identical otherwise.

Schemes with other bits (int3/5/6/7), K-quants, IQ4_NL, NF4, FP8 and the float casts have no
MatMulNBits form: :func:`unsupported_reason` says so and the runtime rules
(workbench.quant.runtimes, target ``onnxruntime``) fall back or keep the tensor float.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from workbench.quant.onnx_capacity import GGML_MAPPED, _next_pow2, unsupported_reason


@dataclass
class NBits:
    """One Linear weight as MatMulNBits inputs and attributes."""
    K: int
    N: int
    bits: int
    block_size: int
    B: np.ndarray                        # uint8 [N, n_blocks, block*bits/8]
    scales: np.ndarray                   # float32 [N * n_blocks]
    zero_points: np.ndarray | None       # uint8 packed, or float32, or None (2^(bits-1))
    notes: list = field(default_factory=list)

    @property
    def n_blocks(self) -> int:
        return -(-self.K // self.block_size)

    @property
    def nbytes(self) -> int:
        zp = 0 if self.zero_points is None else self.zero_points.nbytes
        return int(self.B.nbytes + self.scales.nbytes + zp)


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes [..., n] (n·bits a multiple of 8) -> bytes [..., n·bits/8], code i at bit i·bits
    (little-endian)."""
    codes = np.ascontiguousarray(codes, dtype=np.uint8)
    lead, n = codes.shape[:-1], codes.shape[-1]
    per = 8 // bits
    c = codes.reshape(-1, n // per, per).astype(np.uint16)
    shifts = (np.arange(per, dtype=np.uint16) * bits)
    out = (c << shifts).sum(axis=-1).astype(np.uint8)
    return out.reshape(*lead, n // per)


def unpack_codes(packed: np.ndarray, bits: int, n: int) -> np.ndarray:
    """Inverse of :func:`pack_codes` (first `n` codes of each row)."""
    packed = np.ascontiguousarray(packed, dtype=np.uint8)
    lead = packed.shape[:-1]
    per = 8 // bits
    shifts = (np.arange(per, dtype=np.uint8) * bits)
    c = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return c.reshape(*lead, packed.shape[-1] * per)[..., :n]


def _blocked(codes_rows: np.ndarray, K: int, block: int) -> np.ndarray:
    """codes [N, K] -> [N, n_blocks, block] with the tail zero-padded."""
    N = codes_rows.shape[0]
    nb = -(-K // block)
    out = np.zeros((N, nb * block), np.uint8)
    out[:, :K] = codes_rows
    return out.reshape(N, nb, block)


def _pack_zero_points(zp: np.ndarray, bits: int) -> np.ndarray:
    """zero points [N, n_blocks] -> packed uint8 [N * ceil(n_blocks·bits/8)]."""
    N, nb = zp.shape
    per = 8 // bits
    width = -(-nb // per) * per
    z = np.zeros((N, width), np.uint8)
    z[:, :nb] = zp
    return pack_codes(z, bits).reshape(-1)


def matmulnbits_arrays(scheme, qt) -> NBits:
    """The MatMulNBits inputs of a quantized 2-D weight `qt` (scheme `scheme`, shape N × K)."""
    from workbench.schemes.integer import IntAffine
    N, K = qt.matrix_shape
    if isinstance(scheme, IntAffine):
        return _from_int(scheme, qt, N, K)
    if scheme.name in GGML_MAPPED:
        return _from_ggml(scheme, qt, N, K)
    raise ValueError(unsupported_reason(scheme.name))


def _from_int(scheme, qt, N, K) -> NBits:
    from workbench.schemes.packing import unpack_bits
    bits = scheme.bits
    codes = unpack_bits(qt.arrays["codes"], bits, N * K).reshape(N, K)
    scales = np.asarray(qt.arrays["scales"]).astype(np.float32)
    zeros = qt.arrays.get("zeros")
    gran = scheme.gran_name
    if gran.startswith("g"):
        block = int(gran[1:])
        sc = scales.reshape(N, K // block)
        zp = None if zeros is None else np.asarray(zeros, np.uint8).reshape(N, K // block)
    else:
        block = _next_pow2(K)
        if gran == "tensor":
            sc = np.full((N, 1), scales.reshape(-1)[0] if scales.size else 0, np.float32)
            zp = None if zeros is None else np.full((N, 1), np.asarray(zeros).reshape(-1)[0],
                                                    np.uint8)
        else:
            sc = scales.reshape(N, 1)
            zp = None if zeros is None else np.asarray(zeros, np.uint8).reshape(N, 1)
    B = pack_codes(_blocked(codes, K, block), bits)
    return NBits(K, N, bits, block, B, np.ascontiguousarray(sc, np.float32).reshape(-1),
                 None if zp is None else _pack_zero_points(zp, bits))


def _exact_zero_points(d: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Float32 zero points z with fl(z·d) == -m (searched within a few ulps of -m/d), the scales
    to use, and the number of blocks with no exact z. A block with d == 0 (constant: w = m) takes
    scale m and z = -1 (its codes are 0), which is exact."""
    d = d.astype(np.float32)
    m = m.astype(np.float32)
    scale = d.copy()
    const = d == 0
    scale[const] = m[const]
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(const, np.float32(-1), -m / np.where(const, 1, d)).astype(np.float32)
    z[const & (m == 0)] = 0
    ok = (z * scale).astype(np.float32) == -m
    best = z.copy()
    for direction in (np.float32(np.inf), np.float32(-np.inf)):
        c = z.copy()
        for _ in range(4):
            c = np.nextafter(c, direction).astype(np.float32)
            hit = ~ok & ((c * scale).astype(np.float32) == -m)
            best[hit] = c[hit]
            ok |= hit
    return best, scale, int((~ok).sum())


def _from_ggml(scheme, qt, N, K) -> NBits:
    blocks = np.ascontiguousarray(qt.arrays["blocks"]).reshape(-1).view(scheme.block_dtype)
    nb = K // 32
    if scheme.name == "q8_0":
        codes = (blocks["qs"].astype(np.int16) + 128).astype(np.uint8).reshape(N, nb, 32)
        d = blocks["d"].astype(np.float32).reshape(-1)
        return NBits(K, N, 8, 32, codes.copy(), d, None)
    qs = blocks["qs"]                                   # (n, 16): weight j low, j+16 high nibble
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=1).reshape(N, nb, 32)
    B = pack_codes(codes, 4)
    d = blocks["d"].astype(np.float32).reshape(-1)
    if scheme.name == "q4_0":
        return NBits(K, N, 4, 32, B, d, None)
    m = blocks["m"].astype(np.float32).reshape(-1)
    z, scale, inexact = _exact_zero_points(d, m)
    notes = []
    if inexact:
        notes.append(f"q4_1: {inexact} of {len(d)} blocks have no float32 zero point z with "
                     "z*d == -m exactly; their weights differ from ggml's by one rounding of m")
    return NBits(K, N, 4, 32, B, scale, z, notes)


def dequantize_nbits(nb: NBits) -> np.ndarray:
    """The weight [N, K] as ONNX Runtime's MatMulNBits (CPU, float32) dequantizes it."""
    nblk = nb.n_blocks
    q = unpack_codes(nb.B.reshape(nb.N, nblk, -1), nb.bits, nb.block_size).astype(np.float32)
    s = nb.scales.reshape(nb.N, nblk, 1)
    if nb.zero_points is None:
        w = (q - np.float32(1 << (nb.bits - 1))) * s
    elif nb.zero_points.dtype == np.float32:
        off = (nb.zero_points.reshape(nb.N, nblk, 1) * s).astype(np.float32)
        w = q * s - off
    else:
        per = 8 // nb.bits
        width = -(-nblk // per)
        zp = unpack_codes(nb.zero_points.reshape(nb.N, width), nb.bits, nblk).astype(np.float32)
        w = (q - zp[:, :, None]) * s
    return w.astype(np.float32).reshape(nb.N, nblk * nb.block_size)[:, :nb.K]

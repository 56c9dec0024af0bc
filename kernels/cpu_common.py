"""Shared numba helpers of the CPU kernels: the fused error accumulator, float16 bit
rounding, block keys, the GGML row encoding loop and the NaN/Inf count. Imports nothing from
``workbench``."""

from __future__ import annotations

from . import _numba_prelude  # noqa: F401  (before numba: cheaper start)
import numpy as np
from numba import njit, prange

_J = dict(cache=True, nogil=True)
_P = dict(cache=True, nogil=True, parallel=True)

F0 = np.float32(0.0)


# ---------------------------------------------------------------- error accumulation
@njit(fastmath={"reassoc", "contract"}, **_J)
def _acc_row(w, q, acc):
    """acc[0..4] = sum (w-q)^2, sum w^2, sum q^2, sum w*q, max |w-q| (float64; NaN propagates).

    The maximum is taken over the bit patterns of |w-q| as int64, in the same loop: for
    non-negative doubles their order is the order of the values, and a NaN (its sign bit
    cleared by abs) sorts above +inf, so a NaN anywhere gives NaN as the float reduction
    would. An integer max vectorizes; numba's float max with NaN handling did not (it was
    two thirds of the fused error's time)."""
    sse = 0.0
    sig = 0.0
    deq = 0.0
    dot = 0.0
    mx = np.int64(0)
    for i in range(w.shape[0]):
        a = np.float64(w[i])
        b = np.float64(q[i])
        d = a - b
        sse += d * d
        sig += a * a
        deq += b * b
        dot += a * b
        u = np.float64(abs(d)).view(np.int64)
        mx = u if u > mx else mx
    acc[0] = sse
    acc[1] = sig
    acc[2] = deq
    acc[3] = dot
    acc[4] = np.int64(mx).view(np.float64)


@njit(inline="always", **_J)
def _fp8_code(x, man, bias, maxcode):
    """Round float32 x to an FP8 code: nearest, ties to even, saturating at maxcode."""
    u = np.int64(np.float32(x).view(np.uint32))
    sign = (u >> 31) & 1
    ab = u & 0x7FFFFFFF
    e = (ab >> 23) - 127
    if e >= 1 - bias:
        sh = 23 - man
        code = ((ab + (1 << (sh - 1)) - 1 + ((ab >> sh) & 1)) >> sh) - ((127 - bias) << man)
    else:
        a = np.float64(abs(x)) * (2.0 ** (bias - 1 + man))
        code = np.int64(np.rint(a))
    if code > maxcode:
        code = maxcode
    return code | (sign << 7)


@njit(inline="always", **_J)
def _key_f32(k):
    return np.int32(k ^ ((k >> np.int32(31)) & np.int32(0x7FFFFFFF))).view(np.float32)


@njit(inline="always", **_J)
def _f32_to_f16_bits(x):
    """float16 bits of float32 x, nearest even; an overflow gives the Inf bits 0x7C00|sign."""
    u = np.int64(np.float32(x).view(np.uint32))
    return _fp8_code(abs(x), 10, 15, 0x7C00) | ((u >> 31) << 15)


@njit(inline="always", **_J)
def _put_f16(dst, x):
    """Store x as little-endian float16 in dst[0:2]; returns 1 when it overflows, else 0."""
    h = _f32_to_f16_bits(x)
    dst[0] = np.uint8(h & 255)
    dst[1] = np.uint8(h >> 8)
    return 1 if (h & 0x7FFF) == 0x7C00 else 0


@njit(**_J)
def _block_keys(u, t, nb):
    """t[b] = max over block b (32 weights, int32 bits u) of (|x| bits << 5 | 31 - j): the
    block's largest |x| and the first index j holding it (numpy's argmax). A pairwise max
    tree over the whole row: every level is one vectorizable loop, and there is no per-block
    horizontal reduction."""
    n = u.shape[0] >> 2                      # level 0 takes 4 weights: t is n/4 long
    for i in range(n):
        j = (4 * i) & 31
        a = (np.int64(u[4 * i] & np.int32(0x7FFFFFFF)) << 5) | (31 - j)
        b = (np.int64(u[4 * i + 1] & np.int32(0x7FFFFFFF)) << 5) | (30 - j)
        c = (np.int64(u[4 * i + 2] & np.int32(0x7FFFFFFF)) << 5) | (29 - j)
        e = (np.int64(u[4 * i + 3] & np.int32(0x7FFFFFFF)) << 5) | (28 - j)
        t[i] = max(max(a, b), max(c, e))
    while n > nb:
        n >>= 1
        for i in range(n):
            t[i] = max(t[2 * i], t[2 * i + 1])


@njit(inline="always", **_J)
def _encode_row(enc, row, wu, t, q, nb, bpb, tid, out):
    """One row of 32-weight GGML blocks: the block keys of wu (row's int32 bits) into t; a
    NaN/Inf in the row returns 2 and writes nothing, else block b of row is encoded by
    enc(x, key, q, dst, tid) into out[b*bpb : b*bpb+bpb] and the OR of enc's flags returned.
    enc: an inline block encoder (the format picked by tid); q its scratch, or None."""
    _block_keys(wu, t, nb)
    f = 0
    for b in range(nb):
        if (t[b] >> 5) >= 0x7F800000:
            f = 2
            break
    if f == 0:
        for b in range(nb):
            f |= enc(row[b * 32:b * 32 + 32], t[b], q, out[b * bpb:b * bpb + bpb], tid)
    return f


@njit(**_P)
def count_nonfinite(w):
    n = 0
    for r in prange(w.shape[0]):
        row = w[r]
        for c in range(row.shape[0]):
            x = row[c]
            if x != x or x == np.inf or x == -np.inf:
                n += 1
    return n


@njit(inline="always", **_J)
def _row_flag(row):
    """2 when `row` holds a NaN or an infinity (the GGML encoders' row flag: not searched), else 0."""
    for c in range(row.shape[0]):
        if not (abs(row[c]) < np.inf):
            return 2
    return 0


#: stand-ins for the argument a row kernel's entry does not use (cpu_ggml.ggml_rows,
#: cpu_affine_dequant.affine_rows): no weights (read-only, as every entry passes them), no
#: output rows, no error sums
NO_W = np.zeros((0, 0), np.float32)
NO_W.setflags(write=False)
NO_OUT = np.zeros((0, 0), np.float32)
NO_ACC = np.zeros((0, 5), np.float64)


# ---- byte readers of the GGML block decoders (cpu_ggml, iq23_decode)
@njit(inline="always", **_J)
def _h(src, p, f16):
    return f16[np.int64(src[p]) | (np.int64(src[p + 1]) << 8)]


@njit(inline="always", **_J)
def _u32(src, p):
    return (np.int64(src[p]) | (np.int64(src[p + 1]) << 8) | (np.int64(src[p + 2]) << 16)
            | (np.int64(src[p + 3]) << 24))

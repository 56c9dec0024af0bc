"""numba quantize kernels for Q4_1, Q5_0 and Q5_1 (32-weight GGML blocks), bit-identical to
``workbench.schemes.ggml.legacy`` (float32 operation for operation, no FMA contraction).

``legacy_encode`` flags per row: 1 a float16 field overflows, 2 NaN/Inf, 4 the block needs
the reference's own decision (a zero minimum, whose float16 sign depends on numpy's
reduction order, or a block with a subnormal float16 scale/min that the reference may turn
into its constant fallback). Any flag sends the whole tensor to the numpy reference.
Imports nothing from ``workbench``; every kernel releases the GIL (``nogil=True``).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .cpu_common import F0, _encode_row, _f32_to_f16_bits, _put_f16

_J = dict(cache=True, nogil=True)
_P = dict(cache=True, nogil=True, parallel=True)
TINY = np.float32(2.0 ** -14)


@njit(inline="always", **_J)
def _recip(d):
    inv = F0 if d == 0 else np.float32(1.0) / d
    return inv if abs(inv) < np.inf else F0


@njit(inline="always", **_J)
def _put_qs(q, dst, p):
    for j in range(16):
        dst[p + j] = np.uint8((q[j] & 15) | ((q[j + 16] & 15) << 4))


@njit(inline="always", **_J)
def _put_qh(q, dst, p):
    for t in range(4):
        v = 0
        for j in range(8):
            v |= ((q[8 * t + j] >> 4) & 1) << j
        dst[p + t] = np.uint8(v)


@njit(inline="always", **_J)
def _f16_abs_small(x):
    """True when float16(x) is subnormal or zero (|.| < 2**-14)."""
    return (_f32_to_f16_bits(x) & 0x7FFF) < 0x0400


@njit(**_J)
def _enc_q5_0(x, key, q, dst):
    mx = x[31 - (key & 31)]
    d = mx / np.float32(-16.0)
    inv = _recip(d)
    for j in range(32):
        v = np.int32(x[j] * inv + np.float32(16.5))
        q[j] = min(max(v, 0), 31)
    _put_qh(q, dst, 2)
    _put_qs(q, dst, 6)
    return _put_f16(dst, d)


@njit(**_J)
def _enc_q_1(x, nmax, q, dst, five):
    lo = x[0]
    hi = x[0]
    for j in range(32):
        v = x[j]
        lo = v if v < lo else lo
        hi = v if v > hi else hi
    if lo == 0:
        return 4
    d = (hi - lo) / np.float32(nmax)
    if _f16_abs_small(d) or _f16_abs_small(lo):
        return 4
    inv = _recip(d)
    for j in range(32):
        v = np.int32((x[j] - lo) * inv + np.float32(0.5))
        q[j] = min(max(v, 0), nmax)
    if five:
        _put_qh(q, dst, 4)
        _put_qs(q, dst, 8)
    else:
        _put_qs(q, dst, 4)
    f = _put_f16(dst, d)
    return f | _put_f16(dst[2:4], lo)


@njit(inline="always", **_J)
def _enc_block(x, key, q, dst, tid):
    """_encode_row's block encoder: Q4_1 (tid 1), Q5_0 (2) or Q5_1 (3); q int32[32] scratch."""
    if tid == 2:
        return _enc_q5_0(x, key, q, dst)
    return _enc_q_1(x, 15 if tid == 1 else 31, q, dst, tid == 3)


@njit(**_P)
def legacy_encode(w, wu, tid, bpb, blocks, flags):
    """Q4_1 (tid 1), Q5_0 (2), Q5_1 (3) blocks of w (rows, cols); flags as the module says."""
    rows, cols = w.shape
    nb = cols // 32
    nch = min(rows, 256)
    for ch in prange(nch):
        t = np.empty(max(cols >> 2, 1), np.int64)
        q = np.empty(32, np.int32)
        for r in range(ch * rows // nch, (ch + 1) * rows // nch):
            flags[r] = _encode_row(_enc_block, w[r], wu[r], t, q, nb, bpb, tid, blocks[r])

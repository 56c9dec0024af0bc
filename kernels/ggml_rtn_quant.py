"""numba quantize kernels of the GGML types whose llama.cpp quantizer is a fixed rounding rule
(no search, no importance): MXFP4 (``quantize_row_mxfp4_ref``), bit-identical to the numpy
references in ``workbench/schemes/ggml`` and so to llama.cpp's bytes (float32 operation for
operation, no FMA contraction).

``rtn_encode`` flags per row: 1 a float16 scale overflows, 2 NaN/Inf in the row (the
reference decides: it refuses). Parallel over rows. Imports nothing from ``workbench``.
"""

from __future__ import annotations

from . import _numba_prelude  # noqa: F401  (before numba: cheaper start)
import math

import numpy as np
from numba import njit, prange

_J = dict(cache=True, nogil=True)
_P = dict(cache=True, nogil=True, parallel=True)

F32 = np.float32
#: ggml ``kvalues_mxfp4`` (E2M1 doubled, a format fact)
FP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)
#: ggml_e8m0_to_fp32_half of every byte: 2^(e - 128)
E8M0_HALF = np.ldexp(np.float32(1), np.arange(256, dtype=np.int32) - 128).astype(np.float32)
#: internal ids of the types this module encodes (kernels/spec.py GGML_TYPES)
KINDS = {"MXFP4": 0}


@njit(inline="always", **_J)
def _best_fp4(x, d, kv):
    """best_index_mxfp4: the first index of least |kv[i]*d - x| (float32)."""
    bi = 0
    be = abs(kv[0] * d - x)
    for i in range(1, 16):
        er = abs(kv[i] * d - x)
        if er < be:
            be = er
            bi = i
    return bi


@njit(**_J)
def _mxfp4_row(row, nb, kv, e8, out):
    for b in range(nb):
        o = b * 32
        amax = F32(0.0)
        for j in range(32):
            a = abs(row[o + j])
            if amax < a:
                amax = a
        e = 0
        if amax > 0:
            fl = math.floor(F32(math.log2(np.float64(amax))))
            e = (np.int64(fl) + 125) & 255
        d = e8[e]
        p = b * 17
        out[p] = np.uint8(e)
        for j in range(16):
            i0 = _best_fp4(row[o + j], d, kv)
            i1 = _best_fp4(row[o + 16 + j], d, kv)
            out[p + 1 + j] = np.uint8(i0 | (i1 << 4))
    return 0


@njit(**_P)
def rtn_encode(w, kind, kv, e8, blocks, flags):
    """Blocks of w (rows, cols) for type `kind` (KINDS) into blocks (rows, bytes per row)."""
    rows, cols = w.shape
    for r in prange(rows):
        row = w[r]
        f = 0
        for c in range(cols):
            if not (abs(row[c]) < np.inf):
                f = 2
                break
        if f == 0:
            if kind == 0:
                f = _mxfp4_row(row, cols // 32, kv, e8, blocks[r])
        flags[r] = f


def encode_blocks(name: str, w2d: np.ndarray, blocks: np.ndarray, flags: np.ndarray) -> None:
    """Fill blocks (rows, bytes per row) and flags (rows,) from float32 w2d for GGML type
    `name` (a KINDS key)."""
    rtn_encode(w2d, KINDS[name], FP4_VALUES, E8M0_HALF, blocks, flags)

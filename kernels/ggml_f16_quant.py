"""Q4_0 / Q8_0 blocks straight from float16 or bfloat16 weights (numba; the GIL released).

``ggml_encode_f16`` widens each row into a small per-thread float32 row (the conversions of
``kernels.convert``, exact) and encodes it with ``cpu_ggml.ggml_encode``'s very row encoder
(``cpu_common._encode_row`` with ``cpu_ggml._enc_block``), so its bytes and flags are that
kernel's on the widened tensor (tests/kernels/test_ggml_f16_quant.py). The widened tensor is
never written out: an F16 checkpoint is quantized in one pass over its 2-byte weights instead
of a widening pass (4 bytes a weight written, then read again) and an encoding pass. Imports
nothing from ``workbench``.
"""

from __future__ import annotations

from . import _numba_prelude  # noqa: F401  (before numba: cheaper start)
import numpy as np
from numba import njit, prange

from .convert import _f16_bits_to_f32_bits
from .cpu_common import _encode_row
from .cpu_ggml import _enc_block


@njit(cache=True, nogil=True, parallel=True)
def ggml_encode_f16(h, bf16, tid, bpb, blocks, flags):
    """Q4_0 (tid 0) / Q8_0 (tid 4) blocks of the float16 (bf16 False) or bfloat16 (True) bits
    h (rows, cols; uint16); flags[r] as ggml_encode's (1: a block scale overflows float16,
    2: NaN/Inf in row r)."""
    rows, cols = h.shape
    nb = cols // 32
    nch = min(rows, 256)
    for ch in prange(nch):
        t = np.empty(max(cols >> 2, 1), np.int64)
        bits = np.empty(cols, np.uint32)
        row = bits.view(np.float32)
        wu = bits.view(np.int32)
        for r in range(ch * rows // nch, (ch + 1) * rows // nch):
            src = h[r]
            if bf16:
                for c in range(cols):
                    bits[c] = np.uint32(src[c]) << np.uint32(16)
            else:
                for c in range(cols):
                    bits[c] = _f16_bits_to_f32_bits(src[c])
            flags[r] = _encode_row(_enc_block, row, wu, t, None, nb, bpb, tid, blocks[r])

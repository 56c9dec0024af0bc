"""What ONNX Runtime's ``com.microsoft.MatMulNBits`` can hold: the facts the runtime rules
(workbench.quant.runtimes, target ``onnxruntime``) decide by and the exporter
(workbench.export.onnx_layout) lays weights out by. Verified against onnxruntime 1.32's CPU
kernel (tests/workbench/test_onnx_layout.py).
"""

from __future__ import annotations

import re

ORT_BITS = (2, 4, 8)
MAX_BLOCK = {2: 256, 4: 32768, 8: 32768}   # 2-bit: ORT 1.32's CPU kernel refuses blocks > 256;
#                                             4/8-bit verified up to 32768
_INT = re.compile(r"^int([2-8])-(tensor|channel|g\d+)(-asym)?((?:@[a-z0-9.]+)*)$")
GGML_MAPPED = ("q4_0", "q4_1", "q8_0")


def _next_pow2(n: int) -> int:
    return max(16, 1 << max(0, int(n) - 1).bit_length())


def unsupported_reason(scheme_name: str, shape=None) -> str | None:
    """Why MatMulNBits cannot hold `scheme_name` (None: it can)."""
    from workbench.schemes import get_scheme
    base = get_scheme(scheme_name).name
    m = _INT.match(base)
    if m:
        bits = int(m.group(1))
        if bits not in ORT_BITS:
            return (f"MatMulNBits has no {bits}-bit form in onnxruntime's CPU kernel (bits 2, 4, "
                    f"8; and q4_0 q4_1 q8_0)")
        if shape is not None and len(shape) == 2 and m.group(2) in ("tensor", "channel"):
            if _next_pow2(shape[1]) > MAX_BLOCK[bits]:
                return (f"a per-row block of {_next_pow2(shape[1])} is more than onnxruntime's "
                        f"{bits}-bit MatMulNBits kernel takes ({MAX_BLOCK[bits]})")
        return None
    if base in GGML_MAPPED:
        return None
    return (f"ONNX Runtime's MatMulNBits cannot express {base} (int2/int4/int8 block-wise, "
            "per-channel or per-tensor, symmetric or asymmetric; q4_0, q4_1, q8_0)")

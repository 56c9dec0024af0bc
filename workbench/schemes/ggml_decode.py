"""Dequantize raw GGML block rows (from a GGUF file) to float32."""

from __future__ import annotations

import numpy as np

from workbench.core.errors import WorkbenchError


def dequantize_ggml_rows(raw: np.ndarray, type_name: str) -> np.ndarray:
    """raw: uint8 (rows x bytes-per-row) of GGML blocks of type `type_name`."""
    try:
        from workbench.schemes import get_scheme
        scheme = get_scheme(type_name.lower())
    except WorkbenchError:
        scheme = None
    if scheme is not None and hasattr(scheme, "dequantize_blocks"):
        return scheme.dequantize_blocks(np.ascontiguousarray(raw))
    import gguf
    try:
        qtype = gguf.GGMLQuantizationType[type_name]
        return np.asarray(gguf.quants.dequantize(np.ascontiguousarray(raw), qtype), dtype=np.float32)
    except (KeyError, NotImplementedError) as exc:
        raise WorkbenchError(f"GGML type {type_name} cannot be dequantized (the workbench "
                             "decodes F32/F16/BF16, Q4_0 ... Q8_0, the K-quants, IQ4_NL, IQ4_XS, IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M, MXFP4, NVFP4, TQ1_0 and TQ2_0)") from exc

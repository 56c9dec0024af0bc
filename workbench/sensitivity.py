"""Per-tensor, per-scheme sensitivity. `weight`: squared reconstruction error (evaluate's sse).
`activation`: sum_j E[x_j^2] * ||dW[:, j]||^2 with E[x_j^2] from calibration (or an imatrix),
the quantity llama.cpp's imatrix weights the K-quant search with."""

from __future__ import annotations

import numpy as np

from .progress import Progress


def second_moments(model, calib=None, imatrix=None, samples=None):
    """Job: {workbench name: E[x_j^2]} from calibration inputs or an imatrix file."""
    if imatrix:
        from .export.llama_tensor_types import detect_family, llama_cpp_name
        from .imatrix import read_imatrix
        im = read_imatrix(imatrix)
        fam = detect_family(model)
        out = {}
        for n in model.tensors:
            g = llama_cpp_name(n, fam)
            if g in im:
                out[n] = im[g]
        yield Progress(1, 1, "imatrix read")
        return out
    from .imatrix import collect
    stats, _, _ = yield from collect(model, calib, samples)
    return {n: s2 / max(c, 1) for n, (s2, c) in stats.items()}


def activation_error(model, name: str, scheme: str, ex2: np.ndarray) -> float:
    from .runner import dequantized
    w = model.read_matrix(name).reshape(model.info(name).shape).astype(np.float32)
    dw = dequantized(model, name, scheme) - w
    return float(((dw.astype(np.float64) ** 2).sum(0)) @ ex2)


def activation_errors(model, schemes, moments: dict):
    """Job: {(name, scheme): activation-weighted error} for the tensors with moments."""
    out = {}
    items = [n for n in model.tensors if n in moments]
    for i, n in enumerate(items):
        yield Progress(i, len(items), f"sensitivity {n}")
        for s in schemes:
            out[(n, s)] = activation_error(model, n, s, moments[n])
    yield Progress(len(items), len(items), "done")
    return out

"""Importance-weighted encoders for the GGML block formats (llama.cpp's ``quant_weights`` path).

Same byte layouts as workbench/schemes/ggml (the packing helpers are reused), only the
per-weight importance in the scale/min searches changes: as llama.cpp's
``quantize_row_*_impl`` does with an imatrix, weight j of a block gets

    qw[j] * sqrt(sigma2 + x_j^2)

with sigma2 = Σx²/32 for the 32-weight blocks (ggml-quants.c), and the searches are the
project's (search.py): weighted least squares for each candidate scale. The K-quants instead
minimise Σ qw_j (x_j − y_j)² itself (the figure ‖XW − XŴ‖² reduces to for uncorrelated
inputs) with their own searches (Q2_K/Q4_K/Q5_K: schemes/ggml/affine_k.py, numba kernel
kernels/kquant_affine.py; Q3_K/Q6_K: schemes/ggml/sym_k.py, kernels/kquant_sym.py). IQ4_NL
weighs its codebook search as llama.cpp does, qw * sqrt(2 Σx²/32 + x²) (schemes/ggml/iq4_nl.py,
kernel kernels/iq4nl_quant.py). IQ4_XS is llama.cpp's own quantize_row_iq4_nl_impl with the
same weights, sigma2 over the 256-weight super-block (schemes/ggml/iq4_xs.py, kernel
kernels/iq4xs_quant.py): given the same importance its bytes are llama.cpp's. Q8_0 has no
weighted path and is refused; llama.cpp ignores the imatrix for Q8_0 too. IQ3_XXS/IQ3_S weigh
their grid search as llama.cpp does (qw * sqrt(2 sum x^2/256 + x^2)) with the workbench's own
search (schemes/ggml/iq3.py, kernel kernels/iq3_quant.py). IQ2_XXS/IQ2_XS/IQ2_S run
llama.cpp's lattice search with the same weights, then pick d and the sub-block scales by
sum qw (x - y)^2 (schemes/ggml/iq2.py, kernel kernels/iq2_quant.py). IQ1_S/IQ1_M: the
workbench's search with these weights, d and l by sum qw (x - y)^2 (schemes/ggml/iq1.py,
kernel kernels/iq1_quant.py).

``weighted_encode(scheme, x, qw)``: x float32 (n_blocks, QK), qw (n_blocks, QK) -> packed
blocks uint8 (n_blocks, type_size).
"""

from __future__ import annotations

import numpy as np

from workbench.schemes.ggml.common import to_fp16
from workbench.schemes.ggml.search import affine_search, symmetric_search
from workbench.schemes.registry import weighted_types

F = np.float32
#: the types with a weighted encoder: those whose scheme class names one (weighted_encoder)
SUPPORTED = weighted_types()


def _llama_weights(x: np.ndarray, qw: np.ndarray, sub: int, factor: float) -> np.ndarray:
    """qw * sqrt(sigma2 + x^2), sigma2 = factor * sum(x^2) / n over each block of `x`."""
    sigma2 = F(factor) * np.einsum("ij,ij->i", x, x) / F(x.shape[1])
    w = qw * np.sqrt(sigma2[:, None] + x * x)
    return w.reshape(-1, sub)


def _legacy_sym(scheme, x, qw, nmax):
    from workbench.schemes.ggml.legacy import _high_bits, _nibbles
    w = _llama_weights(x, qw, 32, 1.0)
    scale, _ = symmetric_search(x, w, nmax, range(-9, 10), refine=1)
    d16 = to_fp16(scale)
    d = d16.astype(F)
    with np.errstate(divide="ignore", invalid="ignore"):
        L = np.where(d[:, None] != 0, np.rint(x / np.where(d != 0, d, F(1))[:, None]), 0)
    q = (np.clip(L, -nmax, nmax - 1) + nmax).astype(np.uint8)
    out = np.empty(x.shape[0], scheme.block_dtype)
    out["d"] = d16
    out["qs"] = _nibbles(q)
    if nmax == 16:
        out["qh"] = _high_bits(q)
    return out


def _legacy_affine(scheme, x, qw, nmax):
    from workbench.schemes.ggml.legacy import _high_bits, _nibbles
    w = _llama_weights(x, qw, 32, 1.0)
    scale, offset, _ = affine_search(x, w, nmax, -0.9, 0.05, 36, use_abs=False)
    d16, m16 = to_fp16(scale), to_fp16(-offset)
    d, m = d16.astype(F), m16.astype(F)
    with np.errstate(divide="ignore", invalid="ignore"):
        L = np.where(d[:, None] != 0,
                     np.rint((x - m[:, None]) / np.where(d != 0, d, F(1))[:, None]), 0)
    q = np.clip(L, 0, nmax).astype(np.uint8)
    out = np.empty(x.shape[0], scheme.block_dtype)
    out["d"], out["m"] = d16, m16
    out["qs"] = _nibbles(q)
    if nmax == 31:
        out["qh"] = _high_bits(q)
    return out


def _searched_k(scheme, x, qw, driver: str):
    """Q2_K..Q6_K: the scheme's own search (schemes/ggml/affine_k.py, sym_k.py) minimising the
    qw-weighted squared error directly (the diagonal layer-output error), run by the numba
    kernel (`driver`, a kernels.cpu_ops function; bit-identical) when it can, else by the
    numpy reference."""
    from workbench.quant import accel
    from kernels import backend
    spec = accel.spec_for(scheme)
    if spec is not None and spec.search and backend.resolve("auto") != "numpy":
        from kernels import cpu_ops
        try:
            res = getattr(cpu_ops, driver)(spec, x, qw)
        except cpu_ops.NonFinite:
            res = None
        if res is not None:
            return res["blocks"].reshape(-1).view(scheme.block_dtype)
    return scheme.encode(x, qw)


def _iq4_nl(scheme, x, qw):
    """IQ4_NL: the scheme's codebook search with llama.cpp's importance weights, by the numba
    kernel (bit-identical) when it can, else by the numpy reference. The (n_blocks, 32) blocks
    go to the kernel as rows of up to 64 blocks (it searches 4 blocks at a time)."""
    from workbench.quant import accel
    from kernels import backend
    spec = accel.spec_for(scheme)
    n = x.shape[0]
    if spec is not None and spec.quant and n and backend.resolve("auto") != "numpy":
        from kernels import cpu_ops
        k = next(k for k in (64, 32, 16, 8, 4, 2, 1) if n % k == 0)
        try:
            res = cpu_ops.iq4nl_blocks(spec, x.reshape(n // k, 32 * k), qw.reshape(n // k, 32 * k))
        except cpu_ops.NonFinite:
            res = None
        if res is not None:
            return res["blocks"].reshape(-1).view(scheme.block_dtype)
    return scheme.encode(x, qw)


def _iq4_xs(scheme, x, qw, kernel="iq4xs_blocks"):
    """IQ4_XS (and IQ2_XXS, kernel iq2_blocks): llama.cpp's search with its importance
    weights, by the numba kernel (bit-identical) when it can, else by the numpy reference;
    blocks go as rows of up to 16."""
    from workbench.quant import accel
    from kernels import backend
    spec = accel.spec_for(scheme)
    n = x.shape[0]
    if spec is not None and spec.quant and n and backend.resolve("auto") != "numpy":
        from kernels import cpu_ops
        k = next(k for k in (16, 8, 4, 2, 1) if n % k == 0)
        try:
            res = getattr(cpu_ops, kernel)(spec, x.reshape(n // k, 256 * k),
                                           qw.reshape(n // k, 256 * k))
        except cpu_ops.NonFinite:
            res = None
        if res is not None:
            return res["blocks"].reshape(-1).view(scheme.block_dtype)
    return scheme.encode(x, qw)


def _iq3(scheme, x, qw):
    """IQ3_XXS / IQ3_S: the workbench's grid search with these weights, by the numba kernel
    (bit-identical) when it can, else by the numpy reference; blocks go as rows of up to 16."""
    from workbench.quant import accel
    from kernels import backend
    spec = accel.spec_for(scheme)
    n = x.shape[0]
    if spec is not None and spec.quant and n and backend.resolve("auto") != "numpy":
        from kernels import cpu_ops
        k = next(k for k in (16, 8, 4, 2, 1) if n % k == 0)
        try:
            res = cpu_ops.iq3_blocks(spec, x.reshape(n // k, 256 * k),
                                     qw.reshape(n // k, 256 * k))
        except cpu_ops.NonFinite:
            res = None
        if res is not None:
            return res["blocks"].reshape(-1).view(scheme.block_dtype)
    return scheme.encode(x, qw)


#: the weighted encoders by name: a scheme's ``weighted_encoder`` is (name, *arguments)
ENCODERS = {"legacy_sym": _legacy_sym, "legacy_affine": _legacy_affine, "searched_k": _searched_k,
            "iq4_nl": _iq4_nl, "iq4_xs": _iq4_xs, "iq3": _iq3}


def _encode(scheme, x, qw):
    if not scheme.weighted_encoder:
        raise KeyError(scheme.name)
    name, *args = scheme.weighted_encoder
    return ENCODERS[name](scheme, x, qw, *args)


def weighted_encode(scheme, x: np.ndarray, qw: np.ndarray) -> np.ndarray:
    """Packed blocks (uint8 (n_blocks, type_size)) of x under `scheme` weighted by qw."""
    x = np.ascontiguousarray(x, F).reshape(-1, scheme.block_size)
    qw = np.ascontiguousarray(qw, F).reshape(x.shape)
    qw = np.where(np.isfinite(qw) & (qw > 0), qw, F(0))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        enc = _encode(scheme, x, qw)
    scheme._check_scales(enc, x)
    if scheme.zero_when_worse:
        scheme._zero_worse_blocks(enc, x)
    return enc.view(np.uint8).reshape(x.shape[0], scheme.type_size)

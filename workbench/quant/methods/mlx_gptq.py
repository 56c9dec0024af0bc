"""GPTQ's column loop (workbench.quant.methods.gptq.gptq_columns) for the MLX schemes.

MLX's groups are runs of G consecutive columns of a row (affine G ∈ {32, 64, 128}; mxfp4 /
mxfp8 32, nvfp4 16), like the GGML blocks, so the block-wise form applies: when a group's
first column is reached, the group's *current* (already error-compensated) weights, every row,
are quantized by the importance-weighted search of methods/mlx_weighted.py, weighted by the
damped Hessian's diagonal over the group's columns (the layer output error a lone column's
change makes), and the group's dequantized values (as mx.dequantize computes them) are the q
of its columns; the sequential updates carry its rounding error to the later groups.

Every group is stored as the scheme stores it (codes, scales and biases, or scale bytes, of
that group), and G·B is a multiple of 32 for every MLX mode, so a group's packed words never
share a word with the next group's: the tensor's arrays are the groups' arrays side by side
along each row, exactly the MLX layout the export writes, and dequantizing them gives the
values the loop used.
"""

from __future__ import annotations

import numpy as np

from workbench.schemes.base import QuantizedTensor


class MlxColumns:
    """Column values for an MLX scheme: each group quantized from its current weights."""

    def __init__(self, scheme, rows, cols, hdiag):
        self.s = scheme
        self.G = scheme.group
        self.hdiag = np.asarray(hdiag, np.float64)
        self.deq = np.zeros((rows, cols), np.float64)
        self.parts = []

    def start(self, j, current):
        from workbench.quant.methods.imatrix import importance
        from workbench.quant.methods.mlx_weighted import weighted_quantize
        cur = np.ascontiguousarray(current(j, self.G), np.float32)
        qt = weighted_quantize(self.s, cur, importance(self.hdiag[j:j + self.G]), "gptq")
        self.parts.append(qt)
        self.deq[:, j:j + self.G] = self.s.dequantize(qt).reshape(cur.shape)

    def round(self, w, j):
        return self.deq[:, j]

    def value(self, code, j):
        return code

    def result(self, codes, shape, meta):
        arrays = {k: np.ascontiguousarray(np.concatenate(
            [p.arrays[k].reshape(shape[0], -1) for p in self.parts], axis=1))
            for k in self.parts[0].arrays}
        return QuantizedTensor(self.s.name, shape, arrays, meta)

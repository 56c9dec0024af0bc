"""Importance-weighted quantization (llama.cpp's imatrix idea) for integer and GGML schemes.

The layer output error of a weight change ΔW is E‖x·ΔWᵀ‖² = Σ_ij ΔW_ij² E[x_j²] when the
input channels are uncorrelated, so each weight's rounding error is weighted by the second
moment d_j = E[x_j²] of its input channel:

* integer schemes (``int{B}-{G}[-asym]``): per block, the stored scale (and zero point) that
  minimises Σ_j d_j (w_j − Q(w_j))² over the scheme's own range shrunk by a grid of ratios
  (symmetric: 31 ratios 1.0..0.4, each also refitted by weighted least squares; asymmetric:
  10×10 ratios for the two ends). The scheme's own range is a candidate, so the weighted
  error is never above RTN's.
* GGML types (Q4_0, Q5_0, Q4_1, Q5_1, Q2_K..Q6_K): the K-quant / legacy scale searches with
  llama.cpp's imatrix weighting qw_j·sqrt(σ² + x_j²) (methods/ggml_weighted.py).
* MLX schemes (``mlx-q{B}-g{G}``, ``mlx-mxfp4`` ...): per group, the stored scale and bias (or
  scale byte) of least Σ d_j (w_j − ŵ_j)² among mlx's own and a searched set
  (methods/mlx_weighted.py).
"""

from __future__ import annotations

import numpy as np

from workbench.schemes.base import QuantizedTensor
from workbench.schemes.ggml.common import GGMLScheme
from workbench.quant.methods import intq
from workbench.quant.methods.base import Method
from workbench.quant.methods.ggml_weighted import SUPPORTED, weighted_encode


def importance(d: np.ndarray) -> np.ndarray:
    """E[x_j^2] as float32 weights; channels never active get a small share of the mean so a
    block of dead channels still gets a sensible (unweighted) scale."""
    d = np.asarray(d, np.float64).reshape(-1)
    d = np.where(np.isfinite(d) & (d > 0), d, 0.0)
    m = d.mean() if d.size and d.mean() > 0 else 1.0
    return (d + 1e-6 * m).astype(np.float32)


class Imatrix(Method):
    name = "imatrix"
    row_local = True
    needs = ("d",)
    description = "importance-weighted scale search (weights E[x_j^2] from calibration)"

    def supports(self, scheme):
        from workbench.schemes.mlx import MLXScheme
        if intq.is_int(scheme) or scheme.name in SUPPORTED or isinstance(scheme, MLXScheme):
            return None
        return (f"method imatrix supports the integer schemes, the MLX schemes and "
                f"{', '.join(SUPPORTED)}, not {scheme.name}")

    def _quantize(self, w, scheme, stats, *, tensor=None, **opts):
        rows, cols = w.shape
        imp = importance(stats.d)
        from workbench.schemes.mlx import MLXScheme
        if isinstance(scheme, MLXScheme):
            from workbench.quant.methods.mlx_weighted import weighted_quantize
            return weighted_quantize(scheme, w, imp, self.name)
        if isinstance(scheme, GGMLScheme):
            qw = np.broadcast_to(imp[None, :], (rows, cols))
            raw = weighted_encode(scheme, w.reshape(-1, scheme.block_size),
                                  np.ascontiguousarray(qw).reshape(-1, scheme.block_size))
            return QuantizedTensor(scheme.name, (rows, cols),
                                   {"blocks": raw.reshape(rows, -1)}, {"method": self.name})
        blocks = intq.block_importance(scheme, imp, rows, cols)
        wb = intq.as_blocks(w, scheme.gran)
        scale, zero = intq.weighted_qparams(scheme, wb, blocks)
        codes = intq.codes_for(scheme, wb, scale, zero)
        return intq.build(scheme, (rows, cols), codes, scale, zero, {"method": self.name})

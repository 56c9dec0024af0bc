"""Qt-free computations behind the plots (run on the compute thread, never the GUI thread).

* :func:`grid_levels`: the values a scheme can represent for a block whose range is the
  tensor's [min, max] — found by quantizing a probe matrix whose every row holds the
  tensor's min and max plus one ramp value, so it works for any registered scheme
  (NF4, FP8, GGML) without knowing its internals. Integer schemes search each block's scale
  by the block's error, so a probe row's scale would depend on its ramp value: their grid is
  the one of a block spread evenly over [min, max] (its qparams), applied to the ramp.
* :func:`dequantized_histogram`: the histogram of the dequantized tensor on the same
  bin edges as the original's (workbench.quant.stats), for the overlay.
* :func:`outlier_channels`: output channels whose absmax is far above the typical one.
"""

from __future__ import annotations

import numpy as np

from workbench.api.tensors import quantize
from workbench.api.plans import KEEP
from workbench.api.plans import get_scheme

MAX_GRID_LINES = 300


def grid_levels(scheme_name: str, lo: float, hi: float, points: int = 2049) -> np.ndarray | None:
    """Sorted representable values in [lo, hi] for a block spanning [lo, hi]."""
    if scheme_name == KEEP or not np.isfinite(lo) or not np.isfinite(hi) or hi <= lo:
        return None
    scheme = get_scheme(scheme_name)
    cols = scheme.block_size or 256
    ramp = np.linspace(lo, hi, points, dtype=np.float32)
    from workbench.api.methods import intq
    if intq.is_int(scheme):
        block = np.linspace(lo, hi, cols, dtype=np.float32)[None, :]
        scale, zero = scheme.choose_qparams(block)
        scales = np.repeat(np.asarray(scale).reshape(-1)[:1], points)
        zeros = None if zero is None else np.repeat(np.asarray(zero).reshape(-1)[:1], points)
        return np.unique(np.asarray(intq.fake(scheme, ramp[:, None], scales, zeros),
                                    dtype=np.float32))
    probe = np.repeat(ramp[:, None], cols, axis=1)
    probe[:, 0] = hi
    probe[:, 1] = lo
    qt = quantize(probe, scheme_name)
    deq = np.asarray(scheme.dequantize(qt), dtype=np.float32).reshape(points, cols)
    return np.unique(deq[:, 2])


def dequantized_histogram(model, name: str, scheme_name: str, edges: np.ndarray) -> np.ndarray | None:
    """Counts of the dequantized tensor in the original histogram's bins."""
    info = model.info(name)
    if scheme_name == KEEP or not info.is_float:
        return None
    scheme = get_scheme(scheme_name)
    if scheme.ineligible_reason(info.shape):
        return None
    w = model.read_matrix(name)
    qt = quantize(w, scheme_name, tensor=name)
    wq = np.asarray(scheme.dequantize(qt), dtype=np.float32).ravel()
    wq = wq[np.isfinite(wq)]
    wq = np.clip(wq, edges[0], edges[-1])
    counts, _ = np.histogram(wq, bins=edges)
    return counts


def outlier_channels(ch_absmax: np.ndarray, k: float = 6.0) -> np.ndarray:
    """Boolean mask: absmax above median + k robust sigmas (MAD), or 3x the median."""
    a = np.asarray(ch_absmax, dtype=np.float64)
    if a.size == 0 or not np.isfinite(a).any():
        return np.zeros(a.shape, bool)
    med = float(np.nanmedian(a))
    mad = 1.4826 * float(np.nanmedian(np.abs(a - med)))
    limit = med + k * mad if mad > 0 else 3.0 * med
    with np.errstate(invalid="ignore"):
        return np.nan_to_num(a, nan=-np.inf) > limit

"""Activation range calibration for int8 / fp8 activations, from a histogram of |x| (or of x)
collected over calibration inputs: min/max, percentile, MSE and KL (TensorRT-style entropy)
calibration. Each returns the clipping amax (symmetric); ``scale = amax / qmax``.

    hist, edges = np.histogram(np.abs(x), bins=2048, range=(0, absmax))
    amax = calibrate_range(hist, edges, "kl", bits=8)

``activation_entry(amax, bits=8, kind="int")`` is the plan / compressed-tensors
``input_activations`` data: {"num_bits", "type", "symmetric": true, "strategy": "tensor",
"dynamic": false, "amax", "scale"}.
"""

from __future__ import annotations

import numpy as np

from workbench.core.errors import WorkbenchError

METHODS = ("minmax", "percentile", "mse", "kl")
FP8_E4M3_MAX = 448.0


def _qmax(bits: int, kind: str) -> float:
    return FP8_E4M3_MAX if kind == "float" else float((1 << (bits - 1)) - 1)


def calibrate_range(hist, edges, method: str = "minmax", bits: int = 8, kind: str = "int",
                    percentile: float = 99.99) -> float:
    """The clipping amax of |x| from a histogram of |x| (`edges` from 0)."""
    hist = np.asarray(hist, np.float64)
    edges = np.asarray(edges, np.float64)
    if hist.sum() <= 0:
        return 0.0
    centers = (edges[:-1] + edges[1:]) / 2
    nz = np.nonzero(hist)[0]
    top = float(edges[nz[-1] + 1])
    if method == "minmax":
        return top
    if method == "percentile":
        c = np.cumsum(hist) / hist.sum()
        return float(edges[min(np.searchsorted(c, percentile / 100.0) + 1, len(edges) - 1)])
    cands = edges[1:][edges[1:] >= top * 0.05]
    cands = cands[:: max(1, len(cands) // 256)]
    if method == "mse":
        qmax = _qmax(bits, kind)
        best = (np.inf, top)
        for a in cands:
            step = a / qmax
            if kind == "float":
                # relative step of e4m3 (3 mantissa bits) below amax
                q = np.where(centers > a, a, centers)
                e = np.where(centers > a, (centers - a) ** 2, (q * 2.0 ** -4) ** 2 / 3)
            else:
                e = np.where(centers > a, (centers - a) ** 2, step * step / 12)
            err = float((hist * e).sum())
            if err < best[0]:
                best = (err, float(a))
        return best[1]
    if method == "kl":
        levels = 1 << (bits - 1)
        p_full = hist / hist.sum()
        best = (np.inf, top)
        for a in cands:
            i = int(np.searchsorted(edges, a)) - 1
            i = max(i, levels)
            p = hist[: i + 1].copy()
            p[i] += hist[i + 1:].sum()
            # quantize p's bins into `levels` groups, expand back uniformly over non-empty bins
            idx = (np.arange(i + 1) * levels) // (i + 1)
            q = np.zeros_like(p)
            for g in range(levels):
                sel = idx == g
                nzs = sel & (p > 0)
                if nzs.any():
                    q[nzs] = p[sel].sum() / nzs.sum()
            pn, qn = p / p.sum(), q / max(q.sum(), 1e-300)
            m = pn > 0
            kl = float(np.sum(pn[m] * np.log(pn[m] / np.maximum(qn[m], 1e-12))))
            if kl < best[0]:
                best = (kl, float(a))
        _ = p_full
        return best[1]
    raise WorkbenchError(f"unknown activation calibration '{method}' (choose from "
                         f"{', '.join(METHODS)})")


def activation_entry(amax: float, bits: int = 8, kind: str = "int", method: str = "minmax") -> dict:
    """The per-linear-input record for plans and compressed-tensors ``input_activations``."""
    qmax = _qmax(bits, kind)
    return {"num_bits": int(bits), "type": kind, "symmetric": True, "strategy": "tensor",
            "dynamic": False, "method": method, "amax": float(amax),
            "scale": float(amax / qmax) if amax > 0 else 1.0}

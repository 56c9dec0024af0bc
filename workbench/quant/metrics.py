"""Reconstruction-error metrics, per tensor and for a whole model.

All tensor metrics derive from a handful of sums (the same sums the fused numba kernel
produces without writing the dequantized tensor), so numpy and kernel paths agree:

  sse   = sum (w - w')^2        sig  = sum w^2        deq = sum w'^2     dot = sum w*w'
  max_abs_err, and per output channel: ch_sse, ch_sig

  mse = sse/n   rel_rmse = sqrt(sse/sig)   sqnr_db = 10 log10(sig/sse)
  cosine = dot / sqrt(sig*deq)   per-channel relative error = sqrt(ch_sse/ch_sig)

Defined values at the edges (never NaN, never a math domain error):
  * exact reconstruction (sse = 0), including an all-zero tensor and an empty one:
    sqnr_db = +inf, rel_rmse = 0, cosine = 1, ``exact`` = True. In JSON (strict: no
    Infinity) an infinite SQNR is written as null and ``"exact": true`` says why.
  * a zero signal with a non-zero error (sig = 0 < sse): sqnr_db = -inf, rel_rmse = inf.
  * otherwise sqnr_db = 10 (log10 sig - log10 sse), finite even when sig/sse would overflow
    or underflow a float (weights near float32's limits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass
class ErrorSums:
    n: int
    sse: float
    sig: float
    deq: float
    dot: float
    max_abs_err: float
    ch_sse: np.ndarray
    ch_sig: np.ndarray

    @classmethod
    def from_arrays(cls, w: np.ndarray, wq: np.ndarray) -> "ErrorSums":
        """Reference (numpy) computation on 2-D (rows, cols) float32 arrays."""
        w64 = np.asarray(w, dtype=np.float64)
        q64 = np.asarray(wq, dtype=np.float64)
        if w64.ndim != 2:
            w64 = w64.reshape(1, w64.size)
            q64 = q64.reshape(1, q64.size)
        d = w64 - q64
        ch_sse = (d * d).sum(axis=1)
        ch_sig = (w64 * w64).sum(axis=1)
        return cls(n=int(w64.size), sse=float(ch_sse.sum()), sig=float(ch_sig.sum()),
                   deq=float((q64 * q64).sum()), dot=float((w64 * q64).sum()),
                   max_abs_err=float(np.abs(d).max()) if d.size else 0.0,
                   ch_sse=ch_sse, ch_sig=ch_sig)

    @classmethod
    def zero(cls, w: np.ndarray) -> "ErrorSums":
        """Sums for a tensor kept exactly (no error)."""
        shape = np.shape(w)
        rows = int(shape[0]) if len(shape) >= 2 else 1
        cols = int(np.prod(shape[1:])) if len(shape) >= 2 else int(np.prod(shape))
        w64 = np.asarray(w, dtype=np.float64).reshape(rows, cols)   # (3, 0) and (0, 4) too
        ch_sig = (w64 * w64).sum(axis=1)
        sig = float(ch_sig.sum())
        return cls(int(w64.size), 0.0, sig, sig, sig, 0.0, np.zeros_like(ch_sig), ch_sig)


@dataclass
class TensorError:
    mse: float
    rel_rmse: float
    sqnr_db: float
    max_abs_err: float
    cosine: float
    channel_rel_err: np.ndarray = field(repr=False)
    sse: float = 0.0
    sig: float = 0.0

    @property
    def exact(self) -> bool:
        return self.sse == 0

    def to_dict(self) -> dict:
        return {"mse": self.mse, "rel_rmse": self.rel_rmse, "sqnr_db": self.sqnr_db,
                "max_abs_err": self.max_abs_err, "cosine": self.cosine, "exact": self.exact}


def sqnr_db(sig: float, sse: float) -> float:
    """10 log10(sig/sse): +inf when exact (sse = 0, an all-zero tensor included), -inf for a
    zero signal with an error; NaN only when a sum is NaN (non-finite input)."""
    if math.isnan(sig) or math.isnan(sse):
        return math.nan
    if sse <= 0:
        return math.inf
    if sig <= 0:
        return -math.inf
    if math.isinf(sse):
        return -math.inf if not math.isinf(sig) else math.nan
    if math.isinf(sig):
        return math.inf
    return 10.0 * (math.log10(sig) - math.log10(sse))


def _sqrt(x: float) -> float:
    return math.sqrt(x) if x >= 0 else math.nan


def from_sums(s: ErrorSums) -> TensorError:
    mse = s.sse / s.n if s.n else 0.0
    if s.sse == 0:
        rel = 0.0
    elif s.sig > 0:
        rel = _sqrt(s.sse / s.sig) if not math.isinf(s.sig) else 0.0
    else:
        rel = math.inf
    denom = _sqrt(s.sig) * _sqrt(s.deq)
    if s.sse == 0:
        cos = 1.0
    elif denom > 0 and math.isfinite(denom):
        cos = s.dot / denom
    else:
        cos = 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        ch = np.where(s.ch_sig > 0, np.sqrt(s.ch_sse / np.where(s.ch_sig > 0, s.ch_sig, 1)),
                      np.where(s.ch_sse > 0, np.inf, 0.0))
    return TensorError(mse, rel, sqnr_db(s.sig, s.sse), s.max_abs_err, max(-1.0, min(1.0, cos)),
                       ch.astype(np.float32), s.sse, s.sig)


def tensor_error(w: np.ndarray, wq: np.ndarray) -> TensorError:
    return from_sums(ErrorSums.from_arrays(w, wq))


@dataclass
class ModelTotals:
    """Totals over a model: sizes, average bits/weight, compression and model SQNR."""

    params: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    sig: float = 0.0
    sse: float = 0.0

    def add(self, params: int, bytes_before: int, bytes_after: int, sig: float, sse: float) -> None:
        self.params += params
        self.bytes_before += bytes_before
        self.bytes_after += bytes_after
        self.sig += sig
        self.sse += sse

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.bytes_after / self.params if self.params else 0.0

    @property
    def compression(self) -> float:
        return self.bytes_before / self.bytes_after if self.bytes_after else 0.0

    @property
    def sqnr_db(self) -> float:
        return sqnr_db(self.sig, self.sse)

    def to_dict(self) -> dict:
        return {"params": self.params, "bytes_before": self.bytes_before,
                "bytes": self.bytes_after, "bits_per_weight": self.bits_per_weight,
                "compression": self.compression, "sqnr_db": self.sqnr_db,
                "exact": self.sse == 0}

"""Reconstruction-error metrics, per tensor and for a whole model.

All tensor metrics derive from a handful of sums (the same sums the fused numba kernel
produces without writing the dequantized tensor), so numpy and kernel paths agree:

  sse   = sum (w - w')^2        sig  = sum w^2        deq = sum w'^2     dot = sum w*w'
  max_abs_err, and per output channel: ch_sse, ch_sig

  mse = sse/n   rel_rmse = sqrt(sse/sig)   sqnr_db = 10 log10(sig/sse)
  cosine = dot / sqrt(sig*deq)   per-channel relative error = sqrt(ch_sse/ch_sig)
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
            w64 = w64.reshape(1, -1)
            q64 = q64.reshape(1, -1)
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
        w64 = np.asarray(w, dtype=np.float64).reshape(np.asarray(w).shape[0] if np.ndim(w) >= 2 else 1, -1)
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

    def to_dict(self) -> dict:
        return {"mse": self.mse, "rel_rmse": self.rel_rmse, "sqnr_db": self.sqnr_db,
                "max_abs_err": self.max_abs_err, "cosine": self.cosine}


def sqnr_db(sig: float, sse: float) -> float:
    """10 log10(signal / error): +inf for an exact result (an all-zero tensor included: its
    error is 0), -inf for a zero signal with an error, never a math domain error."""
    if not (sse > 0):
        return math.inf if sse == 0 else math.nan
    if not (sig > 0):
        return -math.inf if sig == 0 else math.nan
    ratio = sig / sse
    if ratio == 0 or not math.isfinite(ratio):
        return -math.inf if ratio == 0 else (math.inf if ratio > 0 else math.nan)
    return 10.0 * math.log10(ratio)


def from_sums(s: ErrorSums) -> TensorError:
    mse = s.sse / s.n if s.n else 0.0
    rel = math.sqrt(s.sse / s.sig) if s.sig > 0 else (0.0 if s.sse == 0 else math.inf)
    denom = math.sqrt(s.sig * s.deq)
    cos = s.dot / denom if denom > 0 else (1.0 if s.sse == 0 else 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ch = np.where(s.ch_sig > 0, np.sqrt(s.ch_sse / np.where(s.ch_sig > 0, s.ch_sig, 1)),
                      np.where(s.ch_sse > 0, np.inf, 0.0))
    return TensorError(mse, rel, sqnr_db(s.sig, s.sse), s.max_abs_err, min(1.0, cos),
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
                "compression": self.compression, "sqnr_db": self.sqnr_db}

"""A quick estimate of a large tensor's error under a scheme, from evenly spaced rows.

The window shows it (marked "≈") the moment an edit of a large tensor is made, while the exact
evaluation (`workbench.quant.evaluate.evaluate_tensor`, every weight) runs behind it: quantizing and
measuring a 4096x4096 matrix takes 100+ ms on two shared cores, a 128-row sample a few ms.
Only schemes that quantize each row on its own (per-channel, per-group, block and element
formats) are estimated: a per-tensor scale depends on rows the sample does not hold.

The sample's sums of squared error and of squared weights are scaled by rows / sampled rows;
the SQNR of a tensor (or of the model, with the exact figures of the others) follows from them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from workbench.quant.plan import KEEP

MIN_ELEMENTS = 1 << 22        # smaller tensors are measured exactly in a few ms
SAMPLE_ELEMENTS = 1 << 19     # about this many weights (whole rows) are sampled
MIN_ROWS = 64


@dataclass(frozen=True)
class Estimate:
    name: str
    requested: str            # the scheme asked for (the document's key)
    scheme: str               # the scheme applied (runtimes.decide)
    rows: int
    sampled_rows: int
    sig: float                # estimated sum of squared weights over the whole tensor
    sse: float                # estimated sum of squared error over the whole tensor
    seconds: float = 0.0

    @property
    def sqnr_db(self) -> float:
        if self.sse <= 0:
            return math.inf
        if self.sig <= 0:
            return -math.inf
        return 10.0 * math.log10(self.sig / self.sse)


def sample_rows(rows: int, cols: int, elements: int = SAMPLE_ELEMENTS) -> np.ndarray:
    """Evenly spaced row indices (first and last included), about `elements` weights."""
    k = min(rows, max(MIN_ROWS, -(-elements // max(cols, 1))))
    return np.unique(np.linspace(0, rows - 1, k).round().astype(np.int64))


def proportional_rows(scores, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """(row indices, weights): `limit` rows drawn with probability proportional to `scores`
    (each row's share of the error: a_i · |W_i|²), systematically and deterministically, with
    Horvitz-Thompson weights, so that Σ_sample weight_i · e_i estimates Σ_all e_i; rows whose
    share alone is worth a draw are taken with weight 1. All rows (weights 1) when there are
    no more than `limit`. Proportional draws keep the ratio of two methods' errors close to
    the whole tensor's when a few rows carry most of the error."""
    s = np.asarray(scores, np.float64).reshape(-1)
    n = len(s)
    if n <= limit:
        return np.arange(n), np.ones(n)
    s = np.where(np.isfinite(s) & (s > 0), s, 0.0)
    if not s.sum() > 0:
        s = np.ones(n)
    certain = np.zeros(n, bool)
    for _ in range(8):            # rows worth a whole draw each are taken for certain
        k = limit - int(certain.sum())
        rest = np.where(certain, 0.0, s)
        tot = rest.sum()
        if k <= 0 or tot <= 0:
            break
        big = ~certain & (rest * k >= tot)
        if not big.any():
            break
        certain |= big
    k = limit - int(certain.sum())
    idx = list(np.flatnonzero(certain))
    w = [1.0] * len(idx)
    rest = np.where(certain, 0.0, s)
    tot = rest.sum()
    if k > 0 and tot > 0:
        p = rest * k / tot                      # inclusion probabilities, each < 1
        c = np.cumsum(p)
        points = np.arange(k) + 0.5             # a fixed start: the same rows every run
        picks = np.searchsorted(c, points, side="right")
        picks = np.unique(np.clip(picks, 0, n - 1))
        picks = picks[p[picks] > 0]
        idx += list(picks)
        w += list(1.0 / p[picks])
    order = np.argsort(idx)
    return np.asarray(idx, np.int64)[order], np.asarray(w, np.float64)[order]


def row_independent(scheme) -> bool:
    """Whether each row's quantization depends on that row only (no per-tensor scale)."""
    from workbench.schemes.granularity import PerTensor
    return not isinstance(getattr(scheme, "gran", None), PerTensor)


def can_estimate(model, name: str, scheme_name: str, decision=None) -> bool:
    """Worth estimating: a large float matrix, a row-independent scheme, plain RTN."""
    from workbench.quant.runtimes import decide
    from workbench.schemes import get_scheme
    info = model.info(name)
    if not info.is_float or info.ndim < 2 or info.numel < MIN_ELEMENTS:
        return False
    method_of = getattr(model, "method_of", None)
    if method_of is not None and method_of(name) != "rtn":
        return False
    if getattr(model, "raw", None) is None:
        return False
    applied = (decision or decide(info, scheme_name, "any")).applied
    if applied == KEEP:
        return False
    try:
        return row_independent(get_scheme(applied))
    except Exception:  # noqa: BLE001 - an unknown scheme: the exact evaluation reports it
        return False


def estimate_tensor(model, name: str, scheme_name: str, decision=None,
                    matrix: np.ndarray | None = None) -> Estimate | None:
    """Estimate of `name` under `scheme_name` from sampled rows (None when not estimable);
    `matrix`: the tensor as `model.read_matrix(name)` returns it, when the caller holds it
    (the rows are sampled from it instead of the file)."""
    import time
    from workbench.formats.dtypes import decode_rows
    from workbench.quant.evaluate import measure
    from workbench.quant.runtimes import decide
    if not can_estimate(model, name, scheme_name, decision):
        return None
    t0 = time.perf_counter()
    info = model.info(name)
    decision = decision or decide(info, scheme_name, "any")
    rows, cols = info.matrix_shape
    idx = sample_rows(rows, cols)
    if matrix is not None:
        w = np.ascontiguousarray(matrix[idx], dtype=np.float32)
    else:
        raw = model.raw(name)
        w = np.ascontiguousarray(decode_rows(raw[idx], info), dtype=np.float32)
    if not np.isfinite(w).all():
        return None          # NaN/Inf: the exact evaluation decides (refusal or pass-through)
    try:
        _nbytes, sums = measure(w, decision.applied, tensor=name)
    except Exception:  # noqa: BLE001 - the exact evaluation reports the problem
        return None
    scale = rows / idx.size
    return Estimate(name, scheme_name, decision.applied, rows, int(idx.size),
                    float(sums.sig) * scale, float(sums.sse) * scale,
                    time.perf_counter() - t0)

"""Calibration statistics of one linear layer's inputs, as the methods read them.

``LayerStats`` holds, for the inputs x (one row per token) of a weight W [out, in]:

* ``d``        E[x_j^2] per input channel (what llama.cpp's imatrix stores as in_sum2/counts)
* ``H``        2 X^T X / N (in x in), GPTQ's Hessian of the layer output error
* ``mean_abs`` E[|x_j|] per input channel (AWQ's activation scale s_x)
* ``X``        a sample of input rows (N, in) (AWQ's scale and clip search)

Any field may be None; each method names the fields it needs. ``from_inputs(X)`` computes
all of them from a matrix of inputs; ``from_imatrix(d)`` holds only the second moments (a
llama.cpp imatrix or the project's ``calibrate`` output). ``Accumulator`` builds them in a
stream of batches (forward hooks call ``add``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.core.errors import WorkbenchError

FIELDS = ("d", "H", "mean_abs", "X")
H_FLOAT32_BYTES = 64 << 20      # larger float64 Hessians are kept as float32 (LayerStats.spilled)


@dataclass
class LayerStats:
    d: np.ndarray | None = None
    H: np.ndarray | None = None
    mean_abs: np.ndarray | None = None
    X: np.ndarray | None = None
    n: int = 0
    absmax: float | None = None   # max |x| over every input seen

    @classmethod
    def from_inputs(cls, X: np.ndarray, keep_rows: int = 4096) -> "LayerStats":
        acc = Accumulator(X.shape[1], keep_rows=keep_rows)
        acc.add(X)
        return acc.finish()

    @classmethod
    def from_imatrix(cls, d: np.ndarray, n: int = 0) -> "LayerStats":
        return cls(d=np.asarray(d, np.float64).reshape(-1), n=n)

    def spilled(self) -> "LayerStats":
        """These statistics with the Hessian (and the kept input rows) in memory-mapped files
        when they are large (`workbench.core.spill`). A Hessian above H_FLOAT32_BYTES is stored as
        float32 (as GPTQ's reference implementation keeps it; accumulated in float64): an 8 B
        model's 225 Hessians are 39 GB of disk so, not 78."""
        from workbench.core import spill
        if self.H is not None:
            H = self.H
            if H.nbytes > H_FLOAT32_BYTES:
                H = H.astype(np.float32)
            self.H = spill.to_disk(H)
        if self.X is not None:
            self.X = spill.to_disk(self.X)
        return self

    def check(self, cols: int, needs, tensor=None) -> None:
        for f in needs:
            v = getattr(self, f)
            if v is None:
                raise WorkbenchError(f"the calibration statistics lack '{f}' (an imatrix holds "
                                     "only E[x^2]: GPTQ and AWQ need calib=)", tensor=tensor,
                                     params=("calib",))
            if v.shape[-1] != cols:
                raise WorkbenchError(f"calibration statistics '{f}' have {v.shape[-1]} input "
                                     f"channels, the weight has {cols}", tensor=tensor)


class Accumulator:
    """Streaming sums over batches of inputs (rows = tokens, cols = input channels)."""

    def __init__(self, cols: int, want_h: bool = True, keep_rows: int = 4096, seed: int = 0):
        self.cols = cols
        self.n = 0
        self.sum2 = np.zeros(cols, np.float64)
        self.sum_abs = np.zeros(cols, np.float64)
        self.absmax = 0.0
        self.xtx = np.zeros((cols, cols), np.float64) if want_h else None
        self.keep_rows = keep_rows
        self.kept: list[np.ndarray] = []
        self.n_kept = 0
        self.rng = np.random.default_rng(seed)

    def add(self, x) -> None:
        x = np.asarray(x, np.float64).reshape(-1, self.cols)
        if not x.shape[0]:
            return
        self.n += x.shape[0]
        self.sum2 += np.einsum("ij,ij->j", x, x)
        ax = np.abs(x)
        self.sum_abs += ax.sum(axis=0)
        self.absmax = max(self.absmax, float(ax.max()))
        if self.xtx is not None:
            self.xtx += x.T @ x
        room = self.keep_rows - self.n_kept
        if room > 0:
            take = x if x.shape[0] <= room else x[self.rng.choice(x.shape[0], room, replace=False)]
            self.kept.append(take.astype(np.float32))
            self.n_kept += take.shape[0]

    def finish(self) -> LayerStats:
        n = max(self.n, 1)
        H = None
        if self.xtx is not None:     # 2 X^T X / n in place: one in x in array, not two
            H, self.xtx = self.xtx, None
            H *= 2.0
            H /= n
        X = np.concatenate(self.kept) if self.kept else None
        return LayerStats(d=self.sum2 / n, H=H, mean_abs=self.sum_abs / n, X=X, n=self.n,
                          absmax=self.absmax)

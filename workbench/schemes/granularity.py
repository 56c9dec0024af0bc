"""Granularity values and the one block view every block-scaled scheme uses.

Per-tensor, per-channel and group-wise quantization are the same code path with different
block shapes (DESIGN.md example 3): a (rows, cols) matrix is viewed as (n_blocks, block)
and each block gets one scale (and zero point).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PerTensor:
    label = "tensor"

    def block_len(self, rows: int, cols: int) -> int:
        return rows * cols


@dataclass(frozen=True)
class PerAxis:
    """One scale per output channel (row)."""
    label = "channel"

    def block_len(self, rows: int, cols: int) -> int:
        return cols


@dataclass(frozen=True)
class PerGroup:
    """One scale per `size` consecutive weights along the input dimension."""
    size: int

    @property
    def label(self) -> str:
        return f"g{self.size}"

    def block_len(self, rows: int, cols: int) -> int:
        return self.size


GRANULARITIES = {"tensor": PerTensor(), "channel": PerAxis(), "g32": PerGroup(32),
                 "g64": PerGroup(64), "g128": PerGroup(128), "g256": PerGroup(256)}


def n_blocks(gran, rows: int, cols: int) -> int:
    n = rows * cols
    return n // gran.block_len(rows, cols) if n else 0


def as_blocks(w: np.ndarray, gran) -> np.ndarray:
    """View a C-contiguous (rows, cols) matrix as (n_blocks, block_len)."""
    rows, cols = w.shape
    return w.reshape(-1, max(1, gran.block_len(rows, cols)))

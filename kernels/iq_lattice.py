"""The lattice machinery of llama.cpp's 2-bit i-quants (IQ2_XXS / IQ2_XS / IQ2_S) and of
the 1-bit IQ1_S / IQ1_M ("iq1": kernels/iq1_grids.py's 2048 points; IQ3 uses the same idea), plain numpy, built once per grid and cached.

A grid point has 8 coordinates of level l in {0, 1, 2}; the quantizers work with the odd
values q = 2l + 1 (1, 3, 5), the decoders with the bytes GRID_LEVELS (8, 25, 43). A point of
{0, 1, 2}^8 is keyed u = sum l_i << 2i (< KMAP_SIZE = 43692, as ggml's kmap_q2xs).

``lattice(name)`` -> :class:`Lattice` with
* ``points``  int8 (n, 8): 2l + 1 of every grid point (ggml's kgrid_q2xs bytes);
* ``values``  uint8 (n, 8): the decoder's bytes (ggml-common.h iq2xxs_grid & co.);
* ``kmap``    int32 (KMAP_SIZE,): the grid index of an on-grid key, else -(row + 1) of the
  key's row in ``neighbours``, -KMAP_SIZE for keys with a level 3 (never looked up);
* ``neighbours`` int32 (n_off, width): for each off-grid key the grid indices at the `nwant`
  smallest squared distances (in odd units), ordered by (distance, index), -1 padded; the
  same lists ggml's iq2xs_init_impl builds (IQ2_XXS, IQ2_XS: nwant 2; IQ2_S: 1; IQ1: 3).

``find_best_neighbour`` is ggml's iq2_find_best_neighbour vectorised over groups: the first
listed neighbour of least sum_i w_i (scale q_i - x_i)^2, summed in float32 in index order.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from . import iq1_grids, iq_grids

KMAP_SIZE = 43692
GRIDS = {"iq2_xxs": (iq_grids.KGRID_2BIT_256, 2), "iq2_xs": (iq_grids.KGRID_2BIT_512, 2),
         "iq2_s": (iq_grids.KGRID_2BIT_1024, 1), "iq1": (iq1_grids.KGRID_1BIT_2048, 3)}
#: ggml's ksigns_iq2xs: 7 sign bits and an 8th that makes the count of set bits even
KSIGNS = np.array([i | ((bin(i).count("1") & 1) << 7) for i in range(128)], np.uint8)
KSIGNS.setflags(write=False)


@dataclass(frozen=True)
class Lattice:
    points: np.ndarray
    values: np.ndarray
    kmap: np.ndarray
    neighbours: np.ndarray


def levels(kgrid: np.ndarray) -> np.ndarray:
    """(n, 8) int: the 2-bit level of each coordinate of each grid entry."""
    return (np.asarray(kgrid, np.int64)[:, None] >> (2 * np.arange(8))) & 3


@lru_cache(maxsize=None)
def grid_values(name: str) -> np.ndarray:
    """uint8 (n, 8): the decoder's bytes of every grid point (cheap; no neighbour lists)."""
    v = np.asarray(iq_grids.GRID_LEVELS, np.uint8)[levels(GRIDS[name][0])]
    v.setflags(write=False)
    return v


@lru_cache(maxsize=None)
def lattice(name: str) -> Lattice:
    kgrid, nwant = GRIDS[name]
    lv = levels(kgrid)
    points = (2 * lv + 1).astype(np.int8)
    values = grid_values(name)
    kmap = np.full(KMAP_SIZE, -KMAP_SIZE, np.int32)
    # every key of {0,1,2}^8
    digits = np.stack(np.meshgrid(*([np.arange(3)] * 8), indexing="ij"), -1).reshape(-1, 8)
    keys = (digits << (2 * np.arange(8))).sum(axis=1)
    key_of_grid = (lv << (2 * np.arange(8))).sum(axis=1)
    on = np.zeros(KMAP_SIZE, bool)
    on[key_of_grid] = True
    off = ~on[keys]
    okeys, odig = keys[off], digits[off]
    pos = 2 * odig + 1
    pi, gp = pos.astype(np.int32), points.astype(np.int32)      # |p - g|^2, exact in int32
    d2 = (pi * pi).sum(1)[:, None] + (gp * gp).sum(1)[None, :] - 2 * (pi @ gp.T)
    order = np.argsort(d2, axis=1, kind="stable")           # by (distance, index)
    sd = np.take_along_axis(d2, order, axis=1)
    rank = np.concatenate([np.zeros((sd.shape[0], 1), np.int64),
                           np.cumsum(sd[:, 1:] != sd[:, :-1], axis=1)], axis=1)
    keep = rank < nwant
    width = int(keep.sum(axis=1).max())
    nb = np.where(keep[:, :width], order[:, :width], -1).astype(np.int32)
    kmap[okeys] = -(np.arange(okeys.size, dtype=np.int32) + 1)
    kmap[key_of_grid] = np.arange(len(kgrid), dtype=np.int32)
    for a in (points, kmap, nb):
        a.setflags(write=False)
    return Lattice(points, values, kmap, nb)


def find_best_neighbour(lat: Lattice, row: np.ndarray, x: np.ndarray, w: np.ndarray,
                        scale: np.ndarray) -> np.ndarray:
    """Grid index per group: row (g,) neighbour rows, x, w float32 (g, 8), scale (g,)."""
    cand = lat.neighbours[row]                                  # (g, width)
    q = lat.points[np.maximum(cand, 0)].astype(np.float32)      # (g, width, 8)
    d2 = np.zeros(cand.shape, np.float32)
    for i in range(8):
        diff = scale[:, None] * q[:, :, i] - x[:, None, i]
        d2 = d2 + w[:, None, i] * diff * diff
    d2 = np.where(cand >= 0, d2, np.float32(np.inf))
    # the first strictly smallest (ggml: d2 < best_d2, best starting at FLT_MAX)
    best = np.argmin(d2, axis=1)
    return cand[np.arange(cand.shape[0]), best]

"""Integer affine schemes: ``int{B}-{G}[-asym][@minmax|@p99.9|@mse][@pot]``.

B in 2..8 bits; G = tensor | channel | g32 | g64 | g128 | g256. Symmetric by default.

Storage (the real layout, so sizes are real):
  codes  : B-bit unsigned codes, bit-packed (see packing.py). Symmetric codes are
           q + 2**(B-1) with q in [-(2**(B-1)-1), 2**(B-1)-1]; asymmetric codes are q in [0, 2**B-1].
  scales : one per block; float32 for tensor/channel, float16 for groups.
  zeros  : (asym only) one uint8 zero point per block.

Quantize:   inv = 1/scale (float32);  q = clip(rint(w*inv) [+ zero], qmin, qmax)
Dequantize: w' = (q - zero) * scale  (float32)
These are exactly the formulas of torch's fake_quantize_per_channel_affine.
"""

from __future__ import annotations

import math
import re

import numpy as np

from .base import Scheme
from .granularity import GRANULARITIES, PerGroup, as_blocks, n_blocks
from .packing import pack_bits, packed_nbytes, unpack_bits

CLIPS = ("minmax", "p99.9", "mse")
MSE_RATIOS = np.linspace(1.0, 0.5, 26, dtype=np.float32)  # clipping ratios searched by @mse
_NAME = re.compile(r"^int([2-8])-(tensor|channel|g32|g64|g128|g256)(-asym)?((?:@[a-z0-9.]+)*)$")


def _safe_inv(scale: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        inv = np.float32(1.0) / scale
    inv[scale == 0] = 0.0
    return inv.astype(np.float32)


class IntAffine(Scheme):
    """The integer affine family."""

    def __init__(self, bits: int, gran: str, asym: bool = False, clip: str = "minmax",
                 pot: bool = False):
        self.bits = bits
        self.gran_name = gran
        self.gran = GRANULARITIES[gran]
        self.asym = asym
        self.clip = clip
        self.pot = pot
        self.nominal_bits = bits
        self.block_size = self.gran.size if isinstance(self.gran, PerGroup) else None
        self.scale_dtype = np.dtype(np.float16 if isinstance(self.gran, PerGroup) else np.float32)
        if asym:
            self.qmin, self.qmax, self.offset = 0, (1 << bits) - 1, 0
        else:
            self.qmin, self.qmax = -((1 << (bits - 1)) - 1), (1 << (bits - 1)) - 1
            self.offset = 1 << (bits - 1)
        name = f"int{bits}-{gran}" + ("-asym" if asym else "")
        if clip != "minmax":
            name += f"@{clip}"
        if pot:
            name += "@pot"
        self.name = name

    # ---- registry protocol --------------------------------------------------------------
    @classmethod
    def names(cls, variants: bool = False) -> list[str]:
        out = []
        for b in range(2, 9):
            for g in GRANULARITIES:
                for asym in ("", "-asym"):
                    base = f"int{b}-{g}{asym}"
                    out.append(base)
                    if variants:
                        out += [base + f"@{c}" for c in CLIPS[1:]]
                        out += [base + "@pot"] + [base + f"@{c}@pot" for c in CLIPS[1:]]
        return out

    @classmethod
    def parse(cls, name: str) -> "IntAffine | None":
        m = _NAME.match(name)
        if not m:
            return None
        clip, pot = "minmax", False
        for suffix in filter(None, m.group(4).split("@")):
            if suffix in CLIPS:
                clip = suffix
            elif suffix == "pot":
                pot = True
            else:
                return None
        return cls(int(m.group(1)), m.group(2), bool(m.group(3)), clip, pot)

    # ---- sizes ------------------------------------------------------------------------------
    def nbytes(self, shape) -> int:
        from .base import matrix_shape
        rows, cols = matrix_shape(shape)
        nb = n_blocks(self.gran, rows, cols)
        per_block = self.scale_dtype.itemsize + (1 if self.asym else 0)
        return packed_nbytes(rows * cols, self.bits) + nb * per_block

    # ---- the three primitives ---------------------------------------------------------------
    def choose_qparams(self, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Per-block (scale, zero) as stored (scale already rounded to its storage dtype)."""
        if self.asym:
            lo, hi = self._range_asym(blocks)
            scale = self._store_scale((hi - lo) / np.float32(self.qmax))
            zero = np.clip(np.rint(-lo * _safe_inv(scale)), 0, self.qmax).astype(np.uint8)
            return scale, zero
        amax = self._range_sym(blocks)
        return self._store_scale(amax / np.float32(self.qmax)), None

    def _store_scale(self, scale: np.ndarray) -> np.ndarray:
        scale = np.asarray(scale, dtype=np.float32)
        if self.pot:
            with np.errstate(divide="ignore"):
                e = np.ceil(np.log2(np.where(scale > 0, scale, 1.0)))
            scale = np.where(scale > 0, np.exp2(e), 0.0).astype(np.float32)
        if self.scale_dtype == np.float16:
            scale = np.minimum(scale, np.float32(65504.0))  # check_range refuses beforehand
        return scale.astype(self.scale_dtype)

    def _range_sym(self, blocks: np.ndarray) -> np.ndarray:
        a = np.abs(blocks)
        if self.clip == "p99.9":
            return np.quantile(a, 0.999, axis=1).astype(np.float32)
        amax = a.max(axis=1) if a.shape[1] else np.zeros(a.shape[0], np.float32)
        amax = amax.astype(np.float32)
        if self.clip == "mse":
            return amax * self._mse_ratio(blocks, amax, None)
        return amax

    def _range_asym(self, blocks: np.ndarray):
        if self.clip == "p99.9":
            lo = np.quantile(blocks, 0.001, axis=1).astype(np.float32)
            hi = np.quantile(blocks, 0.999, axis=1).astype(np.float32)
        else:
            lo, hi = blocks.min(axis=1), blocks.max(axis=1)
        lo = np.minimum(lo, 0).astype(np.float32)
        hi = np.maximum(hi, 0).astype(np.float32)
        if self.clip == "mse":
            r = self._mse_ratio(blocks, hi, lo)
            return lo * r, hi * r
        return lo, hi

    def _mse_ratio(self, blocks, hi, lo):
        """Shrink the range by each ratio in MSE_RATIOS; the ratio with least MSE per block."""
        best_err = np.full(blocks.shape[0], np.inf, dtype=np.float64)
        best = np.ones(blocks.shape[0], dtype=np.float32)
        for ratio in MSE_RATIOS:
            h = hi * ratio
            if lo is None:
                scale = self._store_scale(h / np.float32(self.qmax)).astype(np.float32)
                zero = None
            else:
                scale = self._store_scale((h - lo * ratio) / np.float32(self.qmax)).astype(np.float32)
                zero = np.clip(np.rint(-(lo * ratio) * _safe_inv(scale)), 0, self.qmax)
            deq = self._fake(blocks, scale, zero)
            err = ((deq - blocks).astype(np.float64) ** 2).sum(axis=1)
            better = err < best_err
            best_err[better] = err[better]
            best[better] = ratio
        return best

    def check_range(self, w2: np.ndarray, tensor: str | None = None) -> None:
        """Float16 group scales: a weight whose scale would pass 65504 is refused rather than
        clamped (clamping would silently saturate its block)."""
        if self.scale_dtype != np.float16 or not w2.size:
            return
        with np.errstate(invalid="ignore"):
            hi, lo = float(np.nanmax(w2)), float(np.nanmin(w2))
        if not (np.isfinite(hi) and np.isfinite(lo)):
            return  # NaN/Inf weights are refused by name elsewhere
        span = (max(hi, 0.0) - min(lo, 0.0)) if self.asym else max(abs(hi), abs(lo))
        if span / self.qmax > 65504.0:
            from ..errors import WorkbenchError
            raise WorkbenchError(
                f"{self.name} cannot represent a weight of {max(abs(hi), abs(lo)):.3g}: its "
                "float16 group scale would exceed 65504; use a per-channel scheme (float32 "
                "scales) or keep this tensor", tensor=tensor)

    def _codes(self, blocks, scale, zero):
        inv = _safe_inv(scale.astype(np.float32))[:, None]
        q = np.rint(blocks * inv)
        if zero is not None:
            q = q + zero.astype(np.float32)[:, None]
        return np.clip(q, self.qmin, self.qmax)

    def _fake(self, blocks, scale, zero):
        q = self._codes(blocks, scale, zero)
        if zero is not None:
            q = q - zero.astype(np.float32)[:, None]
        return (q * scale.astype(np.float32)[:, None]).astype(np.float32)

    def _quantize(self, w: np.ndarray) -> dict[str, np.ndarray]:
        rows, cols = w.shape
        blocks = as_blocks(w, self.gran)
        if w.size == 0:
            scale, zero = np.zeros(0, self.scale_dtype), (np.zeros(0, np.uint8) if self.asym else None)
            codes = np.zeros(0, np.uint8)
        else:
            scale, zero = self.choose_qparams(blocks)
            codes = (self._codes(blocks, scale, zero) + self.offset).astype(np.uint8)
        out = {"codes": pack_bits(codes, self.bits), "scales": scale}
        if self.asym:
            out["zeros"] = zero
        return out

    def _dequantize(self, arrays, rows, cols) -> np.ndarray:
        n = rows * cols
        codes = unpack_bits(arrays["codes"], self.bits, n)
        bl = self.gran.block_len(rows, cols) if n else 1
        q = codes.reshape(-1, bl).astype(np.int32)
        q -= self.offset
        if self.asym:
            q -= arrays["zeros"].astype(np.int32)[:, None]
        scale = arrays["scales"].astype(np.float32)[:, None]
        return (q.astype(np.float32) * scale).reshape(rows, cols)

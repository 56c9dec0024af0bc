"""Integer affine schemes: ``int{B}-{G}[-asym][@minmax|@p99.9|@mse][@pot]``.

B in 2..8 bits; G = tensor | channel | g32 | g64 | g128 | g256. Symmetric by default.

Storage (the real layout, so sizes are real):
  codes  : B-bit unsigned codes, bit-packed (see packing.py). Symmetric codes are
           q + 2**(B-1) with q in [-2**(B-1), 2**(B-1)-1] (the full range: int4 -8..7, int8
           -128..127, as compressed-tensors / llm-compressor / vLLM); asymmetric codes are q in
           [0, 2**B-1].
  scales : one per block; float32 for tensor/channel, float16 for groups.
  zeros  : (asym only) one uint8 zero point per block.

Quantize:   inv = 1/scale (float32);  q = clip(rint(w*inv) [+ zero], qmin, qmax)
Dequantize: w' = (q - zero) * scale  (float32)
These are exactly the formulas of torch's fake_quantize_per_channel_affine.

Symmetric scale (the divisor search): with amax the block's range (max|w|; @p99.9: its 99.9th
percentile of |w|), each candidate scale amax / d for d in sym_divisors(B) = P, P + 1/4, ...,
P + 1 (P = 2**(B-1) - 1: int4 7 ... 8, int8 127 ... 128) is stored (float16/float32, @pot:
rounded up to a power of two) and the one with the least squared error of the block (float64
squares of the float32 differences summed in a fixed order, _sq_err; ties: the first) is kept.
d = P is the former "absmax/qmax" scale, d = P + 1/2 llm-compressor's absmax/7.5, d = P + 1
puts a negative extreme exactly on -2**(B-1). Larger d (clipping the extremes when that lowers
the block error) scored higher on MiniLM but lowered the demo causal LM's top-1 agreement below
99 % (docs/methods.md), so they are left to @mse, which adds the clipping candidates
amax * r / P for r in MSE_RATIOS (1.0 ... 0.5) to the same search.
The CPU kernels run the same search (kernels/cpu_affine_fused.py: the fused row kernel;
kernels/cpu_affine_quant.py: sym_qparams); per-tensor scales, @p99.9, @mse and @pot take these numpy qparams, and so does
the CUDA path, which then encodes on the device.

Range (no Inf/NaN from finite input; a refusal names the tensor, never a silent clamp):
  * float16 scales (groups) hold at most 65504: a block whose unclipped candidate amax / P
    needs a larger scale (|w| > 65504 * P, e.g. 458528 for int4) is refused ("value 1e+30
    cannot be represented by int4-g128's float16 scale"), never clipped into range; with @pot
    the largest power-of-two scale is 32768. The other candidates are smaller, so they fit.
    Asymmetric: the range hi - lo up to 65504 * (2**B - 1).
  * float32 scales (tensor/channel): |w| above 1e38 is refused (the range hi - lo, a pot scale
    and q * scale would overflow float32 near its maximum 3.4e38).
  * tiny blocks: a float32 scale whose inverse overflows (scale < 1/FLT_MAX, weights ~1e-37 and
    below) is applied by division instead of by its (infinite) inverse; a scale that underflows
    its storage type (float16 below 6e-8, float32 below 1.4e-45) is 0 and its block is stored as
    zeros (the metrics show that error).
"""

from __future__ import annotations

import re

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.schemes.base import Scheme
from workbench.schemes.granularity import GRANULARITIES, PerGroup, as_blocks, n_blocks
from workbench.schemes.packing import pack_bits, packed_nbytes, unpack_bits

CLIPS = ("minmax", "p99.9", "mse")
MSE_RATIOS = np.linspace(1.0, 0.5, 26, dtype=np.float32)  # clipping ratios searched by @mse
SYM_DIVISOR_STEPS = (4, 4)   # symmetric divisor candidates: P + k/4 for k = 0..4 (P ... P + 1)


def sym_divisors(bits: int) -> np.ndarray:
    """The symmetric scale search's divisors for B bits (float32, ascending): amax / d."""
    p = (1 << (bits - 1)) - 1
    per, n = SYM_DIVISOR_STEPS
    return np.array([p + k / per for k in range(n + 1)], dtype=np.float32)
_NAME = re.compile(r"^int([2-8])-(tensor|channel|g32|g64|g128|g256)(-asym)?((?:@[a-z0-9.]+)*)$")


F16_MAX = 65504.0
F32_TINY = np.float32(1.0) / np.finfo(np.float32).max   # a scale below this has an infinite inverse
F32_LIMIT = 1e38                                         # |w| limit of float32-scale quantizers


def _safe_inv(scale: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", over="ignore"):
        inv = np.float32(1.0) / scale
    inv[scale == 0] = 0.0
    return inv.astype(np.float32)


def _times_inv(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """x * (1/scale) per block (rows of x, or elements of a 1-D x), 0 where scale is 0. Blocks
    whose float32 inverse overflows (a tiny scale) are divided instead: same value, no Inf/NaN."""
    scale = np.asarray(scale, dtype=np.float32)
    inv = _safe_inv(scale)
    col = (lambda a: a[:, None]) if x.ndim == 2 else (lambda a: a)
    with np.errstate(invalid="ignore", over="ignore"):
        out = x * col(inv)
    bad = ~np.isfinite(inv)
    if bad.any():
        out[bad] = x[bad] / col(scale[bad])
    return out


def _sq_err(diff: np.ndarray) -> np.ndarray:
    """Per row of the float32 differences: the sum of their float64 squares in a fixed order
    the kernels repeat (kernels/cpu_affine_quant.py _sq_errs): element c into lane c % 8, each lane
    summed in element order (cumsum: sequential), then ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7))."""
    nb, n = diff.shape
    d = diff.astype(np.float64)
    d = d * d
    if n % 8:
        d = np.concatenate([d, np.zeros((nb, 8 - n % 8))], axis=1)
    if not d.shape[1]:
        return np.zeros(nb)
    la = np.cumsum(d.reshape(nb, -1, 8), axis=1)[:, -1, :]
    return ((la[:, 0] + la[:, 1]) + (la[:, 2] + la[:, 3])) + \
        ((la[:, 4] + la[:, 5]) + (la[:, 6] + la[:, 7]))


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
        self.max_abs_weight = F32_LIMIT
        if asym:
            self.qmin, self.qmax, self.offset = 0, (1 << bits) - 1, 0
        else:
            self.qmin, self.qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
            self.offset = 1 << (bits - 1)
        self.divisors = sym_divisors(bits)
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

    @property
    def row_local(self) -> bool:
        """Per-tensor scales depend on every row: not quantized in row chunks."""
        return getattr(self.gran, "label", "") != "tensor"

    # ---- sizes ------------------------------------------------------------------------------
    def nbytes(self, shape) -> int:
        from workbench.schemes.base import matrix_shape
        rows, cols = matrix_shape(shape)
        nb = n_blocks(self.gran, rows, cols)
        per_block = self.scale_dtype.itemsize + (1 if self.asym else 0)
        return packed_nbytes(rows * cols, self.bits) + nb * per_block

    # ---- the three primitives ---------------------------------------------------------------
    def kernel_layout(self) -> dict:
        size = getattr(self.gran, "size", None)
        gran = int(size) if size is not None else (
            "tensor" if getattr(self.gran, "label", "") == "tensor" else "row")
        return {"family": "affine", "quant": "int", "bits": self.bits, "offset": self.offset,
                "asym": self.asym, "gran": gran, "qmin": self.qmin, "qmax": self.qmax,
                "scale_f16": self.scale_dtype == np.float16, "clip": self.clip,
                "pot": self.pot, "name": self.name,
                "divs": tuple(float(d) for d in self.divisors)}

    def choose_qparams(self, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Per-block (scale, zero) as stored (scale already rounded to its storage dtype)."""
        if self.asym:
            lo, hi = self._range_asym(blocks)
            scale = self._store_scale((hi - lo) / np.float32(self.qmax))
            zero = np.clip(np.rint(_times_inv(-lo, scale)), 0, self.qmax).astype(np.uint8)
            return scale, zero
        return self._search_sym(blocks, self._range_sym(blocks)), None

    def sym_candidates(self, amax: np.ndarray) -> list[np.ndarray]:
        """The float32 candidate scales (before storage) of the symmetric search, in order."""
        amax = np.asarray(amax, dtype=np.float32)
        cands = [amax / d for d in self.divisors]
        if self.clip == "mse":
            cands += [(amax * r) / np.float32(self.qmax) for r in MSE_RATIOS[1:]]
        return cands

    def _search_sym(self, blocks: np.ndarray, amax: np.ndarray) -> np.ndarray:
        """Per block, the stored candidate scale with the least squared error (module doc)."""
        scales = self._sym_scales(amax)
        return self._pick_sym(scales, [_sq_err(self._fake(blocks, s, None) - blocks)
                                       for s, _over in scales])

    def _sym_scales(self, amax: np.ndarray) -> list:
        """[(stored scale, mask of blocks the storage cannot hold)] per candidate, in order; the
        first (amax / P, the one that holds the extremes) must fit, else the scheme refuses."""
        out = []
        for i, cand in enumerate(self.sym_candidates(amax)):
            scale, over = self._store_scale_soft(cand)
            if i == 0 and over.any():
                self._refuse(amax[over])
            out.append((scale, over))
        return out

    def _pick_sym(self, scales: list, errs: list) -> np.ndarray:
        """Per block, the first candidate of least error among those the storage holds."""
        nb = scales[0][0].shape[0]
        best_err = np.full(nb, np.inf, dtype=np.float64)
        best = np.zeros(nb, dtype=self.scale_dtype)
        held = np.zeros(nb, dtype=bool)
        for (scale, over), err in zip(scales, errs):
            err = np.where(over, np.inf, err)
            better = (err < best_err) | (~held & ~over)
            best_err[better] = err[better]
            best[better] = scale[better]
            held |= ~over
        return best

    # ---- one scale for a tensor met a row chunk at a time (workbench.quant.streaming) ---------
    @property
    def chunked_qparams(self) -> bool:
        """Whether `tensor_qparams` can find this per-tensor scheme's scale from row chunks:
        a range (max |w|, or min and max) and candidate errors are sums over chunks; a
        percentile (@p99.9) and the asymmetric @mse search are not offered."""
        return not self.row_local and self.clip != "p99.9" and not (self.asym and self.clip == "mse")

    def tensor_qparams(self, chunks) -> tuple:
        """(scale, zero) of the whole tensor, as `choose_qparams` gives them, from
        `chunks()`, a callable giving a fresh iterator of its float32 row chunks: one pass for
        the range, a second for the symmetric search's candidate errors (their float64 sums
        merged chunk by chunk: the same candidate unless two errors agree to rounding)."""
        lo = hi = np.float32(0)
        amax = np.float32(0)
        for w in chunks():
            if w.size:
                lo, hi = min(lo, np.float32(w.min())), max(hi, np.float32(w.max()))
                amax = max(amax, np.float32(np.abs(w).max()))
        if self.asym:
            scale = self._store_scale(np.array([(hi - lo) / np.float32(self.qmax)], np.float32))
            zero = np.clip(np.rint(_times_inv(-np.array([lo], np.float32), scale)), 0,
                           self.qmax).astype(np.uint8)
            return scale, zero
        scales = self._sym_scales(np.array([amax], np.float32))
        errs = [np.zeros(1) for _ in scales]
        for w in chunks():
            flat = w.reshape(1, -1)
            for e, (s, _over) in zip(errs, scales):
                e += _sq_err(self._fake(flat, s, None) - flat)
        return self._pick_sym(scales, errs), None

    def fake_quantize(self, w: np.ndarray, qparams: tuple) -> np.ndarray:
        """`w` (any rows of the tensor) quantized and dequantized with the tensor's
        `tensor_qparams`: the values the whole tensor's quantize and dequantize give them."""
        scale, zero = qparams
        return self._fake(w.reshape(1, -1), scale, zero).reshape(w.shape)

    def _store_scale_soft(self, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(scale as stored, mask of blocks whose scale the float16 storage cannot hold)."""
        scale = np.asarray(scale, dtype=np.float32)
        if self.pot:
            with np.errstate(divide="ignore"):
                e = np.ceil(np.log2(np.where(scale > 0, scale, 1.0)))
            scale = np.where(scale > 0, np.exp2(e), 0.0).astype(np.float32)
        over = np.zeros(scale.shape, dtype=bool)
        if self.scale_dtype == np.float16:
            over = scale > np.float32(F16_MAX)
            scale = np.where(over, np.float32(0), scale)
        return scale.astype(self.scale_dtype), over

    def _store_scale(self, scale: np.ndarray) -> np.ndarray:
        scale = np.asarray(scale, dtype=np.float32)
        stored, over = self._store_scale_soft(scale)
        if over.any():
            self._refuse(scale[over] * np.float32(self.qmax))
        return stored

    def _refuse(self, wanted: np.ndarray):
        most = float(np.max(wanted))
        limit = (32768.0 if self.pot else F16_MAX) * self.qmax
        what = "range" if self.asym else "value"
        raise WorkbenchError(
            f"{self.name}'s float16 scale cannot represent {what} {most:.3g} (a block "
            f"takes {'a range' if self.asym else '|w|'} up to {limit:.6g}; "
            "use a channel/tensor scheme or keep this tensor)")

    def reference_needed(self, qt) -> bool:
        s = qt.arrays.get("scales")
        if s is None or not s.size:
            return False
        if s.dtype == np.float16:
            return bool((s == np.float16(F16_MAX)).any())   # the kernels' clamp: refuse instead
        s = s.astype(np.float32)
        return bool(((s > 0) & (s < F32_TINY)).any() or not (s * self.qmax <= F32_LIMIT).all())

    def _range_sym(self, blocks: np.ndarray) -> np.ndarray:
        a = np.abs(blocks)
        if self.clip == "p99.9":
            return np.quantile(a, 0.999, axis=1).astype(np.float32)
        amax = a.max(axis=1) if a.shape[1] else np.zeros(a.shape[0], np.float32)
        return amax.astype(np.float32)   # @mse: its ratios join the divisor search

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
        """Asymmetric @mse: shrink the range by each ratio in MSE_RATIOS; the ratio with least
        MSE per block (symmetric @mse searches in _search_sym)."""
        best_err = np.full(blocks.shape[0], np.inf, dtype=np.float64)
        best = np.ones(blocks.shape[0], dtype=np.float32)
        for ratio in MSE_RATIOS:
            h = hi * ratio
            scale = self._store_scale((h - lo * ratio) / np.float32(self.qmax)).astype(np.float32)
            zero = np.clip(np.rint(_times_inv(-(lo * ratio), scale)), 0, self.qmax)
            deq = self._fake(blocks, scale, zero)
            err = ((deq - blocks).astype(np.float64) ** 2).sum(axis=1)
            better = err < best_err
            best_err[better] = err[better]
            best[better] = ratio
        return best

    def _codes(self, blocks, scale, zero):
        q = np.rint(_times_inv(blocks, scale))
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

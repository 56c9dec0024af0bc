"""numba CPU kernels of Apple MLX's modes (the "mlx" family, kernels.spec.MLX_MODES): dequantize,
the fused error and quantize, bit for bit the numpy reference (workbench.schemes.mlx.reference,
itself bit for bit mlx.core). Imports nothing from ``workbench``.

Codes are one little-endian bit stream over the tensor (code i at bit i·B: mlx's packing from
the least significant bit, across word boundaries for B = 3, 5, 6); group of code i: i // G.

* mode 0, affine: ``round(round(scale · q) + bias)``, each step rounded to the scales' dtype
  (dt 0 float32, 1 float16, 2 bfloat16: kernels.spec.MLX_DTYPES); quantize as mlx's CPU
  kernel (range, the edge on a code, ``rint((w - bias) / scale)``) in float32.
* modes 1-3, mxfp4 / nvfp4 / mxfp8: ``value[code] · scale`` with the scales decoded on the host
  (``sv``); quantize: the E8M0 byte ``ceil(log2(amax / M)) + 127`` (exact ceiling, clamped to
  0..254; an all-zero group 127) or E4M3 of amax / 6, then the E2M1 codes (ties to the smaller
  magnitude, no -0) or the E4M3 codes (ties to even) of w / scale rounded to the weight's dtype.
"""

from __future__ import annotations

from . import _numba_prelude  # noqa: F401  (before numba: cheaper start)
import numpy as np
from numba import njit, prange

from .cpu_common import F0, _J, _P, _acc_row, _f32_to_f16_bits, _fp8_code

_E2M1_MIDS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], np.float32)


@njit(inline="always", **_J)
def _round(x, dt, f16tab):
    """float32 x rounded to dtype dt (0 float32: x; 1 float16; 2 bfloat16), as float32."""
    if dt == 1:
        return f16tab[_f32_to_f16_bits(x)]
    if dt == 2:
        return np.uint32(_bf16_bits(x) << 16).view(np.float32)
    return x


@njit(inline="always", **_J)
def _bf16_bits(x):
    """bfloat16 bits of float32 x: nearest even; a NaN kept quiet."""
    u = np.int64(np.float32(x).view(np.uint32))
    if x != x:
        return (u >> 16) | 0x40
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


@njit(inline="always", **_J)
def _code(codes, i, bits, mask):
    p = i * bits
    b = p >> 3
    sh = p & 7
    v = np.int64(codes[b]) >> sh
    if sh + bits > 8:
        v |= np.int64(codes[b + 1]) << (8 - sh)
    return v & mask


@njit(**_J)
def _mlx_row(codes, sv, bv, mode, bits, gs, dt, f16tab, lut, r, cols, dst):
    """Row r decoded into dst, group by group; affine groups with fewer codes than weights
    (2^B <= G) work out their 2^B values once and gather them."""
    base = r * cols
    mask = (1 << bits) - 1
    nq = 1 << bits
    small = mode == 0 and nq <= gs
    tab = np.empty(nq if small else 1, np.float32)
    g0 = base // gs
    for g in range(cols // gs):
        s = sv[g0 + g]
        o = g * gs
        if mode != 0:
            for j in range(gs):
                dst[o + j] = lut[_code(codes, base + o + j, bits, mask)] * s
            continue
        b = bv[g0 + g]
        if small:
            for q in range(nq):
                tab[q] = _round(_round(s * np.float32(q), dt, f16tab) + b, dt, f16tab)
            for j in range(gs):
                dst[o + j] = tab[_code(codes, base + o + j, bits, mask)]
        else:
            for j in range(gs):
                q = _code(codes, base + o + j, bits, mask)
                y = _round(s * np.float32(q), dt, f16tab)
                dst[o + j] = _round(y + b, dt, f16tab)


@njit(**_P)
def mlx_dequant(codes, sv, bv, mode, bits, gs, dt, f16tab, lut, out):
    rows, cols = out.shape
    for r in prange(rows):
        _mlx_row(codes, sv, bv, mode, bits, gs, dt, f16tab, lut, r, cols, out[r])


@njit(**_P)
def mlx_error(codes, sv, bv, mode, bits, gs, dt, f16tab, lut, w, acc):
    rows, cols = w.shape
    for r in prange(rows):
        buf = np.empty(cols, np.float32)
        _mlx_row(codes, sv, bv, mode, bits, gs, dt, f16tab, lut, r, cols, buf)
        _acc_row(w[r], buf, acc[r])


@njit(inline="always", **_J)
def _put(out, p, acc, bits):
    for t in range(bits):
        out[p + t] = np.uint8((acc >> np.uint64(8 * t)) & np.uint64(255))


@njit(**_J)
def _rounded(row, dt, f16tab):
    """A copy of float32 `row` rounded to dtype dt (the weights in the model's dtype)."""
    out = np.empty(row.shape[0], np.float32)
    for c in range(row.shape[0]):
        out[c] = _round(row[c], dt, f16tab)
    return out


@njit(inline="always", **_J)
def _bits16(x, sdt):
    """The 16-bit storage of float32 x: float16 (sdt 1) or bfloat16 (sdt 2) bits."""
    if sdt == 1:
        return np.uint16(_f32_to_f16_bits(x))
    return np.uint16(_bf16_bits(x))


@njit(**_P)
def mlx_quant_affine(w, bits, gs, wdt, sdt, f16tab, codes, s_out, b_out):
    """Per group of each row (the weights rounded to dtype wdt first): mlx's scale and bias,
    stored as 16-bit floats of dtype sdt (s_out, b_out (rows, cols/gs) uint16), and the codes
    packed into codes (rows, cols·bits/8)."""
    rows, cols = w.shape
    nb = cols // gs
    n_bins = np.float32((1 << bits) - 1)
    eps = np.float32(1e-7)
    for r in prange(rows):
        row = _rounded(w[r], wdt, f16tab)
        out = codes[r]
        for g in range(nb):
            o = g * gs
            lo = row[o]
            hi = row[o]
            for j in range(1, gs):
                x = row[o + j]
                lo = min(lo, x)
                hi = max(hi, x)
            flip = abs(lo) > abs(hi)
            s = np.float32(np.float32(hi - lo) / n_bins)
            if s < eps:
                s = eps
            if not flip:
                s = -s
            edge = lo if flip else hi
            q0 = np.float32(np.rint(np.float32(edge / s)))
            bias = F0
            if q0 != 0:
                s = np.float32(edge / q0)
                bias = edge
            s_out[r, g] = _bits16(s, sdt)
            b_out[r, g] = _bits16(bias, sdt)
            for k in range(gs // 8):
                acc = np.uint64(0)
                for j in range(8):
                    x = row[o + 8 * k + j]
                    q = np.float32(np.rint(np.float32(np.float32(x - bias) / s)))
                    q = min(max(q, F0), n_bins)
                    acc |= np.uint64(q) << np.uint64(j * bits)
                _put(out, (o + 8 * k) * bits // 8, acc, bits)


@njit(inline="always", **_J)
def _ceil_log2(x):
    """ceil(log2 x) exactly, for float32 x > 0 (subnormals included)."""
    u = np.int64(np.float32(x).view(np.uint32))
    e = (u >> 23) & 255
    m = u & 0x7FFFFF
    if e == 0:                        # subnormal: x = m · 2^-149
        top = 0
        while (m >> (top + 1)) > 0:
            top += 1
        return top - 149 + (0 if m == (np.int64(1) << top) else 1)
    return e - 127 + (0 if m == 0 else 1)


@njit(inline="always", **_J)
def fp_code(y, mode):
    """The code of float32 y: its E4M3 byte (mode 3, mxfp8; ties to even, saturating) or its
    E2M1 code (modes 1, 2: the nearest magnitude, a tie to the smaller, saturating at 6;
    magnitude index | sign << 3, no -0)."""
    if mode == 3:
        return _fp8_code(y, 3, 7, 126)
    a = abs(y)
    c = 0
    for t in range(7):
        if a > _E2M1_MIDS[t]:
            c += 1
    if c > 0 and np.float32(y).view(np.int32) < 0:
        c |= 8
    return c


@njit(**_P)
def mlx_quant_fp(w, mode, gs, dt, f16tab, scale_vals, codes, s_out):
    """mxfp4 / nvfp4 / mxfp8 (modes 1, 2, 3; the weights rounded to dtype dt first): the scale
    byte of each group (s_out) and the codes packed into codes (rows, cols·bits/8)."""
    rows, cols = w.shape
    nb = cols // gs
    bits = 8 if mode == 3 else 4
    m = np.float32(448.0) if mode == 3 else np.float32(6.0)
    for r in prange(rows):
        row = _rounded(w[r], dt, f16tab)
        out = codes[r]
        for g in range(nb):
            o = g * gs
            amax = F0
            for j in range(gs):
                amax = max(amax, abs(row[o + j]))
            x = np.float32(amax / m)
            if mode == 2:
                sb = _fp8_code(x, 3, 7, 126)
            elif amax > 0 and x > 0:
                e = _ceil_log2(x)
                sb = min(max(e, -127), 127) + 127
            else:
                sb = 127
            s_out[r, g] = np.uint8(sb)
            sv = scale_vals[sb]
            for k in range(gs * bits // 32):
                acc = np.uint64(0)
                per = 32 // bits
                for j in range(per):
                    v = row[o + per * k + j]
                    y = np.float32(v / sv) if sv > 0 else F0
                    c = fp_code(_round(y, dt, f16tab), mode)
                    acc |= np.uint64(c) << np.uint64(j * bits)
                _put(out, (o + per * k) * bits // 8, acc, 4)

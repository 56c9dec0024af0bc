"""numba quantize kernel for Q6_K (256-weight super-blocks, sixteen 16-weight sub-blocks),
bit-identical to ``workbench.schemes.ggml.q6_k`` (float32 operation for operation, sums in
index order, no FMA contraction).

``q6k_encode`` flags per row: 1 the float16 super-scale overflows (the reference decides),
2 NaN/Inf in the row. Any flag sends the whole tensor to the numpy reference.
Plain arrays in, bytes out: imports nothing from ``workbench``; releases the GIL.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .cpu_common import _f32_to_f16_bits

_J = dict(cache=True, nogil=True)
_P = dict(cache=True, nogil=True, parallel=True)
F0 = np.float32(0.0)
EPS = np.float32(1e-15)          # GROUP_EPS of the reference, compared in float32
#: candidate inverse-scale numerators -(32 + 0.1 k), k = -9..9 (float64 -> float32, as numpy)
Q6K_STEPS = np.array([-(32 + 0.1 * k) for k in range(-9, 10)], np.float32)


@njit(inline="always", **_J)
def _clip_rint(v, lo, hi):
    q = np.rint(v)
    if q < lo:
        q = np.float32(lo)
    if q > hi:
        q = np.float32(hi)
    return q


@njit(inline="always", **_J)
def _f16_value(h):
    """float32 value of float16 bits h (exact)."""
    s = -1.0 if (h >> 15) & 1 else 1.0
    e = (h >> 10) & 31
    m = h & 1023
    if e == 0:
        return np.float32(s * m * 2.0 ** -24)
    if e == 31:
        return np.float32(s * np.inf) if m == 0 else np.float32(np.nan)
    return np.float32(s * (1024 + m) * 2.0 ** (e - 25))


@njit(inline="always", **_J)
def _sym_search(x, o, n, nmax, steps):
    """Least-squares scale of the best candidate codes for x[o:o+n] (weights x^2)."""
    mx = x[o]
    am = abs(mx)
    for j in range(1, n):
        a = abs(x[o + j])
        if a > am:
            am = a
            mx = x[o + j]
    if am < EPS:
        return F0
    best_scale = F0
    best_score = np.float32(-np.inf)
    for k in range(steps.shape[0]):
        iscale = steps[k] / mx
        sxl = F0
        sl2 = F0
        for j in range(n):
            v = x[o + j]
            L = _clip_rint(iscale * v, -nmax, nmax - 1)
            wl = (v * v) * L
            if j == 0:
                sxl = wl * v
                sl2 = wl * L
            else:
                sxl = sxl + wl * v
                sl2 = sl2 + wl * L
        if sl2 > 0:
            scale = sxl / sl2
            score = scale * sxl
            if score > best_score:
                best_score = score
                best_scale = scale
    if best_score == -np.inf:
        best_scale = -mx / np.float32(nmax)
    return best_scale


@njit(**_J)
def _enc_q6k(x, xn, sc, L, dst):
    """One 256-weight block x -> 210 bytes in dst; returns the flag (1: fp16 overflow)."""
    amax = F0
    for j in range(256):
        a = abs(x[j])
        if a > amax:
            amax = a
    if amax < EPS:
        e = 0
        for j in range(256):
            xn[j] = F0
    else:
        e = math.frexp(np.float64(amax))[1]
        for j in range(256):
            xn[j] = np.float32(math.ldexp(np.float64(x[j]), -e))
    for s in range(16):
        sc[s] = _sym_search(xn, 16 * s, 16, 32, Q6K_STEPS)
    top = sc[0]
    at = abs(top)
    for s in range(1, 16):
        a = abs(sc[s])
        if a > at:
            at = a
            top = sc[s]
    d = top / np.float32(-128.0)
    d_real = np.float32(math.ldexp(np.float64(d), e))
    h = _f32_to_f16_bits(d_real)
    if (h & 0x7FFF) >= 0x7C00:
        return 1
    hv = _f16_value(h)
    if d_real != 0:
        if hv == 0:
            over = True
        else:
            over = np.rint(np.float32(128.0) * abs(d_real) / abs(hv)) > 128
        if over:
            h = h + 1
            if (h & 0x7FFF) >= 0x7C00:
                return 1
            hv = _f16_value(h)
    d_eff = np.float32(math.ldexp(np.float64(hv), -e))
    ok = d_eff != 0 and abs(d_eff) < np.inf
    for s in range(16):
        c = _clip_rint(sc[s] / d_eff, -128, 127) if ok else F0
        dst[192 + s] = np.uint8(np.int32(c) & 255)
        dsub = d_eff * c
        for j in range(16):
            if dsub != 0:
                q = np.int32(_clip_rint(xn[16 * s + j] / dsub, -32, 31))
            else:
                q = 0
            L[16 * s + j] = np.uint8(q + 32)
    for hh in range(2):
        for l in range(32):
            b = hh * 128 + l
            dst[hh * 64 + l] = np.uint8((L[b] & 15) | ((L[b + 64] & 15) << 4))
            dst[hh * 64 + 32 + l] = np.uint8((L[b + 32] & 15) | ((L[b + 96] & 15) << 4))
            dst[128 + hh * 32 + l] = np.uint8((L[b] >> 4) | ((L[b + 32] >> 4) << 2)
                                              | ((L[b + 64] >> 4) << 4) | ((L[b + 96] >> 4) << 6))
    dst[208] = np.uint8(h & 255)
    dst[209] = np.uint8((h >> 8) & 255)
    return 0



@njit(**_P)
def q6k_encode(w, blocks, flags):
    """Q6_K blocks of w (rows, cols), cols a multiple of 256; flags as the module says."""
    rows, cols = w.shape
    nb = cols // 256
    nch = min(rows, 256)
    for ch in prange(nch):
        xn = np.empty(256, np.float32)
        sc = np.empty(16, np.float32)
        L = np.empty(256, np.uint8)
        for r in range(ch * rows // nch, (ch + 1) * rows // nch):
            row = w[r]
            f = 0
            for j in range(cols):
                if not abs(row[j]) < np.inf:
                    f = 2
                    break
            if f == 0:
                for b in range(nb):
                    f |= _enc_q6k(row[b * 256:b * 256 + 256], xn, sc, L,
                                  blocks[r, b * 210:b * 210 + 210])
            flags[r] = f

"""The quantize kernels of the GGML types llama.cpp quantizes by a fixed rule
(kernels/ggml_rtn_quant.py: MXFP4, TQ1_0, TQ2_0, NVFP4) against their numpy references: the same bytes on
ordinary, edge and hostile weights, the same refusals, and the dequantize kernel decodes them
as the reference does."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.core.errors import WorkbenchError
from workbench.quant import accel
from workbench.schemes import get_scheme

from kernel_testutil import same_bits, same_qt

TYPES = ["mxfp4", "tq1_0", "tq2_0", "nvfp4"]


def _kernel_bytes(name, w):
    from kernels import ggml_rtn_quant
    s = get_scheme(name)
    w = np.ascontiguousarray(w, np.float32)
    blocks = np.empty((w.shape[0], w.shape[1] // s.block_size * s.type_size), np.uint8)
    flags = np.empty(w.shape[0], np.uint8)
    ggml_rtn_quant.encode_blocks(s.ggml_name, w, blocks, flags)
    return blocks, flags


def _hostile(qk: int, seed: int) -> np.ndarray:
    """Rows of many magnitudes and shapes, exact ties of the code grids, zeros, -0,
    float32 subnormals and near-limit magnitudes."""
    rng = np.random.default_rng(seed)
    rows = []
    for scale in (1e-40, 1e-30, 1e-12, 1e-6, 1e-3, 1.0, 7.0, 1e3, 5e3):
        rows.append(rng.standard_normal(2 * qk) * scale)
        rows.append(rng.laplace(size=2 * qk) * scale)
        rows.append(np.abs(rng.uniform(-1, 1, 2 * qk)) * scale)
    grid = np.resize(np.array([0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.5, 3.0, 5.0, 6.0, 7.0,
                               10.0, 12.0, -0.5, -1.5, -2.5, -5.0, -7.0, -10.0, -12.0]), 2 * qk)
    rows.append(grid)
    rows.append(grid * 2.0 ** -20)
    rows.append(np.zeros(2 * qk))
    rows.append(np.full(2 * qk, -0.0))
    rows.append(np.full(2 * qk, 0.37))
    spike = np.zeros(2 * qk)
    spike[5] = 3.0
    spike[qk + 7] = -2.0 ** -126
    rows.append(spike)
    return np.stack(rows).astype(np.float32)


@pytest.mark.parametrize("name", TYPES)
def test_has_a_quantize_kernel(name):
    assert accel.has_kernel(name, "quantize", "cpu")


@pytest.mark.parametrize("name", TYPES)
def test_same_bytes_as_reference_on_hostile_weights(name):
    s = get_scheme(name)
    w = _hostile(s.block_size, 1)
    if name == "nvfp4":                               # rows past its 2688 limit: refused below
        w = w[np.abs(w).max(axis=1) <= 2688]
    blocks, flags = _kernel_bytes(name, w)
    assert not flags.any()
    ref = s.quantize(w).arrays["blocks"]
    assert np.array_equal(blocks, ref), np.argwhere((blocks != ref).any(axis=1)).ravel()
    qt = accel.quantize(s, w, backend="cpu")
    assert same_qt(qt, s.quantize(w))
    assert same_bits(accel.dequantize(qt, backend="cpu"), s.dequantize(qt))


@pytest.mark.parametrize("name", TYPES)
def test_same_bytes_on_ordinary_weights_many_rows(name):
    s = get_scheme(name)
    rng = np.random.default_rng(2)
    w = (rng.standard_normal((300, 1024)) * rng.uniform(1e-3, 3, (300, 1))).astype(np.float32)
    assert np.array_equal(_kernel_bytes(name, w)[0], s.quantize(w).arrays["blocks"])


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_refused_with_the_reference_count(name, bad):
    s = get_scheme(name)
    w = np.random.default_rng(4).standard_normal((4, 2 * 256)).astype(np.float32)
    w[2, 40] = bad
    w[3, 95] = bad
    w[0, 3] = np.finfo(np.float32).max / 4           # huge finite: not mistaken for Inf
    flags = _kernel_bytes(name, w)[1]
    assert list(flags & 2) == [0, 0, 2, 2]
    with pytest.raises(WorkbenchError) as ref:
        s.quantize(w)
    with pytest.raises(WorkbenchError) as got:
        accel.quantize(s, w, backend="cpu")
    assert str(got.value) == str(ref.value) and "2 NaN/Inf" in str(got.value)


def test_mxfp4_exponent_edges():
    """E8M0 exponent at and around powers of two, for zero and for max |w| below 2^-125
    (ggml's negative exponent cast to uint8 modulo 256: a huge scale, every code 0)."""
    s = get_scheme("mxfp4")
    amax = np.array([0.0, 1.0, np.nextafter(np.float32(1), np.float32(0)), 0.5, 2.0 ** -125, 2.0 ** -126, 1e-45,
                     3e38, 6.0, 6.5, 2.0 ** 127], np.float32)
    w = np.zeros((amax.size, 32), np.float32)
    w[:, 3] = amax
    w[:, 9] = -amax / 3
    blocks, _ = _kernel_bytes("mxfp4", w)
    e = blocks[:, 0]
    assert list(e) == [0, 125, 124, 124, 0, 255, 232, 252, 127, 127, 252]
    assert np.array_equal(blocks, s.quantize(w).arrays["blocks"])
    back = s.dequantize(s.quantize(w))
    assert not back[5:7].any()                        # the wrapped exponents decode to 0
    assert back[1, 3] == 1.0 and back[8, 3] == 6.0


def test_nvfp4_scale_edges():
    """UE4M3 sub-block scales of max|w|/6 at and around every UE4M3 value and midpoint, the
    subnormal range (capped at 7), the 448 clamp and exponents >= 15 (0x7E): kernel = reference,
    and the values ggml documents."""
    s = get_scheme("nvfp4")
    from workbench.schemes.ggml.nvfp4 import ue4m3_half
    v = 2 * ue4m3_half(np.arange(127, dtype=np.uint8)).astype(np.float64)
    mids = np.concatenate([v, (v[1:] + v[:-1]) / 2])
    x = np.concatenate([mids, np.nextafter(mids, 0), np.nextafter(mids, 1e9), [0.5 / 512, 7.5 / 512,
                        7.49 / 512, 255.9, 256.0, 448.0, 1e-45]]).astype(np.float32)
    x = x[(x > 0) & (x * np.float32(6) / np.float32(6) <= 448)]
    x = np.resize(x, (-(-x.size // 4)) * 4)
    w = np.zeros((x.size // 4, 64), np.float32)
    w[:, ::16] = (x.reshape(-1, 4) * np.float32(6)).astype(np.float32)
    w[:, 5::16] = -w[:, ::16] / 3
    blocks, flags = _kernel_bytes("nvfp4", w)
    assert not flags.any()
    assert np.array_equal(blocks, s.quantize(w).arrays["blocks"])
    one = np.zeros((1, 64), np.float32)
    one[0, ::16] = [6.0, 6 * 7.6 / 512, 6 * 300.0, 6 * 2.0 ** -9]
    d = s.quantize(one).arrays["blocks"][0, :4]
    assert list(d) == [0x38, 7, 0x7E, 1]              # 1.0, capped subnormal, 448, 2^-9
    assert list(ue4m3_half(np.array([0x38, 0x7F, 0x01, 0xFF, 0x80], np.uint8))) == \
        [0.5, 0.0, 2.0 ** -10, 240.0, 0.0]


def test_nvfp4_weights_past_the_scale_limit_refused_like_the_reference():
    """max|w|/6 above 448 (UE4M3's largest): ggml would clip, the workbench refuses, kernel and
    reference alike; 2688 itself is fine."""
    s = get_scheme("nvfp4")
    w = np.random.default_rng(6).standard_normal((3, 128)).astype(np.float32)
    w[0, 70] = np.float32(2688.0)
    w[1, 100] = np.float32(2689.0)
    assert list(_kernel_bytes("nvfp4", w)[1]) == [0, 1, 0]
    with pytest.raises(WorkbenchError) as ref:
        s.quantize(w)
    with pytest.raises(WorkbenchError) as got:
        accel.quantize(s, w, backend="cpu")
    assert str(got.value) == str(ref.value) and "exceeds 448" in str(got.value)
    assert s.dequantize(s.quantize(w[[0, 2]]))[0, 70] == 2688.0


@pytest.mark.parametrize("name", ["tq1_0", "tq2_0"])
def test_ternary_scale_overflow_refused_like_the_reference(name):
    s = get_scheme(name)
    w = np.random.default_rng(5).standard_normal((3, 512)).astype(np.float32)
    w[1, 300] = np.float32(7e4)                       # float16 d = max|w| overflows
    flags = _kernel_bytes(name, w)[1]
    assert list(flags) == [0, 1, 0]
    with pytest.raises(WorkbenchError) as ref:
        s.quantize(w)
    with pytest.raises(WorkbenchError) as got:
        accel.quantize(s, w, backend="cpu")
    assert str(got.value) == str(ref.value) and "overflows" in str(got.value)


def test_ternary_layouts_decode_as_ggml_documents():
    """TQ2_0 byte 32h+m holds weights 128h+m+32n at bits 2n; TQ1_0 byte m (m < 32) holds
    weights m+32k, most significant trit first, as ceil(value * 256 / 243)."""
    w = np.zeros((1, 256), np.float32)
    w[0, 0], w[0, 32], w[0, 128 + 5], w[0, 255] = 1.0, -1.0, 1.0, -1.0
    b2 = get_scheme("tq2_0").quantize(w).arrays["blocks"][0]
    assert b2[0] == 2 | (0 << 2) | (1 << 4) | (1 << 6) and b2[32 + 5] == 0b01010110
    assert b2[63] == 0b00010101                       # weight 255: h 1, m 31, n 3 -> -1
    b1 = get_scheme("tq1_0").quantize(w).arrays["blocks"][0]
    t = [2, 0, 1, 1, 1]                               # weights 0, 32, 64, 96, 128 of byte 0
    v = sum(d * 3 ** (4 - k) for k, d in enumerate(t))
    assert b1[0] == (v * 256 + 242) // 243

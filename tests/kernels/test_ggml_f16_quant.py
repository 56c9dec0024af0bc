"""Q4_0 / Q8_0 straight from float16 / bfloat16 bits (kernels/ggml_f16_quant.py through
accel.quantize_widening): the bytes of the float32 path on the widened weights, bit for bit,
and None (the float32 path decides) for NaN/Inf or a float16 scale that overflows."""

import numpy as np
import pytest

from kernels import convert
from workbench.quant import accel
from workbench.export.gguf_tensor_data import FUSED_WIDENING


def _edge_f16(rng, rows, cols):
    w = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float16)
    w[1] = 0                                              # all zero: d = 0
    w[2] = -0.0
    w[3] = np.float16(6e-8) * rng.integers(-3, 4, cols)   # float16 subnormals
    w[4, ::7] = np.float16(65504)                         # the float16 maximum
    w[5, 3::32] = np.float16(-65504)
    w[6] = np.float16(2.0 ** -14) * rng.standard_normal(cols)   # around the smallest normal
    w[7, 5] = w[7, 37] = np.float16(1.5)                  # ties for the largest |x|
    w[7, 6] = w[7, 38] = np.float16(-1.5)
    return w


@pytest.mark.parametrize("scheme", sorted(FUSED_WIDENING))
def test_float16_rows_give_the_float32_paths_bytes(scheme):
    rng = np.random.default_rng(3)
    for rows, cols in ((9, 64), (300, 512), (1, 4096)):
        w = _edge_f16(rng, max(rows, 8), cols)[:rows] if rows >= 8 else \
            (rng.standard_normal((rows, cols)) * 0.05).astype(np.float16)
        got = accel.quantize_widening(scheme, w, "F16")
        want = accel.quantize(scheme, convert.f16_to_f32(w))
        assert got is not None and got.shape == want.shape
        assert got.arrays["blocks"].tobytes() == want.arrays["blocks"].tobytes()
        bits = accel.quantize_widening(scheme, w.view(np.uint16), "F16")   # raw bits alike
        assert bits.arrays["blocks"].tobytes() == want.arrays["blocks"].tobytes()


@pytest.mark.parametrize("scheme", sorted(FUSED_WIDENING))
def test_bfloat16_rows_give_the_float32_paths_bytes(scheme):
    rng = np.random.default_rng(4)
    f = (rng.standard_normal((64, 256)) * 0.05).astype(np.float32)
    f[3] = f[3] * np.float32(1e-39)                       # float32 subnormals
    u = (f.view(np.uint32) >> 16).astype(np.uint16)
    got = accel.quantize_widening(scheme, u, "BF16")
    want = accel.quantize(scheme, convert.bf16_to_f32(u))
    assert got.arrays["blocks"].tobytes() == want.arrays["blocks"].tobytes()


@pytest.mark.parametrize("scheme", sorted(FUSED_WIDENING))
def test_nonfinite_or_overflowing_weights_are_left_to_the_float32_path(scheme):
    w = (np.random.default_rng(5).standard_normal((16, 64)) * 0.05).astype(np.float16)
    for bad in (np.float16(np.nan), np.float16(np.inf), np.float16(-np.inf)):
        v = w.copy()
        v[9, 40] = bad
        assert accel.quantize_widening(scheme, v, "F16") is None
    u = np.full((2, 64), 0x7F00, np.uint16)                # bfloat16 1.7e38: the scale overflows
    assert accel.quantize_widening(scheme, u, "BF16") is None


def test_what_has_no_widening_kernel_says_none():
    w = np.zeros((4, 256), np.float16)
    assert accel.quantize_widening("q4_k", w, "F16") is None      # K-quants: the float32 path
    assert accel.quantize_widening("q4_0", w, "F32") is None
    assert accel.quantize_widening("q4_0", w[:, :48], "F16") is None   # row not a multiple of 32
    assert accel.quantize_widening("q4_0", w.reshape(-1), "F16") is None   # 1-D

"""GGML quantizers on subnormal and tiny weights: kernels equal the reference bytes, and no
block decodes worse than all-zeros would (relative RMSE <= 1)."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.quant import accel
from workbench.schemes import get_scheme

from kernel_testutil import same_qt

GGML = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k",
        "iq4_nl"]


@pytest.mark.parametrize("name", ["q4_0", "q8_0"])
@pytest.mark.parametrize("scale", [1e-36, 1e-38, 1e-39, 1e-40, 1e-42, 1e-45])
def test_subnormal_weights_same_bytes_as_reference(name, scale):
    s = get_scheme(name)
    w = (np.random.default_rng(0).standard_normal((4, 64)) * scale).astype(np.float32)
    ref = s.quantize(w)
    assert same_qt(accel.quantize(s, w, backend="cpu"), ref), (name, scale)
    # a float32 scale below 2**-128 has no float16: the block decodes to exactly zero, and
    # its codes are those of x * 0 (defined bytes, not a cast of +-Inf/NaN)
    blocks = np.asarray(ref.arrays["blocks"]).reshape(-1).view(np.uint8).reshape(-1, 18 if name == "q4_0" else 34)
    if scale <= 1e-39:
        expect = 0x88 if name == "q4_0" else 0
        assert (blocks[:, 2:] == expect).all()
        assert not s.dequantize(ref).any()


def test_subnormal_reciprocal_is_zero():
    from workbench.schemes.ggml.common import safe_recip
    d = np.array([0.0, 1e-40, -2.9e-39, 1e-38, 2.0], np.float32)
    inv = safe_recip(d)
    assert inv[0] == 0 and inv[1] == 0 and inv[2] == 0
    assert inv[3] == np.float32(1.0) / np.float32(1e-38) and inv[4] == np.float32(0.5)


@pytest.mark.parametrize("name", GGML)
def test_tiny_weights_relative_error_at_most_one(name):
    """std 1e-9..3e-8 around means that straddle float16's smallest subnormal (5.96e-8)."""
    s = get_scheme(name)
    rng = np.random.default_rng(2)
    worst = 0.0
    for mu in np.linspace(-1e-7, 1e-7, 9):
        for std in (1e-9, 1e-8, 3e-8):
            w = (rng.standard_normal((4, 256)) * std + mu).astype(np.float32)
            d = s.dequantize(s.quantize(w))
            worst = max(worst, float(np.linalg.norm(d - w) / np.linalg.norm(w)))
    assert worst <= 1.0 + 1e-6, (name, worst)


@pytest.mark.parametrize("name", ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0"])
def test_legacy_kernels_match_reference_on_edge_blocks(name):
    """Zero blocks, signed zeros, constant blocks, tiny and subnormal blocks mixed in one
    tensor with ordinary ones: the kernel's bytes (or its fallback) equal the reference's."""
    s = get_scheme(name)
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((6, 256)) * 0.02).astype(np.float32)
    w[0, :32] = 0.0
    w[0, 32:64] = -0.0
    w[1, :32] = 0.125
    w[1, 32:64] = -3e-8
    w[2, :64] *= np.float32(1e-6)
    w[3, :64] = rng.standard_normal(64).astype(np.float32) * np.float32(1e-40)
    w[4, ::2] = 0.0
    assert accel.has_kernel(name, "quantize", "cpu")
    for rows in (slice(0, 6), slice(2, 3), slice(4, 6)):
        part = np.ascontiguousarray(w[rows])
        assert same_qt(accel.quantize(s, part, backend="cpu"), s.quantize(part)), (name, rows)

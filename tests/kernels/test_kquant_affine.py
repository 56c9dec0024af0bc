"""The Q2_K/Q4_K/Q5_K numba quantize kernels (kernels/kquant_affine.py) against their numpy
reference (workbench/schemes/ggml/affine_k.py): the same bytes, block for block, on ordinary
and hostile weights, with and without importance weights; the same refusals."""

from __future__ import annotations

import numpy as np
import pytest

from kernels import cpu_ops
from workbench.quant import accel
from workbench.core.errors import WorkbenchError
from workbench.quant.methods import ggml_weighted
from workbench.schemes import get_scheme

TYPES = ["q2_k", "q4_k", "q5_k"]


def _hostile(cols: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rows = 24
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    w *= rng.uniform(0.01, 3.0, (rows, 1)).astype(np.float32)
    w[0] = 0.0                                          # all zeros
    w[1, :256] = np.float32(7e-41)                      # subnormal float32
    w[1, 256:] *= np.float32(1e-20)                     # below the all-zero threshold (1e-15)
    w[2] = np.float32(0.5)                              # constant, positive
    w[3] = np.float32(-0.25)                            # constant, negative
    w[4] = np.abs(w[4])                                 # one-signed
    w[5] = -np.abs(w[5])
    w[6] *= np.float32(1e-6)                            # float16 super-scales in subnormals
    w[7] *= np.float32(1e-12)
    w[8, 17] = 60.0                                     # an outlier
    w[9] *= np.float32(1e3)                             # large but representable
    w[10, ::2] = 0.0
    w[11] = np.round(w[11] * 2) / 2                     # few distinct values
    w[12, :128] = np.float32(-0.0)
    w[13] *= np.float32(3e-8)
    return w


def _blocks(qt):
    return qt.arrays["blocks"]


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("cols", [256, 512, 768, 1280])
def test_kernel_bytes_equal_reference(name, cols):
    s = get_scheme(name)
    assert accel.has_kernel(s, "quantize", "cpu")
    w = _hostile(cols, cols)
    ours = accel.quantize(s, w, backend="cpu")
    ref = s.quantize(w)
    assert np.array_equal(_blocks(ours), _blocks(ref))
    # the kernel itself produced them (no silent fallback to the reference)
    assert cpu_ops.affine_k_blocks(accel.spec_for(s), w) is not None


@pytest.mark.parametrize("name", TYPES)
def test_kernel_bytes_equal_reference_odd_rows(name):
    """Odd super-block counts pair the last super-block of a thread's rows with zeros."""
    s = get_scheme(name)
    w = _hostile(256 * 3, 7)[:5]
    assert np.array_equal(_blocks(accel.quantize(s, w, backend="cpu")), _blocks(s.quantize(w)))


@pytest.mark.parametrize("name", TYPES)
def test_nonfinite_and_overflow_refused_alike(name):
    s = get_scheme(name)
    for bad in (np.nan, np.inf, -np.inf):
        w = _hostile(512, 3)
        w[4, 300] = bad
        with pytest.raises(WorkbenchError, match="NaN/Inf"):
            accel.quantize(s, w, backend="cpu")
    w = _hostile(512, 4)
    w[2] = np.float32(3e38)                              # the float16 super-scale overflows
    with pytest.raises(WorkbenchError) as k:
        accel.quantize(s, w, backend="cpu")
    with pytest.raises(WorkbenchError) as r:
        s.quantize(w)
    assert str(k.value) == str(r.value)
    assert cpu_ops.affine_k_blocks(accel.spec_for(s), w) is None      # the kernel declined


@pytest.mark.parametrize("name", TYPES)
def test_weighted_kernel_equals_weighted_reference(name):
    s = get_scheme(name)
    w = _hostile(512, 11)
    rng = np.random.default_rng(5)
    qw = rng.gamma(0.5, 1.0, 512).astype(np.float32)
    qw[:40] = 0.0                                       # dead input channels
    qw[100:140] = 1e-30
    x = w.reshape(-1, 256)
    q2 = np.ascontiguousarray(np.broadcast_to(qw, w.shape)).reshape(-1, 256)
    got = ggml_weighted.weighted_encode(s, x, q2)
    ref = s.encode(x, q2)
    s._zero_worse_blocks(ref, x)
    assert np.array_equal(got, ref.view(np.uint8).reshape(got.shape))
    # the kernel ran (not the reference fallback)
    assert cpu_ops.affine_k_blocks(accel.spec_for(s), x, q2) is not None
    # importance matters: the weighted error it minimises is below the unweighted encoder's
    def werr(raw):
        y = s.decode(raw.reshape(-1).view(s.block_dtype)).reshape(x.shape).astype(np.float64)
        return float((q2 * (y - x) ** 2).sum())
    plain = _blocks(s.quantize(w)).reshape(got.shape)
    assert werr(got) < werr(plain)

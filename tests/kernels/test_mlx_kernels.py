"""The MLX schemes' numba CPU kernels (kernels/cpu_mlx.py): quantize, dequantize and the fused
error bit for bit the numpy reference, for every mode and float dtype (the registered schemes
run through test_bit_identity.py too), on edge values: scales at powers of two, E2M1 and E4M3
ties, all-zero, constant and tiny groups, stacked experts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from workbench.quant import accel
from workbench.schemes import get_scheme, list_schemes

from kernel_testutil import same_bits, same_qt, weights

NAMES = [n for n in list_schemes() if n.startswith("mlx-")]


def _edges(cols: int = 128) -> np.ndarray:
    rng = np.random.default_rng(5)
    rows = [np.zeros(cols), np.full(cols, 0.25), np.full(cols, -3.0),
            rng.standard_normal(cols) * 1e-30, rng.standard_normal(cols) * 1e4,
            np.round(rng.standard_normal(cols) * 8) / 4]
    # groups whose max|w| / 6 and / 448 sit at and just above powers of two
    for k in (0, 1, 3):
        r = rng.uniform(-1, 1, cols)
        r[::16] = 6 * 448 * 2.0 ** -10 * (1 + k * 2.0 ** -23)
        rows.append(r)
    # E2M1 / E4M3 ties at scale 1 (a 6 or 448 sets the scale)
    r = np.tile([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.75, -1.75, -3.5, -5.0, 0.1,
                 -0.1, 4.5, 5.5], cols // 16)
    rows.append(r)
    return np.stack(rows).astype(np.float32)


@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
@pytest.mark.parametrize("name", NAMES)
def test_cpu_kernels_match_reference(name, dtype):
    s = get_scheme(name).for_dtype(dtype)
    for w in (weights((12, 256), seed=2), _edges(), weights((2, 3, 128), seed=4)):
        # float32 weights: a float16/bfloat16 scheme rounds them to its dtype first (both paths)
        ref = s.quantize(w)
        assert ref.scheme == s.name
        got = accel.quantize(s, w, backend="cpu")
        assert accel.has_kernel(s, "quantize", "cpu")
        assert same_qt(got, ref), (name, dtype, w.shape)
        deq = s.dequantize(ref)
        assert same_bits(accel.dequantize(ref, backend="cpu"), deq)
        sums = accel.dequant_error(w, ref, backend="cpu")
        d = (w.astype(np.float64) - deq).reshape(-1)
        assert math.isclose(sums.sse, float(d @ d), rel_tol=1e-12)
        assert sums.max_abs_err == float(np.abs(d).max())


def test_dtype_variants_decode_through_their_name():
    """A bfloat16 export's tensor names its scheme with the dtype: accel (which finds the
    scheme by name) decodes its uint16 bfloat16 scales as bfloat16, not as float16."""
    w = weights((4, 128), seed=9)
    s = get_scheme("mlx-q4-g32").for_dtype("BF16")
    qt = s.quantize(w)
    assert qt.scheme == "mlx-q4-g32@bf16" and qt.arrays["scales"].dtype == np.uint16
    assert same_bits(accel.dequantize(qt, backend="cpu"), s.dequantize(qt))
    assert not same_bits(s.dequantize(qt), get_scheme("mlx-q4-g32").dequantize(
        get_scheme("mlx-q4-g32").quantize(w)))

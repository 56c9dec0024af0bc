"""The fused dequantize+error kernel gives the reference ErrorSums.

Tolerance: the float64 sums are accumulated in a different order than numpy's pairwise
summation (and reassociated/vectorized), so sse/sig/deq/dot and the per-channel sums agree to
a relative 1e-12 (float64 rounding of the summation order); n and max_abs_err are exact.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from workbench.quant import accel
from workbench.quant.metrics import ErrorSums, from_sums
from workbench.schemes import get_scheme, list_schemes

from kernel_testutil import weights

RTOL = 1e-12


def assert_sums_equal(got: ErrorSums, ref: ErrorSums):
    assert got.n == ref.n
    for f in ("sse", "sig", "deq", "dot"):
        a, b = getattr(got, f), getattr(ref, f)
        assert math.isclose(a, b, rel_tol=RTOL, abs_tol=1e-300), (f, a, b)
    assert got.max_abs_err == ref.max_abs_err
    np.testing.assert_allclose(got.ch_sse, ref.ch_sse, rtol=RTOL, atol=1e-300)
    np.testing.assert_allclose(got.ch_sig, ref.ch_sig, rtol=RTOL, atol=1e-300)


@pytest.mark.parametrize("name", list_schemes())
def test_fused_error_equals_reference(name):
    s = get_scheme(name)
    for shape in [(12, 512), (5, 7), (64,)]:
        if not s.can_take(shape):
            continue
        w = weights(shape, seed=3)
        qt = s.quantize(w)
        rows = shape[0] if len(shape) > 1 else 1
        ref = ErrorSums.from_arrays(w.reshape(rows, -1), s.dequantize(qt).reshape(rows, -1))
        got = accel.dequant_error(w, qt, backend="cpu")
        assert_sums_equal(got, ref)
        m1, m2 = from_sums(got), from_sums(ref)
        assert math.isclose(m1.sqnr_db, m2.sqnr_db, rel_tol=1e-9) or m1.sqnr_db == m2.sqnr_db


def test_fused_error_propagates_nan():
    w = np.ones((2, 8), np.float32)
    w[1, 3] = np.nan
    qt = get_scheme("fp16").quantize(w)
    got = accel.dequant_error(w, qt, backend="cpu")
    assert math.isnan(got.max_abs_err) and math.isnan(got.sse)
    assert not math.isnan(got.ch_sse[0])

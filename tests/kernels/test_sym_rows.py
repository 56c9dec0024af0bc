"""The symmetric search of a whole row of small blocks at once (kernels/cpu_sym_rows.py,
taken by the one-pass kernels for blocks of at most 64 weights, 16 or more to a row): the
same scales, codes and error sums as the numpy reference, bit for bit, on weights that make
the search hard (near ties, exact ties between scales, float16 saturation and subnormals,
float32 inverses that overflow, zero blocks)."""

from __future__ import annotations

import numpy as np
import pytest

from kernels.cpu_sym_rows import ROW_BLOCKS, ROW_GS
from workbench.quant import accel
from workbench.schemes import get_scheme

from kernel_testutil import same_qt, weights

#: searched symmetric schemes with blocks the row search takes (float16 and float32 scales)
SCHEMES = [n for n in ("int4-g32", "int4-g64", "int3-g32", "int5-g64", "int8-g32", "int2-g64")
           if accel.spec_for(n) is not None and accel.spec_for(n).divs]


def _cases():
    rng = np.random.default_rng(7)
    cols = ROW_GS * ROW_BLOCKS * 2
    yield "gaussian", weights((24, cols), seed=3)
    # integer multiples of one step: many blocks where two candidates tie exactly or nearly
    yield "grid", (rng.integers(-8, 8, (24, cols)) * 0.01).astype(np.float32)
    # five distinct values per block: errors made of few distinct terms
    g = rng.choice(np.float32([-1.0, -0.5, 0.25, 0.75, 1.0]), (16, cols)).astype(np.float32)
    yield "few-values", g
    z = weights((8, cols), seed=4)
    z[:, :ROW_GS * 3] = 0.0                       # zero blocks: every scale 0
    z[2] = 0.0
    yield "zero-blocks", z
    # magnitudes from float16 subnormal scales up to near its limit
    yield "wide", (rng.standard_normal((16, cols)).astype(np.float32)
                   * np.logspace(-9, 5, cols).astype(np.float32))
    # and beyond: rows whose largest candidate scale saturates float16
    yield "saturating", (rng.standard_normal((16, cols)).astype(np.float32)
                         * np.logspace(-3, 6, cols).astype(np.float32))
    yield "tiny-float32", (rng.standard_normal((8, cols)) * 1e-37).astype(np.float32)


CASES = list(_cases())


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_row_search_matches_the_reference(name, case):
    w = dict(CASES)[case]
    s = get_scheme(name)
    gs = accel.spec_for(name).geometry(*w.shape)[0]
    assert gs <= ROW_GS and w.shape[1] // gs >= ROW_BLOCKS     # the row search's own case
    try:
        ref = s.quantize(w)
    except Exception:                             # the reference refuses (a scale overflows)
        assert accel.quantize_error(name, w, backend="cpu") is None
        return
    got = accel.quantize(s, w, backend="cpu")
    assert same_qt(got, ref), (name, case)
    one = accel.quantize_error(name, w, backend="cpu")
    ref_sums = accel.dequant_error(w, ref, backend="cpu")
    if one is not None:
        nbytes, sums = one
        assert nbytes == ref.nbytes
        for f in ("sse", "sig", "deq", "dot", "max_abs_err"):
            assert getattr(sums, f) == getattr(ref_sums, f), (name, case, f)


def _exact_errors(x, divs, qmin, qmax):
    """(candidates, blocks) exact squared errors of blocks x (blocks, gs) and their scales."""
    amax = np.abs(x).max(axis=1, keepdims=True)
    errs, scales = [], []
    for d in divs:
        s = (amax / np.float32(d)).astype(np.float16).astype(np.float32)
        iv = np.where(s == 0, 0, np.float32(1) / np.where(s == 0, 1, s)).astype(np.float32)
        q = np.clip(np.rint(x * iv), qmin, qmax).astype(np.float32)
        diff = (q * s - x).astype(np.float64)
        errs.append((diff * diff).sum(axis=1))
        scales.append(s[:, 0])
    return np.array(errs), np.array(scales)


def test_near_ties_are_decided_as_the_reference_decides():
    # weights on a grid of 1/64: about 1 block in 8,000 has two candidates of different
    # scales whose exact errors are within 2 * 2**-24 of each other, where no float32 screen
    # can tell them apart: the reference's own sums must decide, as the reference does
    rng = np.random.default_rng(11)
    w = (rng.integers(-64, 65, (320, 4096)) / 64).astype(np.float32)
    blocks = w.reshape(-1, 32)
    e, sc = _exact_errors(blocks, accel.spec_for("int4-g32").divs, -8, 7)
    best = e.argmin(axis=0)
    cols = np.arange(e.shape[1])
    eb, sb = e[best, cols], sc[best, cols]
    near = ((np.abs(e - eb) <= 2 * 2.0 ** -24 * (e + eb)) & (sc != sb)).any(axis=0)
    assert near.sum() >= 3, near.sum()
    s = get_scheme("int4-g32")
    ref = s.quantize(w)
    assert same_qt(accel.quantize(s, w, backend="cpu"), ref)
    nbytes, sums = accel.quantize_error("int4-g32", w, backend="cpu")
    ref_sums = accel.dequant_error(w, ref, backend="cpu")
    assert nbytes == ref.nbytes and sums.sse == ref_sums.sse


def test_float16_saturation_is_in_the_cases():
    # a row whose largest candidate scale is above 65504: searched block by block (_sym_qp)
    assert np.abs(dict(CASES)["saturating"]).max() / 7 > 65504
    assert np.abs(dict(CASES)["wide"]).max() / 7 < 65504

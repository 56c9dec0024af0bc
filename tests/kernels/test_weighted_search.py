"""The weighted scale search's kernel (kernels/weighted_search.py) against its numpy reference
(intq.candidate_errors_ref), bit for bit, and the search it drives against a plain loop over
the candidates."""

import numpy as np
import pytest

from kernels.weighted_search import candidate_errors
from workbench.quant.methods import intq
from workbench.schemes import get_scheme
from workbench.schemes.granularity import as_blocks


def _data(rng, rows, cols, tiny=False):
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    w[0, :5] = [0.0, -0.0, 7.5, -3.25, 1e-3]
    if tiny:                        # a block whose float32 inverse scale overflows
        w[1] = np.float32(1e-39)
    imp = rng.gamma(0.5, 1.0, cols).astype(np.float32)
    imp[3] = 0.0
    return w, imp


@pytest.mark.parametrize("name", ["int4-g32", "int4-g128-asym", "int8-channel", "int3-g64",
                                  "int4-channel-asym", "int2-g64"])
@pytest.mark.parametrize("cols", [128, 384, 640])
def test_kernel_equals_reference_bit_for_bit(name, cols):
    sch = get_scheme(name)
    rng = np.random.default_rng(cols)
    w, imp = _data(rng, 24, cols, tiny="channel" in name and not sch.asym)
    blocks = as_blocks(w, sch.gran)
    bimp = intq.block_importance(sch, imp, *w.shape)
    amax = np.abs(blocks).max(1)
    K = 7
    scales = np.stack([sch._store_scale_soft(amax * np.float32(r) / np.float32(sch.qmax))[0]
                       for r in np.linspace(1, 0.4, K)], axis=1)
    scales[0, 2] = 0                                     # a zero scale: codes 0
    zeros = None
    if sch.asym:
        zeros = rng.integers(0, sch.qmax + 1, scales.shape).astype(np.uint8)
    ref = intq.candidate_errors_ref(sch, blocks, bimp, scales, zeros, lsq=not sch.asym)
    got = candidate_errors(blocks, bimp, scales.astype(np.float32),
                           np.zeros(scales.shape, np.float32) if zeros is None
                           else zeros.astype(np.float32), sch.qmin, sch.qmax, not sch.asym)
    for r, g in zip(ref, got):
        assert r.shape == g.shape == (blocks.shape[0], K)
        np.testing.assert_array_equal(g, r)
    assert np.all(ref[0] >= 0) and ref[0].max() > 0


def _loop_search(sch, blocks, imp):
    """The search as a plain loop over candidates in their order (first least error wins)."""
    cands = []
    if sch.asym:
        lo, hi = sch._range_asym(blocks)
        for r1 in intq.ASYM_RATIOS:
            for r2 in intq.ASYM_RATIOS:
                cands.append(intq.qparams_from_range(sch, lo * np.float32(r1),
                                                     hi * np.float32(r2)))
    else:
        hi = sch._range_sym(blocks)
        cands.append((sch.choose_qparams(blocks)[0], None))
        for r in intq.RATIOS:
            s, _ = intq.qparams_from_range(sch, None, hi * np.float32(r))
            cands.append((s, None))
            _, num, den = intq.candidate_errors_ref(sch, blocks, imp, s[:, None], None,
                                                    lsq=True)
            ok = den[:, 0] > 0
            s2 = np.where(ok, num[:, 0] / np.where(ok, den[:, 0], 1), s.astype(np.float64))
            cands.append((sch._store_scale(np.abs(s2).astype(np.float32)), None))
    best = np.full(blocks.shape[0], np.inf)
    out_s = cands[0][0].copy()
    out_z = None if cands[0][1] is None else cands[0][1].copy()
    for s, z in cands:
        e = intq.candidate_errors_ref(sch, blocks, imp, s[:, None],
                                      None if z is None else z[:, None])[0][:, 0]
        better = e < best
        best = np.where(better, e, best)
        out_s = np.where(better, s, out_s)
        if z is not None:
            out_z = np.where(better, z, out_z)
    return out_s, out_z, best


@pytest.mark.parametrize("name", ["int4-g32", "int4-g128-asym", "int8-channel", "int3-g64-asym"])
def test_search_picks_the_first_least_error_candidate(name, monkeypatch):
    sch = get_scheme(name)
    rng = np.random.default_rng(7)
    w, imp = _data(rng, 40, 256)
    blocks = as_blocks(w, sch.gran)
    bimp = intq.block_importance(sch, imp, *w.shape)
    want_s, want_z, want_e = _loop_search(sch, blocks, bimp)
    monkeypatch.setattr(intq, "SEARCH_BLOCKS", 7)         # chunks give the same answer
    err = np.empty(blocks.shape[0])
    s, z = intq.weighted_qparams(sch, blocks, bimp, err)
    np.testing.assert_array_equal(s, want_s.astype(sch.scale_dtype))
    np.testing.assert_array_equal(err, want_e)
    if sch.asym:
        np.testing.assert_array_equal(z, want_z)
    else:
        assert z is None
    # never worse than the scheme's own round-to-nearest in the weighted measure
    own_s, own_z = sch.choose_qparams(blocks)
    own = intq.candidate_errors_ref(sch, blocks, bimp, own_s[:, None],
                                    None if own_z is None else own_z[:, None])[0][:, 0]
    assert np.all(err <= own) and np.any(err < own)

"""GPTQ against a direct small-matrix computation of its update formula (explicit loop over
columns with the full inverse Hessian downdated after each column, no Cholesky, no lazy
blocks), and its output as a valid tensor of the scheme."""

import numpy as np
import pytest

from workbench.quant.methods import LayerStats, get_method
from workbench.quant.methods.gptq import prepare_hessian
from workbench.schemes import get_scheme


def _stats(cols, seed=0, n=300):
    rng = np.random.default_rng(seed)
    mix = rng.normal(size=(cols, cols)) * 0.3 + np.eye(cols)
    X = (rng.normal(size=(n, cols)) @ mix) * np.exp(rng.normal(size=cols))
    X[:, 3] = 0.0                               # a dead input channel
    return LayerStats.from_inputs(X.astype(np.float32)), X.astype(np.float32)


def _reference(W, H, quant_group, G):
    """OBS-style loop: q = Q(w_i) with group qparams chosen from the current weights (and the
    group's diag of the damped H) at each group start; W[:, i:] -= (w_i - q)/Hinv_ii * Hinv[i, i:]; Hinv downdated by column i."""
    Hd, Wr, _ = prepare_hessian(H, W)
    Hinv = np.linalg.inv(Hd)
    Q = np.zeros_like(Wr)
    params = None
    hdiag = np.diag(Hd)
    for i in range(Wr.shape[1]):
        if i % G == 0:
            params = quant_group(Wr[:, i:i + G], hdiag[i:i + G])
        q = params(Wr[:, i])
        Q[:, i] = q
        err = (Wr[:, i] - q) / Hinv[i, i]
        Wr[:, i:] -= np.outer(err, Hinv[i, i:])
        Hinv = Hinv - np.outer(Hinv[:, i], Hinv[i, :]) / Hinv[i, i]
    return Q


def _weighted_sym_scale(scheme, cur, h):
    """Per row, the candidate amax/d (d = P, P + 1/4, ..., P + 3, stored in the scale dtype)
    with the least sum_j h_j (w_j - Q(w_j))^2 -- GPTQ's symmetric group scale."""
    amax = np.abs(cur).max(axis=1).astype(np.float32)
    best, best_err = None, None
    for d in scheme.qmax + np.arange(13) / 4:
        sc = (amax / np.float32(d)).astype(scheme.scale_dtype)
        s32 = sc.astype(np.float32)[:, None]
        c = np.clip(np.rint(cur / np.where(s32 > 0, s32, 1)), scheme.qmin, scheme.qmax)
        err = ((c * s32 - cur).astype(np.float64) ** 2 * h).sum(axis=1)
        if best is None:
            best, best_err = sc.copy(), err
        better = err < best_err
        best[better], best_err[better] = sc[better], err[better]
    return best


def _int_group(scheme):
    def start(cur, h):
        cur = cur.astype(np.float32)
        if scheme.asym:
            scale, zero = scheme.choose_qparams(cur)
        else:
            scale, zero = _weighted_sym_scale(scheme, cur, h), None
        s = scale.astype(np.float64)

        def q(w):
            c = np.rint(w.astype(np.float32) / scale.astype(np.float32))
            if zero is not None:
                c = np.clip(c + zero, scheme.qmin, scheme.qmax) - zero
            else:
                c = np.clip(c, scheme.qmin, scheme.qmax)
            return c * s
        return q
    return start


@pytest.mark.parametrize("name,rows,cols,G", [("int4-channel", 8, 16, 16),
                                               ("int3-g32", 8, 64, 32),
                                               ("int4-g32-asym", 8, 64, 32)])
def test_gptq_matches_direct_update_formula(name, rows, cols, G):
    scheme = get_scheme(name)
    rng = np.random.default_rng(1)
    W = rng.normal(size=(rows, cols)).astype(np.float32)
    st, X = _stats(cols)
    qt = get_method("gptq").quantize(W, scheme, st, block=8)   # several lazy blocks
    got = scheme.dequantize(qt)
    ref = _reference(W, st.H, _int_group(scheme), G)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5)
    assert qt.nbytes == scheme.nbytes(W.shape)
    assert np.all(got[:, 3] == 0)                      # dead column stored as zero
    # and the compensation pays off on the calibration inputs
    rtn = scheme.dequantize(scheme.quantize(W))
    assert np.sum((X @ (W - got).T) ** 2) < np.sum((X @ (W - rtn).T) ** 2)


def test_gptq_ggml_blocks_match_direct_formula():
    """GGML: each 32-weight block encoded by the format's quantizer from its current weights
    at the block's first column; the same sequential updates."""
    scheme = get_scheme("q4_0")
    rng = np.random.default_rng(2)
    W = rng.normal(size=(8, 64)).astype(np.float32)
    st, _ = _stats(64, seed=3)

    def start(cur, h):
        deq = scheme.dequantize(scheme.quantize(np.ascontiguousarray(cur, np.float32)))
        cols = iter(range(cur.shape[1]))
        return lambda w: deq[:, next(cols)].astype(np.float64)
    ref = _reference(W, st.H, start, 32)
    qt = get_method("gptq").quantize(W, scheme, st)
    np.testing.assert_allclose(scheme.dequantize(qt), ref, rtol=0, atol=1e-6)


def test_gptq_act_order_static_groups_valid():
    scheme = get_scheme("int4-g32")
    rng = np.random.default_rng(4)
    W = rng.normal(size=(16, 64)).astype(np.float32)
    st, X = _stats(64, seed=5, n=1000)
    qt = get_method("gptq").quantize(W, scheme, st, act_order=True)
    got = scheme.dequantize(qt)
    rtn = scheme.dequantize(scheme.quantize(W))
    assert np.sum((X @ (W - got).T) ** 2) < np.sum((X @ (W - rtn).T) ** 2)


def test_row_chunks_factor_the_hessian_once_and_equal_the_whole_tensor(monkeypatch):
    """A big tensor is quantized a row chunk at a time (workbench.quant.streaming): the chunks reuse
    one factorization of their shared Hessian (an 8 B model's 14336² down-projection Hessian
    was factored again for each of its 4 chunks, a minute each) and give the whole tensor's
    codes; the kept factor goes with the statistics it came from."""
    import gc

    from workbench.quant.methods import gptq as mod
    calls = []
    real = mod.inverse_cholesky_upper
    monkeypatch.setattr(mod, "inverse_cholesky_upper", lambda H: calls.append(1) or real(H))
    stats, _ = _stats(64, seed=3)
    w = np.random.default_rng(4).normal(size=(30, 64)).astype(np.float32)
    scheme = get_scheme("int4-g32")
    m = get_method("gptq")
    whole = scheme.dequantize(m.quantize(w, scheme, stats)).reshape(30, 64)
    assert len(calls) == 1
    parts = [scheme.dequantize(m.quantize(w[r:r + 10], scheme, stats)).reshape(10, 64)
             for r in (0, 10, 20)]
    assert len(calls) == 1
    assert np.array_equal(np.concatenate(parts), whole)
    other, _ = _stats(64, seed=5)                 # another Hessian: factored anew
    m.quantize(w, scheme, other)
    assert len(calls) == 2
    assert mod.GPTQ._factor_cache is not None
    del other
    gc.collect()
    assert mod.GPTQ._factor_cache is None

"""The Q3_K/Q6_K numba quantize kernel (kernels/kquant_sym.py) against its numpy reference
(workbench/schemes/ggml/sym_k.py): the same bytes, block for block, on ordinary and hostile
weights, with and without importance weights; the same refusals; and the search beats the
one-pass scale choice it replaced on real weights."""

from __future__ import annotations

import numpy as np
import pytest

from kernels import cpu_ops
from kernels.host import readonly
from kernels.kquant_sym import KINDS, sym_k_encode
from workbench.quant import accel
from workbench.core.errors import WorkbenchError
from workbench.quant.methods import ggml_weighted
from workbench.schemes import get_scheme

TYPES = ["q3_k", "q6_k"]


def _kernel(name, w, qw=None):
    s = get_scheme(name)
    spec = accel.spec_for(s)
    cands, divs, iters, rounds = spec.search
    rows, cols = w.shape
    blocks = np.empty((rows, cols // 256 * s.type_size), np.uint8)
    flags = np.empty(rows, np.uint8)
    q = np.ones((1, 1), np.float32) if qw is None else np.ascontiguousarray(qw, np.float32)
    # read-only, as kernels.cpu_ops passes them: the variant the warm-up compiled
    sym_k_encode(readonly(np.ascontiguousarray(w)), readonly(q), qw is not None, KINDS[spec.ggml_name], np.array(cands, np.float32),
                 np.array(divs, np.float32), iters, rounds, blocks, flags)
    return blocks, flags


def _ref(name, w, qw=None):
    s = get_scheme(name)
    q = None if qw is None else np.broadcast_to(qw, w.shape).reshape(-1, 256)
    return s.encode(w.reshape(-1, 256), q).view(np.uint8).reshape(w.shape[0], -1)


def _cases():
    rng = np.random.default_rng(7)
    mixed = (rng.standard_normal((16, 768)) * np.exp(rng.uniform(-12, 12, (16, 768)))
             ).astype(np.float32)
    mixed[:, :16] = 0.0
    mixed[:, 256:300] *= np.float32(1e-20)
    hostile = rng.standard_normal((14, 512)).astype(np.float32)
    hostile[0, :256] = np.float32(7e-41)                 # subnormal float32
    hostile[1] = np.float32(-0.25)                       # constant, negative
    hostile[2] = np.abs(hostile[2])                      # one-signed
    hostile[3] = -np.abs(hostile[3])
    hostile[4] *= np.float32(1e-6)                       # float16 super-scale in subnormals
    hostile[5] *= np.float32(3e-8)
    hostile[6, 17] = 60.0                                # an outlier
    hostile[7, ::2] = 0.0
    hostile[8, :128] = np.float32(-0.0)
    hostile[9, 16:32] *= np.float32(1e-33)               # a sub-block below the sub-block eps
    return {
        "normal": rng.standard_normal((24, 512)).astype(np.float32),
        "zeros": np.zeros((3, 256), np.float32),
        "neg_zeros": np.full((2, 256), -0.0, np.float32),
        "tiny": (rng.standard_normal((4, 256)) * 1e-30).astype(np.float32),
        "subnormal": (rng.standard_normal((4, 256)) * 1e-40).astype(np.float32),
        "below_eps": (rng.standard_normal((2, 256)) * 1e-16).astype(np.float32),
        "const": np.full((3, 256), 0.3, np.float32),
        "heavy": rng.standard_t(2, (16, 1024)).astype(np.float32),
        "ints": rng.integers(-3, 4, (8, 256)).astype(np.float32),
        "mixed": mixed,
        "large": (rng.standard_normal((4, 256)) * 1e4).astype(np.float32),
        "hostile": hostile,
    }


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("case", list(_cases()))
def test_kernel_bit_identical(name, case):
    w = _cases()[case]
    blocks, flags = _kernel(name, w)
    assert not flags.any()
    assert np.array_equal(blocks, _ref(name, w))


@pytest.mark.parametrize("name", TYPES)
def test_public_api_uses_kernel(name):
    s = get_scheme(name)
    assert accel.has_kernel(s, "quantize", "cpu")
    w = _cases()["heavy"]
    assert cpu_ops.sym_k_blocks(accel.spec_for(s), w) is not None
    qt = accel.quantize(s, w, backend="cpu")
    assert np.array_equal(qt.arrays["blocks"].reshape(w.shape[0], -1), _ref(name, w))


@pytest.mark.parametrize("name", TYPES)
def test_overflow_flagged_and_refused_alike(name):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 512)).astype(np.float32)
    w[1] *= np.float32(1e37)                    # the float16 super-scale overflows
    _, flags = _kernel(name, w)
    assert list(flags) == [0, 1, 0, 0]
    s = get_scheme(name)
    with pytest.raises(WorkbenchError) as k:
        accel.quantize(s, w, backend="cpu")
    with pytest.raises(WorkbenchError) as r:
        s.quantize(w)
    assert str(k.value) == str(r.value)


@pytest.mark.parametrize("name", TYPES)
def test_nonfinite_flagged(name):
    w = np.ones((3, 256), np.float32)
    w[1, 7] = np.nan
    w[2, 200] = -np.inf
    _, flags = _kernel(name, w)
    assert list(flags) == [0, 2, 2]
    with pytest.raises(WorkbenchError, match="NaN/Inf"):
        accel.quantize(get_scheme(name), w, backend="cpu")


@pytest.mark.parametrize("name", TYPES)
def test_weighted_kernel_equals_weighted_reference(name):
    s = get_scheme(name)
    rng = np.random.default_rng(5)
    w = _cases()["hostile"]
    qw = rng.gamma(0.5, 1.0, 512).astype(np.float32)
    qw[:40] = 0.0                                       # dead input channels (a whole sub-block)
    qw[100:140] = 1e-30
    blocks, flags = _kernel(name, w, qw[None])
    assert not flags.any()
    assert np.array_equal(blocks, _ref(name, w, qw))
    # per-row importance, and the public weighted path runs the same bytes
    q2 = rng.uniform(0, 3, w.shape).astype(np.float32)
    blocks, flags = _kernel(name, w, q2)
    assert not flags.any()
    assert np.array_equal(blocks, _ref(name, w, q2))
    x = w.reshape(-1, 256)
    got = ggml_weighted.weighted_encode(s, x, q2.reshape(-1, 256))
    assert np.array_equal(got.reshape(blocks.shape), blocks)
    assert cpu_ops.sym_k_blocks(accel.spec_for(s), x, q2.reshape(-1, 256)) is not None

    # importance matters: the weighted error it minimises is below the unweighted encoder's
    def werr(raw):
        y = s.decode(raw.reshape(-1).view(s.block_dtype)).reshape(w.shape).astype(np.float64)
        return float((q2 * (y - w) ** 2).sum())
    assert werr(blocks) < werr(_ref(name, w))


@pytest.mark.parametrize("name", TYPES)
def test_search_beats_one_pass_scales(name):
    """On real-looking weights (heavy-tailed rows of mixed scale) the searched sub-block and
    super-block scales give a lower squared error than rounding the best float scales once
    (the symmetric_search + super_scale_codes quantizer this search replaced)."""
    from workbench.schemes.ggml import kcommon as kc
    from workbench.schemes.ggml.common import pow2_normalize
    from workbench.schemes.ggml.search import symmetric_search
    rng = np.random.default_rng(3)
    w = (rng.standard_t(4, (64, 512)) * rng.uniform(0.01, 1, (64, 1))).astype(np.float32)
    x = w.reshape(-1, 256)
    s = get_scheme(name)
    y = s.decode(s.encode(x))
    nmax, lev = (4, 32) if name == "q3_k" else (32, 128)
    xn, e = pow2_normalize(x)
    sub = xn.reshape(-1, 16)
    wt = kc.k4_weights(sub) if name == "q3_k" else sub * sub
    sc, _ = symmetric_search(sub, wt, nmax, range(-9, 10), refine=2 if name == "q3_k" else 0)
    _, d_eff, codes = kc.super_scale_codes(sc.reshape(-1, 16), e, lev, signed=True)
    dl = d_eff[:, None] * codes.astype(np.float32)
    L = kc.requantize(xn.reshape(-1, 16, 16), dl, -nmax, nmax - 1)
    y0 = np.ldexp(dl[..., None] * L, e[:, None, None]).reshape(x.shape)
    err, err0 = float(((y - x) ** 2).sum()), float(((y0 - x) ** 2).sum())
    assert err < 0.99 * err0


@pytest.mark.parametrize("name", TYPES)
def test_kernel_bit_identical_on_minilm(minilm, name):
    """Real weights (MiniLM FFN-down rows of 1536 = 6 super-blocks), plain and weighted by a
    per-column importance of the spread an imatrix has."""
    w = np.ascontiguousarray(minilm.read_matrix("encoder.layer.1.output.dense.weight")[:48],
                             np.float32)
    blocks, flags = _kernel(name, w)
    assert not flags.any()
    assert np.array_equal(blocks, _ref(name, w))
    qw = np.exp(np.random.default_rng(2).normal(0, 1.5, w.shape[1])).astype(np.float32)
    blocks, flags = _kernel(name, w, qw[None])
    assert not flags.any()
    assert np.array_equal(blocks, _ref(name, w, qw))


def test_float16_rounding_matches_numpy():
    """The kernel's float16 rounding of the scales (kquant_sym._f16_bits) against numpy's
    float32 -> float16 cast: every float16 value, the ties half an ulp either side, their
    float32 neighbours, random float32 bit patterns and wide-range values."""
    from numba import njit

    from kernels.kquant_sym import _f16_bits

    @njit
    def conv(a, out):
        for i in range(a.shape[0]):
            out[i] = _f16_bits(a[i])

    rng = np.random.default_rng(0)
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    h = h[np.isfinite(h)].astype(np.float32)
    rnd = rng.integers(0, 2 ** 32, 300_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    wide = (rng.standard_normal(300_000) * np.exp(rng.uniform(-25, 12, 300_000))).astype(np.float32)
    x = np.concatenate([h, h * np.float32(1 + 2 ** -11), h * np.float32(1 - 2 ** -12),
                        np.nextafter(h, np.float32(np.inf)), np.nextafter(h, np.float32(-np.inf)),
                        rnd[np.isfinite(rnd)], wide,
                        np.array([65519.996, 65520, -65520, np.inf, -np.inf, -0.0], np.float32)])
    with np.errstate(over="ignore"):
        ref = x.astype(np.float16).view(np.uint16).astype(np.int64)
    out = np.empty(x.shape[0], np.int64)
    conv(x, out)
    assert np.array_equal(out, ref)

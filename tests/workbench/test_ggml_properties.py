"""Property tests (hypothesis) of the GGML schemes: random shapes and values, zeros, constant
rows, huge and tiny magnitudes, NaN/Inf."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from workbench.core.errors import WorkbenchError
from workbench.schemes import get_scheme
from workbench.schemes.ggml import GGML_SCHEMES

SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# worst relative error of one block versus its largest |w| (a loose, format-level bound)
BLOCK_BOUND = {"q2_k": 0.75, "q3_k": 0.5, "q4_0": 0.13, "q4_1": 0.07, "iq4_nl": 0.2,
               "q4_k": 0.15, "q5_0": 0.07, "q5_1": 0.035, "q5_k": 0.08, "q6_k": 0.04,
               "q8_0": 0.0081, "mxfp4": 0.25, "tq1_0": 0.501, "tq2_0": 0.501,
               "iq4_xs": 0.25, "iq3_xxs": 0.8, "iq3_s": 0.5, "iq2_xxs": 0.9, "iq2_xs": 0.9,
               "iq2_s": 0.9, "nvfp4": 0.25, "iq1_s": 1.0, "iq1_m": 1.0}
FP16_TINY = 6.2e-5   # below this, float16 block scales lose relative precision
# float16 scales of small blocks are subnormal (absolute step 2**-24): an absolute error term
# of one such step times the largest code product (super-scale code x weight code)
FP16_ABS = {"q2_k": 15 * 3 + 15, "q3_k": 32 * 4, "q4_k": 63 * 15 + 63, "q5_k": 63 * 31 + 63,
            "q6_k": 128 * 32, "q4_0": 8, "q4_1": 16, "q5_0": 16, "q5_1": 32, "q8_0": 127,
            "iq4_nl": 127, "mxfp4": 0, "tq1_0": 1, "tq2_0": 1, "iq4_xs": 32 * 127,
            "iq3_xxs": 31 * 16, "iq3_s": 31 * 15, "iq2_xxs": 43 * 4, "iq2_xs": 43 * 4,
            "iq2_s": 43 * 4, "iq1_s": 15 * 2, "iq1_m": 15 * 2,
            "nvfp4": 6 * 2 ** 15}  # NVFP4: no float16; UE4M3 subnormal scales step 2^-9 (x6)


@st.composite
def weights(draw, qk: int):
    rows = draw(st.integers(1, 3))
    nblk = draw(st.integers(1, 2 if qk == 256 else 4))
    kind = draw(st.sampled_from(["normal", "uniform", "zeros", "constant", "spiky", "sparse"]))
    mag = draw(st.sampled_from([1.0, 1e-3, 1e3, 1e-6, 30.0]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    shape = (rows, nblk * qk)
    if kind == "normal":
        w = rng.standard_normal(shape)
    elif kind == "uniform":
        w = rng.uniform(-1, 1, shape)
    elif kind == "zeros":
        w = np.zeros(shape)
    elif kind == "constant":
        w = np.full(shape, draw(st.sampled_from([1.0, -1.0, 0.37])))
    elif kind == "spiky":
        w = rng.standard_normal(shape) * 0.01
        w.flat[rng.integers(0, w.size, 3)] = rng.choice([-1, 1], 3) * 5
    else:
        w = rng.standard_normal(shape) * (rng.random(shape) < 0.1)
    return (w * mag).astype(np.float32)


@pytest.mark.parametrize("name", GGML_SCHEMES)
def test_round_trip_properties(name):
    s = get_scheme(name)

    @SETTINGS
    @given(weights(s.block_size))
    def check(w):
        if name == "nvfp4" and np.abs(w).max() > 2688:      # its UE4M3 scale limit: refused
            with pytest.raises(WorkbenchError, match="too large"):
                s.quantize(w)
            return
        qt = s.quantize(w)
        raw = qt.arrays["blocks"]
        assert raw.dtype == np.uint8
        assert raw.shape == (w.shape[0], w.shape[1] // s.block_size * s.type_size)
        back = s.dequantize(qt)
        assert back.shape == w.shape and np.all(np.isfinite(back))
        # gguf reads exactly what we wrote
        ref = gguf.quants.dequantize(raw, s.ggml_type)
        assert np.array_equal(ref.view(np.uint32), back.view(np.uint32))
        # per block: error bounded relative to the block's largest magnitude
        blocks_w = w.reshape(-1, s.block_size)
        amax = np.abs(blocks_w).max(axis=1)
        err = np.abs(back.reshape(-1, s.block_size) - blocks_w).max(axis=1)
        ok = amax >= FP16_TINY
        bound = BLOCK_BOUND[name] * amax * 1.0001 + FP16_ABS[name] * 2.0 ** -24
        assert np.all(err[ok] <= bound[ok]), (err / np.maximum(amax, 1e-30))[ok].max()
        assert np.all(err[~ok] <= 2 * amax[~ok] + 1e-7)
        if not w.any():
            assert not back.any()

    check()


@pytest.mark.parametrize("name", ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0"])
def test_quantize_bytes_equal_gguf_property(name):
    s = get_scheme(name)

    @SETTINGS
    @given(arrays(np.float32, st.tuples(st.integers(1, 3), st.sampled_from([32, 64, 96])),
                  elements=st.floats(-1e4, 1e4, width=32, allow_nan=False)))
    def check(w):
        # where a block's scale is so small that 1/d overflows float32 the reference's codes
        # come from casting inf/NaN to uint8 (undefined in C too): outside the contract
        amax = np.abs(w.reshape(-1, 32)).max(axis=1)
        assume(np.all((amax == 0) | (amax > 1e-30)))
        ours = s.quantize(w).arrays["blocks"]
        ref = gguf.quants.quantize(w, s.ggml_type).reshape(-1, s.type_size)
        if s.zero_when_worse:
            # the one deviation (an affine type's float16 min): a block whose reference
            # decoding is further from its weights than zeros are is stored as zeros
            x = w.reshape(-1, s.block_size).astype(np.float64)
            dec = gguf.quants.dequantize(ref, s.ggml_type).reshape(x.shape).astype(np.float64)
            worse = ((dec - x) ** 2).sum(axis=1) > (x * x).sum(axis=1)
            ref[worse] = gguf.quants.quantize(np.zeros((1, s.block_size), np.float32),
                                              s.ggml_type).reshape(-1)
        assert np.array_equal(ours, ref.reshape(ours.shape))

    check()


@pytest.mark.parametrize("name", GGML_SCHEMES)
def test_nonfinite_always_refused(name):
    s = get_scheme(name)

    @SETTINGS
    @given(st.integers(0, s.block_size * 2 - 1), st.sampled_from([np.nan, np.inf, -np.inf]))
    def check(pos, bad):
        w = np.zeros((1, 2 * s.block_size), np.float32)
        w[0, pos] = bad
        with pytest.raises(WorkbenchError):
            s.quantize(w, tensor="t")

    check()

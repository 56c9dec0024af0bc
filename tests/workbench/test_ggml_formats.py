"""GGML block formats: layouts, identity with the `gguf` package, round trips, error bounds.

Every test loops over the GGML schemes in the registry, so a new format is tested as soon as
it is registered.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from workbench.core.errors import WorkbenchError
from workbench.schemes import get_scheme, list_schemes
from workbench.schemes.ggml import GGML_SCHEMES, GGMLScheme

ALL = list(GGML_SCHEMES)
LEGACY = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0"]          # gguf has quantize for these
KQUANTS = ["q2_k", "q3_k", "q4_k", "q5_k", "q6_k"]

# DESIGN.md's table (+ IQ4_NL from ggml-common.h): weights/block, bytes/block, bits/weight
TABLE = {"q4_0": (32, 18, 4.5), "q4_1": (32, 20, 5.0), "q5_0": (32, 22, 5.5),
         "q5_1": (32, 24, 6.0), "q8_0": (32, 34, 8.5), "q2_k": (256, 84, 2.625),
         "q3_k": (256, 110, 3.4375), "q4_k": (256, 144, 4.5), "q5_k": (256, 176, 5.5),
         "q6_k": (256, 210, 6.5625), "iq4_nl": (32, 18, 4.5), "mxfp4": (32, 17, 4.25),
         "tq1_0": (256, 54, 1.6875), "tq2_0": (256, 66, 2.0625), "iq4_xs": (256, 136, 4.25),
         "iq3_xxs": (256, 98, 3.0625), "iq3_s": (256, 110, 3.4375),
         "iq2_xxs": (256, 66, 2.0625), "iq2_xs": (256, 74, 2.3125),
         "iq2_s": (256, 82, 2.5625), "nvfp4": (64, 36, 4.5),
         "iq1_s": (256, 50, 1.5625), "iq1_m": (256, 56, 1.75)}

# relative RMSE on N(0, 1) weights, a bound per bit width (measured values are ~10% lower)
REL_RMSE_GAUSS = {"q2_k": 0.33, "q3_k": 0.17, "q4_0": 0.10, "q4_1": 0.09, "iq4_nl": 0.085,
                  "q4_k": 0.08, "q5_0": 0.05, "q5_1": 0.045, "q5_k": 0.042, "q6_k": 0.021,
                  "q8_0": 0.007, "mxfp4": 0.125, "tq1_0": 0.85, "tq2_0": 0.85,
                  "iq4_xs": 0.085, "iq3_xxs": 0.2, "iq3_s": 0.145, "iq2_xxs": 0.36, "iq2_xs": 0.32,
                  "iq2_s": 0.3, "nvfp4": 0.11, "iq1_s": 0.5, "iq1_m": 0.46}


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def random_valid_blocks(scheme: GGMLScheme, n: int, rng) -> np.ndarray:
    """Random block bytes with sane float16 scales (finite, modest): uint8 (1, n*type_size)."""
    raw = rng.integers(0, 256, size=n * scheme.type_size, dtype=np.uint8)
    blocks = raw.view(scheme.block_dtype).copy()
    for f in scheme.block_dtype.names:
        if scheme.block_dtype[f] == np.dtype("<f2"):
            vals = rng.standard_normal(n) * rng.choice([1e-4, 1e-2, 1.0], size=n)
            vals[rng.random(n) < 0.05] = 0.0
            blocks[f] = vals.astype(np.float16)
    return blocks.view(np.uint8).reshape(1, -1)


def test_registry_has_every_ggml_type():
    names = list_schemes()
    for n in ALL:
        assert n in names
        s = get_scheme(n)
        assert isinstance(s, GGMLScheme)
        assert s.ggml_type == gguf.GGMLQuantizationType[n.upper()]


@pytest.mark.parametrize("name", ALL)
def test_layout_matches_ggml(name):
    s = get_scheme(name)
    qk, size, bpw = TABLE[name]
    assert s.block_size == qk
    assert s.block_dtype.itemsize == size == s.type_size
    assert (qk, size) == gguf.GGML_QUANT_SIZES[s.ggml_type]
    assert s.bits_per_weight() == bpw
    assert s.nbytes((7, 4 * qk)) == 7 * 4 * size
    assert s.bits_per_weight((3, qk)) == bpw


@pytest.mark.parametrize("name", ALL)
def test_dequantize_is_bit_identical_to_gguf_on_random_bytes(name):
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    s = get_scheme(name)
    raw = random_valid_blocks(s, 2000, rng)
    ours = s.dequantize_blocks(raw)
    ref = gguf.quants.dequantize(raw, s.ggml_type)
    assert ours.shape == ref.shape == (1, 2000 * s.block_size)
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(_bits(ours), _bits(ref))


@pytest.mark.parametrize("name", ALL)
def test_round_trip_storage_contract(name):
    rng = np.random.default_rng(1)
    s = get_scheme(name)
    w = rng.standard_normal((6, 2 * s.block_size)).astype(np.float32)
    qt = s.quantize(w)
    assert list(qt.arrays) == ["blocks"]
    blocks = qt.arrays["blocks"]
    assert blocks.dtype == np.uint8 and blocks.shape == (6, 2 * s.type_size)
    assert qt.nbytes == s.nbytes(w.shape) == 6 * 2 * s.type_size
    assert qt.bits_per_weight == TABLE[name][2]
    back = s.dequantize(qt)
    assert back.shape == w.shape and back.dtype == np.float32
    # the stored bytes are what gguf reads, and they decode to the same values
    np.testing.assert_array_equal(_bits(gguf.quants.dequantize(blocks, s.ggml_type)), _bits(back))
    # a second pass over the dequantized values is a fixed point (up to rounding of rounding)
    again = s.dequantize(s.quantize(back))
    assert np.sqrt(np.mean((again - back) ** 2)) <= 0.5 * np.sqrt(np.mean((back - w) ** 2)) + 1e-7


@pytest.mark.parametrize("name", LEGACY)
def test_quantize_bytes_identical_to_gguf(name):
    # Identical rounding order as ggml's quantize_row_*_ref in float32. llama.cpp's C compiler
    # may fuse `x*id + 8.5` into an FMA on some targets; gguf's numpy reference never does and
    # neither do we, so against gguf all blocks must match (the issue allows > 99.9 %).
    s = get_scheme(name)
    rng = np.random.default_rng(7)
    w = np.concatenate([
        rng.standard_normal((64, 1024)),
        rng.standard_normal((8, 1024)) * 1e-3,
        rng.uniform(-1, 1, (8, 1024)),
        np.round(rng.standard_normal((8, 1024)) * 8) / 8,        # many exact ties
        np.zeros((2, 1024)),
    ]).astype(np.float32)
    w[-1, :32] = 3.0   # constant block
    ours = s.quantize(w).arrays["blocks"].reshape(-1, s.type_size)
    ref = gguf.quants.quantize(w, s.ggml_type).reshape(-1, s.type_size)
    same = float(np.mean(np.all(ours == ref, axis=1)))
    assert same > 0.999, f"{name}: {same:.6f} of blocks identical"
    assert same == 1.0, f"{name}: {same:.6f} of blocks identical (numpy never fuses)"


@pytest.mark.parametrize("name", ALL)
def test_error_bound_on_gaussian_weights(name):
    rng = np.random.default_rng(3)
    s = get_scheme(name)
    w = rng.standard_normal((64, 1024)).astype(np.float32)
    back = s.dequantize(s.quantize(w))
    rel = float(np.sqrt(np.mean((back - w) ** 2) / np.mean(w ** 2)))
    assert rel < REL_RMSE_GAUSS[name], f"{name}: relative RMSE {rel:.4f}"


def test_more_bits_less_error():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((32, 1024)).astype(np.float32)

    def err(n):
        s = get_scheme(n)
        return float(np.mean((s.dequantize(s.quantize(w)) - w) ** 2))

    chain = ["q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "q8_0"]
    errs = [err(n) for n in chain]
    assert errs == sorted(errs, reverse=True), dict(zip(chain, errs))
    assert err("q4_1") < err("q4_0") and err("q5_1") < err("q5_0")
    assert err("q4_k") < err("q4_0")


@pytest.mark.parametrize("name", LEGACY)
def test_legacy_max_error_is_within_one_step(name):
    s = get_scheme(name)
    rng = np.random.default_rng(5)
    w = rng.standard_normal((16, 256)).astype(np.float32)
    back = s.dequantize(s.quantize(w))
    blocks = w.reshape(-1, 32)
    step = (blocks.max(1) - blocks.min(1)) / (2 ** int(s.nominal_bits) - 1) if name.endswith("_1") \
        else np.abs(blocks).max(1) / {"q4_0": 8, "q5_0": 16, "q8_0": 127}[name]
    err = np.abs(back - w).reshape(-1, 32).max(1)
    # round-to-nearest is within half a step; the positive end of the _0 types clips at one step
    assert np.all(err <= step * 1.01 + 1e-6)


LATTICE = ("iq2_xxs", "iq2_xs", "iq2_s", "iq1_s", "iq1_m")


@pytest.mark.parametrize("name", ALL)
def test_zeros_and_constant_rows(name):
    s = get_scheme(name)
    qk = s.block_size
    z = np.zeros((2, qk), np.float32)
    assert np.array_equal(s.dequantize(s.quantize(z)), z)
    for c in (0.75, -0.75):
        w = np.full((3, 2 * qk), c, np.float32)
        back = s.dequantize(s.quantize(w))
        if name in LATTICE:     # no grid point has 8 equal coordinates: a bound on the RMS
            assert np.sqrt(np.mean((back - c) ** 2)) <= 0.4 * abs(c), (name, c, back[0, :4])
            continue
        assert np.all(np.abs(back - c) <= 0.07 * abs(c)), (name, c, back[0, :4])


@pytest.mark.parametrize("name", ALL)
def test_ineligible_row_length_is_refused_not_padded(name):
    s = get_scheme(name)
    bad = (4, s.block_size + 16)
    assert s.ineligible_reason(bad) is not None
    assert not s.can_take(bad)
    with pytest.raises(WorkbenchError, match="multiple"):
        s.quantize(np.ones(bad, np.float32), tensor="layer.w")
    # GGML rows are the innermost dimension: (E, 16, 2*QK) is fine, (2, QK, 16) is not
    assert s.can_take((3, 16, 2 * s.block_size))
    assert not s.can_take((2, s.block_size, 16))


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_is_a_clear_error(name, bad):
    s = get_scheme(name)
    w = np.ones((2, s.block_size), np.float32)
    w[1, 3] = bad
    with pytest.raises(WorkbenchError, match="NaN/Inf") as ei:
        s.quantize(w, tensor="blk.0.attn_q.weight")
    assert "blk.0.attn_q.weight" in str(ei.value)


@pytest.mark.parametrize("name", ALL)
def test_weights_too_large_for_fp16_scales_are_a_clear_error(name):
    s = get_scheme(name)
    w = np.ones((1, s.block_size), np.float32)
    w[0, 0] = 3e38
    if not s.scale_fields and s.name != "nvfp4":   # MXFP4: an E8M0 scale takes any float32
        back = s.dequantize(s.quantize(w))
        assert np.isfinite(back).all() and abs(back[0, 0] / w[0, 0] - 1) < 0.25
        return
    with pytest.raises(WorkbenchError, match="too large") as ei:
        s.quantize(w, tensor="model.embed_tokens.weight")
    assert "model.embed_tokens.weight" in str(ei.value)


@pytest.mark.parametrize("name", ALL)
def test_large_but_representable_magnitudes(name):
    s = get_scheme(name)
    rng = np.random.default_rng(6)
    big = 300 if name == "nvfp4" else 1000          # NVFP4's limit: max|w| 2688
    w = (rng.standard_normal((4, s.block_size)) * big).astype(np.float32)
    back = s.dequantize(s.quantize(w))
    assert np.all(np.isfinite(back))
    rel = float(np.sqrt(np.mean((back - w) ** 2) / np.mean(w ** 2)))
    assert rel < REL_RMSE_GAUSS[name] * 1.6


@pytest.mark.parametrize("name", ALL)
def test_tiny_magnitudes_quantize_to_small_values(name):
    # below float16's smallest scale (6e-8) a block becomes (near) zero: an absolute error
    # bounded by the weights themselves, never garbage
    s = get_scheme(name)
    rng = np.random.default_rng(8)
    for scale in (1e-9, 1e-30):
        w = (rng.standard_normal((2, s.block_size)) * scale).astype(np.float32)
        back = s.dequantize(s.quantize(w))
        assert np.all(np.isfinite(back))
        assert np.max(np.abs(back - w)) <= 2 * np.max(np.abs(w)) + 1e-7


def test_empty_tensor():
    s = get_scheme("q4_k")
    qt = s.quantize(np.zeros((0, 256), np.float32))
    assert qt.nbytes == 0
    assert s.dequantize(qt).shape == (0, 256)

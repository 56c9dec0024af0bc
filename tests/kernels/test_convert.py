"""kernels.convert widens float16/bfloat16 to exactly numpy's float32 bits, every code."""

import numpy as np
import pytest

from kernels import convert
from workbench.formats.dtypes import FAST_WIDEN_MIN, to_float32


def test_every_float16_code_matches_numpy():
    u = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    want = u.view(np.float16).astype(np.float32).view(np.uint32)
    assert np.array_equal(convert.f16_to_f32(u).view(np.uint32), want)
    assert np.array_equal(convert.f16_to_f32(u.view(np.float16)).view(np.uint32), want)


def test_every_bfloat16_code_is_the_high_half():
    u = np.arange(65536, dtype=np.uint32).astype(np.uint16).reshape(256, 256)
    got = convert.bf16_to_f32(u)
    assert got.shape == (256, 256)
    assert np.array_equal(got.view(np.uint32), u.astype(np.uint32) << 16)


def test_to_float32_takes_the_kernel_path_on_large_strided_input():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((FAST_WIDEN_MIN // 64, 256)).astype(np.float16)[:, ::2]   # strided
    assert a.size >= FAST_WIDEN_MIN // 2
    big = np.concatenate([a, a], axis=1)
    assert big.size >= FAST_WIDEN_MIN
    assert np.array_equal(to_float32(big, "F16"), big.astype(np.float32))
    assert np.array_equal(to_float32(a, "F16"), a.astype(np.float32))


def test_widening_into_a_given_buffer_writes_that_buffer():
    u = np.arange(65536, dtype=np.uint32).astype(np.uint16).reshape(256, 256)
    out = np.full((256, 256), np.nan, np.float32)
    assert convert.f16_to_f32(u, out=out) is out
    assert np.array_equal(out.view(np.uint32), u.view(np.float16).astype(np.float32).view(np.uint32))
    assert convert.bf16_to_f32(u, out=out) is out
    assert np.array_equal(out.view(np.uint32), u.astype(np.uint32) << 16)
    with pytest.raises(ValueError):
        convert.f16_to_f32(u, out=np.empty(10, np.float32))           # wrong size
    with pytest.raises(ValueError):
        convert.f16_to_f32(u, out=np.empty((256, 256), np.float64))   # wrong dtype
    with pytest.raises(ValueError):
        convert.f16_to_f32(u[:, :128], out=np.empty((256, 256), np.float32)[:, :128])  # strided

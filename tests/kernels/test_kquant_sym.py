"""kernels/kquant_sym.py (Q6_K quantize kernel) is bit-identical to the numpy reference
workbench.schemes.ggml.q6_k (same search), on ordinary and edge-value rows; rows that need
the reference's decision (float16 overflow) are flagged, NaN/Inf rows are flagged too."""

import numpy as np
import pytest

from kernels.kquant_sym import q6k_encode
from workbench import accel
from workbench.errors import WorkbenchError
from workbench.schemes import get_scheme


def _kernel(w):
    rows, cols = w.shape
    blocks = np.empty((rows, cols // 256 * 210), np.uint8)
    flags = np.empty(rows, np.uint8)
    q6k_encode(w, blocks, flags)
    return blocks, flags


def _ref(w):
    return get_scheme("q6_k").encode(w.reshape(-1, 256)).view(np.uint8).reshape(w.shape[0], -1)


def _cases():
    rng = np.random.default_rng(7)
    mixed = (rng.standard_normal((16, 768)) * np.exp(rng.uniform(-12, 12, (16, 768)))
             ).astype(np.float32)
    mixed[:, :16] = 0.0
    mixed[:, 256:300] *= np.float32(1e-20)
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
    }


@pytest.mark.parametrize("case", list(_cases()))
def test_q6k_kernel_bit_identical(case):
    w = _cases()[case]
    blocks, flags = _kernel(w)
    assert not flags.any()
    assert np.array_equal(blocks, _ref(w))


def test_q6k_overflow_flagged_and_public_api_falls_back():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 512)).astype(np.float32)
    w[1] *= np.float32(1e37)                    # the float16 super-scale overflows
    _, flags = _kernel(w)
    assert list(flags) == [0, 1, 0, 0]
    w[1] = rng.standard_normal(512).astype(np.float32)
    qt = accel.quantize(get_scheme("q6_k"), w, backend="cpu")
    assert np.array_equal(qt.arrays["blocks"].reshape(4, -1), _ref(w))


def test_q6k_nonfinite_flagged():
    w = np.ones((3, 256), np.float32)
    w[1, 7] = np.nan
    w[2, 200] = -np.inf
    _, flags = _kernel(w)
    assert list(flags) == [0, 2, 2]
    with pytest.raises(WorkbenchError):
        accel.quantize(get_scheme("q6_k"), w, backend="cpu")

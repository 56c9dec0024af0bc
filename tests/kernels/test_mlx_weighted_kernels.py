"""The numba kernels of the MLX importance-weighted search (kernels/mlx_weighted.py) give the
bytes of its numpy reference (workbench.quant.methods.mlx_weighted.affine_ref / fp_ref) bit for
bit: on the demo model's real weights and on hostile groups (constant, zeros, signed zeros,
tiny, huge ranges, one outlier, ties of the codes, weights near float16's limit and, in
bfloat16, near float32's), for every bits / group / dtype and every microscaling mode; the
kernels' rounding equals reference.round_to bit for bit (ties, subnormals, overflow, NaN
payloads); weighted_quantize uses the kernel, and the reference only without numba (said)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import workbench as qw
from workbench.quant.methods import mlx_weighted as M
from workbench.schemes import get_scheme
from workbench.schemes.mlx import reference as ref
from workbench.schemes.mlx.schemes import AFFINE_BITS, AFFINE_GROUPS, DTYPES, FP_MODES

from kernel_testutil import same_bits

K = M.kernels()
F = np.float32


@pytest.fixture(scope="module")
def demo():
    """Real weights: two demo-model matrices (cut to 64 rows), and heavy-tailed importances."""
    model = qw.open_model()
    out = []
    for i, n in enumerate(["model.layers.1.self_attn.q_proj.weight",
                           "model.layers.2.mlp.down_proj.weight"]):
        w = np.asarray(model.read_matrix(n), F)[:64, :256]
        rng = np.random.default_rng(i)
        imp = (rng.lognormal(0, 2, w.shape[1]) + 1e-6).astype(F)
        out.append((w, imp))
    return out


def _hostile(cols: int = 256, big: float = 6e4) -> np.ndarray:
    """Rows of hostile groups (every group size divides 32 of them: a row is one kind)."""
    rng = np.random.default_rng(7)
    rows = [np.zeros(cols), np.full(cols, -0.0), np.full(cols, 0.3), np.full(cols, -big),
            np.tile([0.0, -0.0], cols // 2), rng.standard_normal(cols) * 1e-30,
            rng.standard_normal(cols) * 1e-6, rng.uniform(-big, big, cols),
            np.tile([-big, big], cols // 2)]
    r = rng.standard_normal(cols) * 0.01
    r[::32] = 5.0                                     # one outlier per group of 32
    rows.append(r)
    rows.append(np.tile(np.arange(16) * 0.125 - 1.0, cols // 16))   # codes exactly on a grid
    rows.append(np.tile(np.arange(16) * 0.125 + 0.0625, cols // 16))  # halfway between
    rows.append(np.abs(rng.standard_normal(cols)))    # all positive: lo > 0
    rows.append(-np.abs(rng.standard_normal(cols)))   # all negative: hi < 0
    r = np.abs(rng.standard_normal(cols))
    r[::8] = 0.0                                       # lo exactly zero
    rows.append(r)
    return np.stack(rows).astype(F)


def _importances(cols: int):
    rng = np.random.default_rng(3)
    dead = np.full(cols, 1.0, F)
    dead[::3] = 1e-6                                   # dead channels (importance's floor)
    signed = (rng.lognormal(0, 1, cols) * rng.choice([-1, 1], cols)).astype(F)
    # the last: no early end of a losing candidate's sum (it needs every importance >= 0)
    return [rng.lognormal(0, 3, cols).astype(F), np.ones(cols, F), dead, signed]


def _same(a, b) -> bool:
    return all(same_bits(np.asarray(x), np.asarray(y)) for x, y in zip(a, b))


def _affine_both(s, w, imp):
    x = ref.round_to(w, s.dtype) if s.dtype != "F32" else w
    return M.affine_ref(s, x, imp), M._affine_kernel(K, s, x, imp)


def _fp_both(s, w, imp):
    return M.fp_ref(s, w, imp), M._fp_kernel(K, s, w, imp)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bits", AFFINE_BITS)
def test_affine_search_kernel_is_the_reference(demo, bits, dtype):
    for group in AFFINE_GROUPS:
        s = get_scheme(f"mlx-q{bits}-g{group}").for_dtype(dtype)
        for w, imp in demo:
            a, b = _affine_both(s, w, imp)
            assert _same(a, b), (s.name, "demo")
        big = 6e4 if s.scale_dtype == "F16" else 1.7e38     # float16's limit; bfloat16: float32's
        w = _hostile(big=big)
        for imp in _importances(w.shape[1]):
            a, b = _affine_both(s, w, imp)
            assert _same(a, b), (s.name, "hostile")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", sorted(FP_MODES))
def test_fp_search_kernel_is_the_reference(demo, mode, dtype):
    s = get_scheme(f"mlx-{mode}").for_dtype(dtype)
    for w, imp in demo:
        assert _same(*_fp_both(s, w, imp)), (s.name, "demo")
    big = 6e4 if dtype == "F16" else 1.7e38
    w = _hostile(big=big)
    for imp in _importances(w.shape[1]):
        assert _same(*_fp_both(s, w, imp)), (s.name, "hostile")


def test_hostile_groups_reach_non_finite_candidates():
    """The bfloat16 rows near float32's limit have groups whose range overflows float32 (their
    candidates' errors Inf or NaN), so the hostile checks above cover that path."""
    w = ref.round_to(_hostile(big=1.7e38), "BF16").reshape(-1, 32)
    with np.errstate(over="ignore"):
        span = w.max(1) - w.min(1)
    assert np.isinf(span).any() and np.isfinite(span).any()


def _round_values() -> np.ndarray:
    u = [0x7F800001, 0x7FC00000, 0xFFBFFFFF, 0x7F802000, 0x7F801FFF, 0x7FFFFFFF, 0xFF800000,
         0x7F800000, 0x00000001, 0x80000001, 0x007FFFFF, 0x00000000, 0x80000000, 0x7F7FFFFF,
         0x7F7F8000, 0x7F7F7FFF, 0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF]
    special = np.array(u, np.uint32).view(F)
    f16 = np.array([65504, 65519.99, 65520, 65536, -65520, 6.1035156e-05, 5.9604645e-08,
                    2.9802322e-08, 2.9802326e-08, 8.940697e-08, 1 + 2 ** -11, 1 + 3 * 2 ** -11,
                    2048 + 1, 2048 + 3, 1e-7, -1e-7], F)
    rng = np.random.default_rng(11)
    rand = (rng.standard_normal(4000) * np.exp(rng.uniform(-40, 40, 4000))).astype(F)
    bits = rng.integers(0, 2 ** 32, 4000, dtype=np.uint64).astype(np.uint32).view(F)
    return np.concatenate([special, f16, rand, bits])


@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_rounding_is_round_to(dtype):
    from kernels.tables import f16_table
    x = _round_values()
    out = np.empty_like(x)
    K.round_array(x, M.DT[dtype], f16_table(), out)
    with np.errstate(over="ignore", invalid="ignore"):
        want = ref.round_to(x, dtype)
    assert same_bits(out, want)


def test_weighted_quantize_runs_the_kernel_and_the_reference_only_without_numba(monkeypatch,
                                                                               demo):
    w, imp = demo[0]
    s = get_scheme("mlx-q3-g64")
    calls = []
    real = K.affine_search
    monkeypatch.setattr(K, "affine_search", lambda *a: calls.append(1) or real(*a))
    with_kernel = M.weighted_quantize(s, w, imp, "imatrix")
    assert calls == [1]
    M.kernels.cache_clear()
    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "numba" else find(name, *a))
    try:
        with pytest.warns(UserWarning, match="numba is not installed"):
            without = M.weighted_quantize(s, w, imp, "imatrix")
    finally:
        monkeypatch.undo()
        M.kernels.cache_clear()
    assert calls == [1]
    assert all(same_bits(with_kernel.arrays[k], without.arrays[k]) for k in with_kernel.arrays)

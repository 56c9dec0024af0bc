"""The IQ2 lattice tables (kernels/iq_grids.py, iq_lattice.py) and quantize kernel
(kernels/iq2_quant.py) against the numpy reference (workbench.schemes.ggml.iq2): the same
bytes plain and importance-weighted on ordinary, edge and hostile weights, the same
refusals, the decoders equal, and the quantize paths use the kernel."""

from __future__ import annotations

import os

import numpy as np
import pytest

from workbench.core.errors import WorkbenchError
from workbench.quant import accel
from workbench.schemes import get_scheme

from kernel_testutil import same_bits, same_qt, weights

TYPES = ["iq2_xxs", "iq2_xs", "iq2_s"]
GGML_SRC = os.path.expanduser("~/.cache/quant-workbench/llama-cpp-python-0.3.36/src/ggml/src")


def _kernel_bytes(S, w, qw=None):
    from kernels import iq2_quant
    w = np.ascontiguousarray(w, np.float32)
    blocks = np.empty((w.shape[0], w.shape[1] // 256 * S.type_size), np.uint8)
    flags = np.empty(w.shape[0], np.uint8)
    iq2_quant.encode_blocks(w, blocks, flags, None if qw is None else np.ascontiguousarray(qw),
                            S.ggml_name)
    return blocks, flags


def _hostile(seed=3):
    rng = np.random.default_rng(seed)
    rows = [rng.standard_normal(512) * s for s in (1e-30, 1e-12, 1e-6, 1e-3, 1.0, 7.0, 1e3)]
    rows += [rng.laplace(size=512), np.abs(rng.standard_normal(512)),
             -np.abs(rng.standard_normal(512))]
    w = np.stack(rows).astype(np.float32)
    edge = np.zeros((5, 512), np.float32)
    edge[0, 32:64] = -0.0                                  # zero and -0 sub-blocks
    edge[0, 256:] = rng.standard_normal(256).astype(np.float32)
    edge[0, 256:288] = 0.0                                 # a zero sub-block in a live block
    edge[1] = (rng.standard_normal(512) * 1e-40).astype(np.float32)   # float32 subnormals
    edge[2, :] = np.float32(0.37)
    edge[3, 3], edge[3, 9] = 2.0, -2.0                     # one weight per group
    edge[4] = (rng.standard_normal(512) * 3000).astype(np.float32)
    return np.concatenate([w, edge])


def test_tables_are_ggmls():
    """The grids decode to ggml-common.h's iq2xxs_grid / iq2xs_grid / iq2s_grid bytes and
    KSIGNS is ksigns_iq2xs (read from the llama.cpp source when present); every grid point
    has a key and every other key of {0,1,2}^8 a neighbour list."""
    from kernels.iq_lattice import KSIGNS, grid_values, lattice
    for name, n in (("iq2_xxs", 256), ("iq2_xs", 512), ("iq2_s", 1024)):
        lat = lattice(name)
        assert lat.points.shape == (n, 8) and set(np.unique(lat.points)) == {1, 3, 5}
        assert (lat.neighbours[:, 0] >= 0).all()
        assert sorted(lat.kmap[lat.kmap >= 0].tolist()) == list(range(n))
        assert (lat.kmap > -43692).sum() == 3 ** 8
    hdr = os.path.join(GGML_SRC, "ggml-common.h")
    if not os.path.exists(hdr):
        pytest.skip("llama.cpp source not present")
    import re
    text = open(hdr).read()

    def table(name):
        i = text.index(f"GGML_TABLE_BEGIN(uint64_t, {name}," if name != "ksigns_iq2xs"
                       else "GGML_TABLE_BEGIN(uint8_t, ksigns_iq2xs,")
        body = text[text.index(")", i) + 1:text.index("GGML_TABLE_END", i)]
        return np.array([int(t, 0) for t in re.findall(r"0x[0-9a-fA-F]+|\d+", body)], np.uint64)
    for tab, name in (("iq2xxs_grid", "iq2_xxs"), ("iq2xs_grid", "iq2_xs"),
                      ("iq2s_grid", "iq2_s")):
        g = table(tab).astype("<u8").view(np.uint8).reshape(-1, 8)
        assert np.array_equal(g, grid_values(name)), tab
    assert np.array_equal(table("ksigns_iq2xs").astype(np.uint8), KSIGNS)


@pytest.mark.parametrize("name", TYPES)
def test_has_kernels(name):
    assert accel.has_kernel(name, "quantize", "cpu")
    assert accel.has_kernel(name, "dequantize", "cpu")


@pytest.mark.parametrize("name", TYPES)
def test_same_bytes_as_reference_plain(name):
    S = get_scheme(name)
    w = _hostile()
    blocks, flags = _kernel_bytes(S, w)
    assert not flags.any()
    ref = S.quantize(w).arrays["blocks"]
    assert np.array_equal(blocks, ref), np.argwhere((blocks != ref).any(axis=1)).ravel()
    qt = accel.quantize(S, w, backend="cpu")
    assert same_qt(qt, S.quantize(w))
    assert same_bits(accel.dequantize(qt, backend="cpu"), S.dequantize(qt))
    y = S.dequantize(qt)
    assert np.isfinite(y).all()
    # a real 2-bit code: a Gaussian row lands at relative RMSE ~0.3
    x = w[4].astype(np.float64)
    assert np.sqrt(((y[4] - x) ** 2).sum() / (x * x).sum()) < 0.4


@pytest.mark.parametrize("name", TYPES)
def test_weighted_same_bytes_as_reference(name):
    """Per-column importance with dead columns and a dead sub-block, per-row importance."""
    S = get_scheme(name)
    rng = np.random.default_rng(21)
    w = _hostile(5)
    qcol = rng.lognormal(0.0, 1.5, 512).astype(np.float32)
    qcol[::9] = 0.0
    qcol[64:96] = 0.0
    qrow = rng.lognormal(0.0, 1.0, w.shape).astype(np.float32)
    for qw in (np.broadcast_to(qcol, w.shape), qrow):
        blocks, flags = _kernel_bytes(S, w, qw)
        assert not flags.any()
        ref = S.encode(w.reshape(-1, 256), np.ascontiguousarray(qw, np.float32).reshape(-1, 256))
        assert np.array_equal(blocks, ref.view(np.uint8).reshape(w.shape[0], -1))
    assert not np.array_equal(_kernel_bytes(S, w, qrow)[0], _kernel_bytes(S, w)[0])


@pytest.mark.parametrize("name", TYPES)
def test_scale_overflow_refused_like_the_reference(name):
    S = get_scheme(name)
    w = weights((3, 256), seed=2)
    w[1, 7] = np.float32(3e8)
    blocks, flags = _kernel_bytes(S, w)
    assert flags[1] & 1 and not flags[0] and not flags[2]
    with pytest.raises(WorkbenchError) as ref:
        S.quantize(w)
    with pytest.raises(WorkbenchError) as got:
        accel.quantize(S, w, backend="cpu")
    assert str(got.value) == str(ref.value) and "overflows" in str(got.value)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("name", TYPES)
def test_nonfinite_refused_with_the_reference_count(name, bad):
    S = get_scheme(name)
    w = weights((4, 256), seed=4)
    w[2, 40] = bad
    w[3, 95] = bad
    assert list(_kernel_bytes(S, w)[1] & 2) == [0, 0, 2, 2]
    with pytest.raises(WorkbenchError) as ref:
        S.quantize(w)
    with pytest.raises(WorkbenchError) as got:
        accel.quantize(S, w, backend="cpu")
    assert str(got.value) == str(ref.value) and "2 NaN/Inf" in str(got.value)


@pytest.mark.parametrize("name", TYPES)
def test_evaluate_and_weighted_encode_use_the_kernel(monkeypatch, name):
    from workbench.quant.evaluate import quantize
    from workbench.quant.methods.ggml_weighted import SUPPORTED, weighted_encode
    S = get_scheme(name)
    assert name in SUPPORTED
    rng = np.random.default_rng(22)
    w = (rng.standard_normal((6, 512)) * 0.1).astype(np.float32)
    qw = np.broadcast_to(rng.lognormal(0, 1, 512).astype(np.float32), w.shape)
    ref = S.quantize(w)
    wref = S.encode(w.reshape(-1, 256), np.ascontiguousarray(qw).reshape(-1, 256))

    def boom(self, x, qw=None):
        raise AssertionError("the numpy IQ2 encoder ran")
    monkeypatch.setattr(type(S), "encode", boom)
    assert same_qt(quantize(w, name), ref)
    assert np.array_equal(weighted_encode(S, w, qw).reshape(w.shape[0], -1),
                          wref.view(np.uint8).reshape(w.shape[0], -1))

"""IQ1_S / IQ1_M: the numba quantize kernel (kernels/iq1_quant.py) against the numpy reference
(workbench.schemes.ggml.iq1): the same bytes plain and importance-weighted on ordinary, edge and
hostile weights, the same refusals, the quantize paths use it; the grid is ggml's (gguf-py
decodes what we write); the CPU decoders equal the numpy ones; the weighted error is below
ggml's for the same importance."""

from __future__ import annotations

import os

import numpy as np
import pytest

from workbench.core.errors import WorkbenchError
from workbench.quant import accel
from workbench.schemes import get_scheme

from kernel_testutil import same_bits, same_qt, weights

NAMES = ("iq1_s", "iq1_m")
GGML_SRC = os.path.expanduser("~/.cache/quant-workbench/llama-cpp-python-0.3.36/src/ggml/src")


def _kernel_bytes(name, w, qw=None):
    from kernels import iq1_quant
    s = get_scheme(name)
    w = np.ascontiguousarray(w, np.float32)
    blocks = np.empty((w.shape[0], w.shape[1] // 256 * s.type_size), np.uint8)
    flags = np.empty(w.shape[0], np.uint8)
    iq1_quant.encode_blocks(name.upper(), w, blocks, flags,
                            None if qw is None else np.ascontiguousarray(qw, np.float32))
    return blocks, flags


def _ref_bytes(name, w, qw=None):
    s = get_scheme(name)
    q = None if qw is None else np.ascontiguousarray(qw, np.float32).reshape(-1, 256)
    return s.encode(w.reshape(-1, 256), q).view(np.uint8).reshape(w.shape[0], -1)


def _hostile(seed=3):
    rng = np.random.default_rng(seed)
    rows = [rng.standard_normal(512) * s for s in (1e-30, 1e-12, 1e-6, 1e-3, 1.0, 7.0, 1e3)]
    rows += [rng.laplace(size=512), np.abs(rng.standard_normal(512)),
             -np.abs(rng.standard_normal(512)), rng.standard_normal(512) ** 3]
    w = np.stack(rows).astype(np.float32)
    edge = np.zeros((7, 512), np.float32)
    edge[0, 32:64] = -0.0                                  # zero and -0 sub-blocks
    edge[0, 256:] = rng.standard_normal(256).astype(np.float32)
    edge[0, 256:288] = 0.0                                 # a zero sub-block in a live block
    edge[1, 40:80] = 1e-9                                  # sub-blocks below the threshold
    edge[1, 300] = 1.0
    edge[2] = (rng.standard_normal(512) * 1e-40).astype(np.float32)   # float32 subnormals
    edge[3, :] = np.float32(0.37)
    edge[4, 3], edge[4, 9] = 2.0, -2.0
    edge[5] = (rng.standard_normal(512) * 3e4).astype(np.float32)
    edge[6] = np.round(rng.standard_normal(512)).astype(np.float32)   # ties in the sort
    return np.concatenate([w, edge])


@pytest.mark.parametrize("name", NAMES)
def test_kernel_equals_reference(name):
    """Plain, per-column importance (dead columns, a dead sub-block) and per-row importance;
    the CPU decoder equals the numpy one."""
    s = get_scheme(name)
    assert accel.has_kernel(name, "quantize", "cpu")
    w = _hostile()
    blocks, flags = _kernel_bytes(name, w)
    assert not flags.any()
    ref = _ref_bytes(name, w)
    assert np.array_equal(blocks, ref), np.argwhere((blocks != ref).any(axis=1)).ravel()
    qt = accel.quantize(s, w, backend="cpu")
    assert same_qt(qt, s.quantize(w))
    assert same_bits(accel.dequantize(qt, backend="cpu"), s.dequantize(qt))
    rng = np.random.default_rng(21)
    qcol = rng.lognormal(0.0, 1.5, 512).astype(np.float32)
    qcol[::9] = 0.0
    qcol[64:96] = 0.0
    qrow = rng.lognormal(0.0, 1.0, w.shape).astype(np.float32)
    for qw in (np.broadcast_to(qcol, w.shape), qrow):
        blocks, flags = _kernel_bytes(name, w, qw)
        assert not flags.any()
        assert np.array_equal(blocks, _ref_bytes(name, w, qw))
    assert not np.array_equal(_kernel_bytes(name, w, qrow)[0], _kernel_bytes(name, w)[0])


@pytest.mark.parametrize("name", NAMES)
def test_gguf_reads_what_we_write(name):
    import gguf
    s = get_scheme(name)
    w = _hostile(7)
    qt = s.quantize(w)
    ref = gguf.quants.dequantize(qt.arrays["blocks"], s.ggml_type)
    back = s.dequantize(qt)
    assert np.array_equal(ref.view(np.uint32), back.view(np.uint32))
    assert not back[12, :256].any() and not back[13].any()     # zeros, subnormals: zeros
    assert np.all(np.isfinite(back))
    rel = np.sqrt(((back - w)[4] ** 2).sum() / (w[4] ** 2).sum())          # N(0, 1)
    assert rel < (0.5 if name == "iq1_s" else 0.46)


@pytest.mark.parametrize("name", NAMES)
def test_scale_overflow_refused_like_the_reference(name):
    s = get_scheme(name)
    w = weights((3, 256), seed=2)
    w[1, 7] = np.float32(3e9)                         # float16 d overflows
    blocks, flags = _kernel_bytes(name, w)
    assert flags[1] & 1 and not flags[0] and not flags[2]
    with pytest.raises(WorkbenchError) as ref:
        s.quantize(w)
    with pytest.raises(WorkbenchError) as got:
        accel.quantize(s, w, backend="cpu")
    assert str(got.value) == str(ref.value) and "overflows" in str(got.value)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nonfinite_refused_with_the_reference_count(bad):
    s = get_scheme("iq1_m")
    w = weights((4, 256), seed=4)
    w[2, 40] = bad
    w[3, 95] = bad
    assert list(_kernel_bytes("iq1_m", w)[1] & 2) == [0, 0, 2, 2]
    with pytest.raises(WorkbenchError) as ref:
        s.quantize(w)
    with pytest.raises(WorkbenchError) as got:
        accel.quantize(s, w, backend="cpu")
    assert str(got.value) == str(ref.value) and "2 NaN/Inf" in str(got.value)


@pytest.mark.parametrize("name", NAMES)
def test_evaluate_and_weighted_encode_use_the_kernel(name, monkeypatch):
    from workbench.quant.evaluate import quantize
    from workbench.quant.methods.ggml_weighted import SUPPORTED, weighted_encode
    s = get_scheme(name)
    assert name in SUPPORTED
    rng = np.random.default_rng(22)
    w = (rng.standard_normal((6, 512)) * 0.1).astype(np.float32)
    qw = np.broadcast_to(rng.lognormal(0, 1, 512).astype(np.float32), w.shape)
    ref, wref = s.quantize(w), _ref_bytes(name, w, qw)

    def boom(self, x, qw=None):
        raise AssertionError("the numpy IQ1 encoder ran")
    monkeypatch.setattr(type(s), "encode", boom)
    assert same_qt(quantize(w, name), ref)
    assert np.array_equal(weighted_encode(s, w, qw).reshape(w.shape[0], -1), wref)


def test_grid_is_ggmls():
    """2048 points of {-1, 0, 1}^8, each with its key; every other key of {0,1,2}^8 has
    neighbours (ggml's lists: all points at the 3 nearest distances); the table equals
    ggml-common.h's iq1s_grid when the llama.cpp source is present."""
    from kernels import iq1_grids
    from kernels.iq_lattice import lattice
    g = iq1_grids.GRID
    assert g.shape == (2048, 8) and set(np.unique(g)) == {-1, 0, 1}
    lat = lattice("iq1")
    assert sorted(lat.kmap[lat.kmap >= 0].tolist()) == list(range(2048))
    assert (lat.kmap > -43692).sum() == 3 ** 8 and (lat.neighbours[:, 0] >= 0).all()
    keys = [k for k in range(43692) if -43692 < lat.kmap[k] < 0][::150]
    assert len(keys) > 20
    for key in keys:                                    # a sample of off-grid keys
        pos = 2 * ((key >> (2 * np.arange(8))) & 3) + 1
        d2 = ((lat.points.astype(int) - pos) ** 2).sum(1)
        row = lat.neighbours[-lat.kmap[key] - 1]
        want = np.nonzero(d2 <= np.unique(d2)[2])[0]
        assert row[row >= 0].tolist() == want[np.lexsort((want, d2[want]))].tolist()
    hdr = os.path.join(GGML_SRC, "ggml-common.h")
    if not os.path.exists(hdr):
        pytest.skip("llama.cpp source not present")
    import re
    text = open(hdr).read()
    i = text.index("GGML_TABLE_BEGIN(uint64_t, iq1s_grid,")
    body = text[text.index(")", i) + 1:text.index("GGML_TABLE_END", i)]
    tab = np.array([int(t, 16) for t in re.findall(r"0x([0-9a-fA-F]+)", body)], np.uint64)
    assert np.array_equal(tab.astype("<u8").view(np.int8).reshape(-1, 8), g)
    assert "#define IQ1S_DELTA 0.125f" in text and "#define IQ1M_DELTA 0.125f" in text


@pytest.mark.parametrize("name", NAMES)
def test_weighted_error_below_ggml(name):
    """Heavy-tailed weights, a lognormal importance: sum qw (w - w')^2 of ours below ggml's
    ggml_quantize_chunk given the same importance (and plain: ours below ggml's with qw = 1)."""
    from kernels import ggml_ref
    if not ggml_ref.available():
        pytest.skip("libggml-base not built")
    from workbench.quant.methods.ggml_weighted import weighted_encode
    s = get_scheme(name)
    rng = np.random.default_rng(5)
    w = (rng.standard_t(4, (32, 1024)) * 0.02).astype(np.float32)
    qv = rng.lognormal(0, 1.5, 1024).astype(np.float32)
    qwm = np.broadcast_to(qv, w.shape)
    ours = s.decode(weighted_encode(s, w, qwm).reshape(-1).view(s.block_dtype)).reshape(w.shape)
    theirs = ggml_ref.dequantize(name, ggml_ref.quantize(name, w, imatrix=qv), 1024)
    e_o = float((qwm * (w - ours) ** 2).sum())
    e_g = float((qwm * (w - theirs) ** 2).sum())
    assert e_o < 0.9 * e_g, (e_o, e_g)
    plain = s.dequantize(s.quantize(w))
    ones = ggml_ref.dequantize(name, ggml_ref.quantize(name, w, imatrix=np.ones(1024, np.float32)),
                               1024)
    assert ((w - plain) ** 2).sum() < 0.9 * ((w - ones) ** 2).sum()


@pytest.mark.parametrize("name", NAMES)
def test_empty_and_chunked_reference(name, monkeypatch):
    """No blocks encode to no blocks; the reference's split search in chunks of rows gives the
    same bytes as in one piece."""
    from workbench.schemes.ggml import iq1
    s = get_scheme(name)
    assert s.encode(np.zeros((0, 256), np.float32)).shape == (0,)
    w = _hostile(9)[:6]
    whole = _ref_bytes(name, w)
    monkeypatch.setattr(iq1, "SPLIT_ROWS", 5)
    assert np.array_equal(_ref_bytes(name, w), whole)

"""IQ1_S / IQ1_M: the numba quantize kernel (kernels/iq1_quant.py) against the numpy reference
(workbench.schemes.ggml.iq1): the same bytes plain and importance-weighted on ordinary, edge and
hostile weights, the same refusals, the quantize paths use it; the grid is ggml's (gguf-py
decodes what we write); the CPU decoders equal the numpy ones; the weighted error is below
ggml's for the same importance."""

from __future__ import annotations

import os

import numpy as np
import pytest

from workbench.quant import accel
from workbench.schemes import get_scheme

from kernel_testutil import (check_lattice_gguf_reads, check_lattice_kernel_equals_reference,
                             check_lattice_kernel_used, check_lattice_nonfinite_refused,
                             check_lattice_overflow_refused, lattice_hostile,
                             lattice_kernel_bytes, lattice_ref_bytes)

NAMES = ("iq1_s", "iq1_m")
GGML_SRC = os.path.expanduser("~/.cache/quant-workbench/llama-cpp-python-0.3.36/src/ggml/src")


def _kernel_bytes(name, w, qw=None):
    from kernels import iq1_quant
    return lattice_kernel_bytes(iq1_quant, name, w, qw)


def _hostile(seed=3):
    return lattice_hostile(seed, ties=True)


@pytest.mark.parametrize("name", NAMES)
def test_kernel_equals_reference(name):
    """Plain, per-column importance (dead columns, a dead sub-block) and per-row importance;
    the CPU decoder equals the numpy one."""
    from kernels import iq1_quant
    assert accel.has_kernel(name, 'quantize', 'cpu')
    check_lattice_kernel_equals_reference(iq1_quant, name, _hostile())


@pytest.mark.parametrize("name", NAMES)
def test_gguf_reads_what_we_write(name):
    check_lattice_gguf_reads(name, _hostile(7), zero_row=12,
                             max_rel=(0.5 if name == "iq1_s" else 0.46))


@pytest.mark.parametrize("name", NAMES)
def test_scale_overflow_refused_like_the_reference(name):
    from kernels import iq1_quant
    check_lattice_overflow_refused(iq1_quant, name)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nonfinite_refused_with_the_reference_count(bad):
    from kernels import iq1_quant
    check_lattice_nonfinite_refused(iq1_quant, "iq1_m", bad)


@pytest.mark.parametrize("name", NAMES)
def test_evaluate_and_weighted_encode_use_the_kernel(name, monkeypatch):
    check_lattice_kernel_used(name, monkeypatch)


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
    whole = lattice_ref_bytes(name, w)
    monkeypatch.setattr(iq1, "SPLIT_ROWS", 5)
    assert np.array_equal(lattice_ref_bytes(name, w), whole)

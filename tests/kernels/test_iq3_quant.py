"""IQ3_XXS / IQ3_S: the numba quantize kernel (kernels/iq3_quant.py) against the numpy reference
(workbench.schemes.ggml.iq3): the same bytes plain and importance-weighted on ordinary, edge and
hostile weights, the same refusals, the quantize paths use it; the grids are ggml's (gguf-py
decodes what we write); and the weighted error is below ggml's for the same importance."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.quant import accel
from workbench.schemes import get_scheme

from kernel_testutil import (check_lattice_gguf_reads, check_lattice_kernel_equals_reference,
                             check_lattice_kernel_used, check_lattice_nonfinite_refused,
                             check_lattice_overflow_refused, lattice_hostile,
                             lattice_kernel_bytes)

NAMES = ("iq3_xxs", "iq3_s")


def _kernel_bytes(name, w, qw=None):
    from kernels import iq3_quant
    return lattice_kernel_bytes(iq3_quant, name, w, qw)


def _hostile(seed=3):
    return lattice_hostile(seed)


@pytest.mark.parametrize("name", NAMES)
def test_has_a_quantize_kernel(name):
    assert accel.has_kernel(name, "quantize", "cpu")


@pytest.mark.parametrize("name", NAMES)
def test_kernel_equals_reference(name):
    """Plain, per-column importance (dead columns, a dead sub-block) and per-row importance;
    the CPU decoder equals the numpy one."""
    from kernels import iq3_quant
    check_lattice_kernel_equals_reference(iq3_quant, name, _hostile())


@pytest.mark.parametrize("name", NAMES)
def test_gguf_reads_what_we_write(name):
    check_lattice_gguf_reads(name, _hostile(7), zero_row=11,
                             max_rel=(0.2 if name == "iq3_xxs" else 0.15))


@pytest.mark.parametrize("name", NAMES)
def test_scale_overflow_refused_like_the_reference(name):
    from kernels import iq3_quant
    check_lattice_overflow_refused(iq3_quant, name)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nonfinite_refused_with_the_reference_count(bad):
    from kernels import iq3_quant
    check_lattice_nonfinite_refused(iq3_quant, "iq3_s", bad)


@pytest.mark.parametrize("name", NAMES)
def test_evaluate_and_weighted_encode_use_the_kernel(name, monkeypatch):
    check_lattice_kernel_used(name, monkeypatch)


def test_grid_tables_are_ggmls():
    """Grid sizes and levels as ggml-common.h declares them; neighbour sets as iq3xs_init_impl
    builds them (every off-grid point has some, on-grid points none)."""
    from kernels import iq3_grids as g
    assert g.IQ3XXS_GRID.shape == (256, 4) and g.IQ3S_GRID.shape == (512, 4)
    assert sorted(set(g.IQ3XXS_GRID.ravel())) == [4, 12, 20, 28, 36, 44, 52, 62]
    assert sorted(set(g.IQ3S_GRID.ravel())) == list(range(1, 16, 2))
    assert all(bin(int(v)).count("1") % 2 == 0 for v in g.KSIGNS_IQ2XS)
    for which, n in (("xxs", 256), ("s", 512)):
        kmap, nbr = g.neighbours(which)
        assert (kmap >= 0).sum() == n
        assert np.all((nbr[kmap < 0] >= 0).sum(axis=1) >= 1)
        assert np.all(nbr[kmap >= 0] == -1)


@pytest.mark.parametrize("name", NAMES)
def test_weighted_error_below_ggml(name):
    """Heavy-tailed weights, a lognormal importance: Σ qw (w - w')² of ours below ggml's
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
    assert e_o < 0.97 * e_g, (e_o, e_g)
    plain = s.dequantize(s.quantize(w))
    ones = ggml_ref.dequantize(name, ggml_ref.quantize(name, w, imatrix=np.ones(1024, np.float32)),
                               1024)
    assert ((w - plain) ** 2).sum() < ((w - ones) ** 2).sum()

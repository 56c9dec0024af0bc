"""Helpers shared by the kernel tests (bit-exact comparisons, test weights)."""

from __future__ import annotations

import os

import numpy as np


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-for-bit equality (dtype, shape and every byte; NaN payloads included)."""
    a = np.ascontiguousarray(a)
    b = np.ascontiguousarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def same_qt(a, b) -> bool:
    return (a.scheme == b.scheme and tuple(a.shape) == tuple(b.shape)
            and set(a.arrays) == set(b.arrays)
            and all(same_bits(a.arrays[k], b.arrays[k]) for k in a.arrays))


def weights(shape, seed=0) -> np.ndarray:
    """Gaussian weights with per-row spread, a few outliers, exact zeros and a -0.0."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(shape).astype(np.float32)
    if w.ndim >= 2:
        w *= rng.uniform(0.01, 3.0, (shape[0],) + (1,) * (w.ndim - 1)).astype(np.float32)
    flat = w.reshape(-1)
    if flat.size > 8:
        flat[rng.integers(0, flat.size, 3)] *= 40
        flat[1] = 0.0
        flat[2] = -0.0
    return w




# ------------------------------------------------------------ lattice i-quant kernels (IQ1, IQ3)
# The quantize kernels of kernels/iq1_quant.py and kernels/iq3_quant.py share their calling
# convention (encode_blocks(NAME, w, blocks, flags, qw)) and their numpy references
# (scheme.encode on 256-weight rows): the checks below serve both test files.

def lattice_kernel_bytes(module, name, w, qw=None):
    """(blocks, flags) from `module`.encode_blocks for scheme `name`; qw: optional importance."""
    from workbench.schemes import get_scheme
    s = get_scheme(name)
    w = np.ascontiguousarray(w, np.float32)
    blocks = np.empty((w.shape[0], w.shape[1] // 256 * s.type_size), np.uint8)
    flags = np.empty(w.shape[0], np.uint8)
    module.encode_blocks(name.upper(), w, blocks, flags,
                         None if qw is None else np.ascontiguousarray(qw, np.float32))
    return blocks, flags


def lattice_ref_bytes(name, w, qw=None):
    """The numpy reference's blocks, one row of w per row."""
    from workbench.schemes import get_scheme
    s = get_scheme(name)
    q = None if qw is None else np.ascontiguousarray(qw, np.float32).reshape(-1, 256)
    return s.encode(w.reshape(-1, 256), q).view(np.uint8).reshape(w.shape[0], -1)


def lattice_hostile(seed=3, ties=False):
    """11 rows (7 scales over 1e-30..1e3, laplace, one-signed, cubed) and 6 edge rows (zero and
    -0 sub-blocks, sub-blocks below the threshold, subnormals, a constant row, two spikes,
    3e4 scale), then with `ties` a row of rounded values (ties in a sort); 512 columns."""
    rng = np.random.default_rng(seed)
    rows = [rng.standard_normal(512) * s for s in (1e-30, 1e-12, 1e-6, 1e-3, 1.0, 7.0, 1e3)]
    rows += [rng.laplace(size=512), np.abs(rng.standard_normal(512)),
             -np.abs(rng.standard_normal(512)), rng.standard_normal(512) ** 3]
    w = np.stack(rows).astype(np.float32)
    edge = np.zeros((7 if ties else 6, 512), np.float32)
    edge[0, 32:64] = -0.0                                  # zero and -0 sub-blocks
    edge[0, 256:] = rng.standard_normal(256).astype(np.float32)
    edge[0, 256:288] = 0.0                                 # a zero sub-block in a live block
    edge[1, 40:80] = 1e-9                                  # sub-blocks below the threshold
    edge[1, 300] = 1.0
    edge[2] = (rng.standard_normal(512) * 1e-40).astype(np.float32)   # float32 subnormals
    edge[3, :] = np.float32(0.37)
    edge[4, 3], edge[4, 9] = 2.0, -2.0
    edge[5] = (rng.standard_normal(512) * 3e4).astype(np.float32)
    if ties:
        edge[6] = np.round(rng.standard_normal(512)).astype(np.float32)   # ties in the sort
    return np.concatenate([w, edge])


def check_lattice_kernel_equals_reference(module, name, w):
    """Plain, per-column importance (dead columns, a dead sub-block) and per-row importance:
    the kernel's bytes are the reference's; the quantize path gives the reference's tensor and
    the CPU decoder the numpy decoder's values; importance changes the bytes."""
    from workbench.quant import accel
    from workbench.schemes import get_scheme
    s = get_scheme(name)
    blocks, flags = lattice_kernel_bytes(module, name, w)
    assert not flags.any()
    ref = lattice_ref_bytes(name, w)
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
        blocks, flags = lattice_kernel_bytes(module, name, w, qw)
        assert not flags.any()
        assert np.array_equal(blocks, lattice_ref_bytes(name, w, qw))
    assert not np.array_equal(lattice_kernel_bytes(module, name, w, qrow)[0],
                              lattice_kernel_bytes(module, name, w)[0])


def check_lattice_gguf_reads(name, w, zero_row, max_rel):
    """gguf-py decodes the reference's blocks to our values; row zero_row's first block (zeros)
    and row 13 (subnormals) decode to zeros; row 4 (N(0, 1)) within max_rel relative RMSE."""
    import gguf
    from workbench.schemes import get_scheme
    s = get_scheme(name)
    qt = s.quantize(w)
    ref = gguf.quants.dequantize(qt.arrays["blocks"], s.ggml_type)
    back = s.dequantize(qt)
    assert np.array_equal(ref.view(np.uint32), back.view(np.uint32))
    assert not back[zero_row, :256].any() and not back[13].any()
    assert np.all(np.isfinite(back))
    rel = np.sqrt(((back - w)[4] ** 2).sum() / (w[4] ** 2).sum())
    assert rel < max_rel


def _refused_like_the_reference(name, w, says):
    import pytest
    from workbench.core.errors import WorkbenchError
    from workbench.quant import accel
    from workbench.schemes import get_scheme
    s = get_scheme(name)
    with pytest.raises(WorkbenchError) as ref:
        s.quantize(w)
    with pytest.raises(WorkbenchError) as got:
        accel.quantize(s, w, backend="cpu")
    assert str(got.value) == str(ref.value) and says in str(got.value)


def check_lattice_overflow_refused(module, name):
    """A float16 d that overflows: the kernel flags that row (1) alone, and the quantize path
    refuses with the reference's message."""
    w = weights((3, 256), seed=2)
    w[1, 7] = np.float32(3e9)
    flags = lattice_kernel_bytes(module, name, w)[1]
    assert flags[1] & 1 and not flags[0] and not flags[2]
    _refused_like_the_reference(name, w, "overflows")


def check_lattice_nonfinite_refused(module, name, bad):
    """NaN/Inf `bad` in two rows: the kernel flags those rows (2), and the quantize path refuses
    with the reference's message and count."""
    w = weights((4, 256), seed=4)
    w[2, 40] = bad
    w[3, 95] = bad
    assert list(lattice_kernel_bytes(module, name, w)[1] & 2) == [0, 0, 2, 2]
    _refused_like_the_reference(name, w, "2 NaN/Inf")


def check_lattice_kernel_used(name, monkeypatch):
    """evaluate's quantize and the importance-weighted encode run the kernel (the numpy
    encoder made to fail) and give the reference's bytes."""
    from workbench.quant.evaluate import quantize
    from workbench.quant.methods.ggml_weighted import SUPPORTED, weighted_encode
    from workbench.schemes import get_scheme
    s = get_scheme(name)
    assert name in SUPPORTED
    rng = np.random.default_rng(22)
    w = (rng.standard_normal((6, 512)) * 0.1).astype(np.float32)
    qw = np.broadcast_to(rng.lognormal(0, 1, 512).astype(np.float32), w.shape)
    ref, wref = s.quantize(w), lattice_ref_bytes(name, w, qw)

    def boom(self, x, qw=None):
        raise AssertionError(f"the numpy {name} encoder ran")
    monkeypatch.setattr(type(s), "encode", boom)
    assert same_qt(quantize(w, name), ref)
    assert np.array_equal(weighted_encode(s, w, qw).reshape(w.shape[0], -1), wref)

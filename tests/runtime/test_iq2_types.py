"""IQ2_XXS against ggml's C code (kernels.ggml_ref) and llama.cpp: on real MiniLM matrices the
workbench's search picks ggml's grid points and signs (its search is a float32 port), ggml
decodes the workbench's bytes exactly as the workbench does, the importance-weighted error
given the same imatrix is below ggml's, and an export runs in llama.cpp and reads back as
written."""

from __future__ import annotations


import numpy as np
import pytest

from kernels import ggml_ref
from workbench.quant.evaluate import quantize

from .conftest import export_runs_and_reads_back

pytestmark = pytest.mark.runtime

TYPES = ["iq2_xxs", "iq2_xs", "iq2_s"]


@pytest.fixture(scope="module")
def ggml(llama_bin):
    if not ggml_ref.available():
        pytest.fail(f"libggml-base not found under {ggml_ref.cache_dir()}")
    return ggml_ref


def _search_bits(name, raw, bpb):
    """What ggml's search decides, without d and the 4-bit scales: IQ2_XXS the grid words and
    the sign bits of the other word; IQ2_XS every uint16 of qs (9-bit index, 7 signs)."""
    if name == "iq2_xs":
        return raw.reshape(-1, bpb)[:, 2:66].copy().view("<u2")
    if name == "iq2_s":                                   # qs, signs, qh
        return raw.reshape(-1, bpb)[:, 2:74]
    q = raw.reshape(-1, bpb)[:, 2:].copy().view("<u4").reshape(-1, 8, 2)
    return np.stack([q[:, :, 0], q[:, :, 1] & 0x0FFFFFFF], axis=2)


@pytest.mark.parametrize("name", TYPES)
def test_search_is_ggmls_and_weighted_error_lower(ggml, minilm, name):
    from workbench.quant.methods.ggml_weighted import weighted_encode
    from workbench.schemes import get_scheme
    s = get_scheme(name)
    rng = np.random.default_rng(0)
    errs = []
    for layer in (0, 5):
        w = np.ascontiguousarray(minilm.read_matrix(f"encoder.layer.{layer}.output.dense.weight"),
                                 np.float32)
        x = w.astype(np.float64)
        qv = rng.lognormal(0.0, 1.5, w.shape[1]).astype(np.float32)
        ours = weighted_encode(s, w, np.broadcast_to(qv, w.shape)).reshape(w.shape[0], -1)
        theirs = ggml.quantize(name, w, imatrix=qv)
        assert np.array_equal(_search_bits(name, ours, s.type_size),
                              _search_bits(name, theirs, s.type_size))     # grid points, signs
        yo = ggml.dequantize(name, ours, w.shape[1])
        mine = s.decode(ours.reshape(-1).view(s.block_dtype)).reshape(w.shape)
        assert np.array_equal(yo.view(np.uint32), mine.view(np.uint32))
        yt = ggml.dequantize(name, theirs, w.shape[1])
        errs.append(np.sqrt((qv * (x - yo) ** 2).sum() / (qv * (x - yt) ** 2).sum()))
        # plain (unit importance: what llama.cpp would need an imatrix of ones for; IQ2_S:
        # ggml's own plain quantization, the same search)
        plain = quantize(w, name).arrays["blocks"]
        yp = ggml.dequantize(name, plain, w.shape[1])
        ones = None if name == "iq2_s" else np.ones(w.shape[1], np.float32)
        theirs_plain = ggml.quantize(name, w, imatrix=ones)
        yu = ggml.dequantize(name, theirs_plain, w.shape[1])
        if name == "iq2_s":
            assert np.array_equal(_search_bits(name, plain, s.type_size),
                                  _search_bits(name, theirs_plain, s.type_size))
        assert ((x - yp) ** 2).sum() <= ((x - yu) ** 2).sum()
    print(f"\n{name}: importance-weighted RMSE ours/ggml {errs}")
    assert max(errs) <= 0.97, errs


@pytest.mark.parametrize("name", TYPES)
def test_export_runs_in_llama_cpp_and_reads_back(llama_bin, demo_f32, tmp_path, name):
    n, ppl = export_runs_and_reads_back(llama_bin, demo_f32, tmp_path, name)
    print(f"\n{name}: {n} tensors; perplexity {ppl:.2f}")

"""IQ1_S / IQ1_M against ggml's C code (kernels.ggml_ref) and llama.cpp: on real MiniLM
matrices ggml decodes the workbench's bytes exactly as the workbench does and the
importance-weighted error given the same importance is below ggml's; an export runs in
llama.cpp (generates, finite perplexity) and reads back as written."""

from __future__ import annotations


import numpy as np
import pytest

from kernels import ggml_ref
from workbench.quant.evaluate import quantize

from .conftest import export_runs_and_reads_back

pytestmark = pytest.mark.runtime

TYPES = ["iq1_s", "iq1_m"]


@pytest.fixture(scope="module")
def ggml(llama_bin):
    if not ggml_ref.available():
        pytest.fail(f"libggml-base not found under {ggml_ref.cache_dir()}")
    return ggml_ref


@pytest.mark.parametrize("name", TYPES)
def test_ggml_decodes_ours_and_weighted_error_lower(ggml, minilm, name):
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
        yo = ggml.dequantize(name, ours, w.shape[1])
        mine = s.decode(ours.reshape(-1).view(s.block_dtype)).reshape(w.shape)
        assert np.array_equal(yo.view(np.uint32), mine.view(np.uint32))
        yt = ggml.dequantize(name, ggml.quantize(name, w, imatrix=qv), w.shape[1])
        errs.append(np.sqrt((qv * (x - yo) ** 2).sum() / (qv * (x - yt) ** 2).sum()))
        # plain: unit importance, what llama.cpp needs an imatrix of ones for
        yp = ggml.dequantize(name, quantize(w, name).arrays["blocks"], w.shape[1])
        yu = ggml.dequantize(name, ggml.quantize(name, w, imatrix=np.ones(w.shape[1], np.float32)),
                             w.shape[1])
        assert ((x - yp) ** 2).sum() < ((x - yu) ** 2).sum()
    print(f"\n{name}: importance-weighted RMSE ours/ggml {errs}")
    assert max(errs) <= 0.97, errs


@pytest.mark.parametrize("name", TYPES)
def test_export_runs_in_llama_cpp_and_reads_back(llama_bin, demo_f32, tmp_path, name):
    n, ppl = export_runs_and_reads_back(llama_bin, demo_f32, tmp_path, name)
    print(f"\n{name}: {n} tensors; perplexity {ppl:.2f}")

"""IQ1_S / IQ1_M against ggml's C code (kernels.ggml_ref) and llama.cpp: on real MiniLM
matrices ggml decodes the workbench's bytes exactly as the workbench does and the
importance-weighted error given the same importance is below ggml's; an export runs in
llama.cpp (generates, finite perplexity) and reads back as written."""

from __future__ import annotations

import re

import gguf
import numpy as np
import pytest

from kernels import ggml_ref
from workbench.export import export
from workbench.formats.loaders import open_model
from workbench.quant.evaluate import quantize
from workbench.quant.plan import Plan
from workbench.core.progress import run

from .conftest import ROOT, perplexity, run_tool

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


@pytest.fixture(scope="module")
def demo_f32(tmp_path_factory):
    path = tmp_path_factory.mktemp("iq1") / "demo-f32.gguf"
    run(export(open_model(ROOT / "resources" / "demo_model"), Plan(default="fp32"), "gguf",
               path))
    return path


@pytest.mark.parametrize("name", TYPES)
def test_export_runs_in_llama_cpp_and_reads_back(llama_bin, demo_f32, tmp_path, name):
    from workbench.schemes import get_scheme
    ours = tmp_path / f"wb-{name}.gguf"
    info = run(export(open_model(demo_f32), Plan(default=name), "gguf", ours))
    assert info["runnable_by_llama_cpp"]
    src = {t.name: t for t in gguf.GGUFReader(str(demo_f32)).tensors}
    gtype = gguf.GGMLQuantizationType[name.upper()]
    typed = [t for t in gguf.GGUFReader(str(ours)).tensors if t.tensor_type == gtype]
    assert typed
    for t in typed:
        w = np.ascontiguousarray(src[t.name].data, np.float32)
        want = quantize(w, name).arrays["blocks"]
        assert np.array_equal(np.asarray(t.data).view(np.uint8).reshape(want.shape), want)
    back = open_model(ours)
    t0 = typed[0]
    got = np.asarray(back.read_matrix(t0.name), np.float32)
    ref = quantize(np.ascontiguousarray(src[t0.name].data, np.float32), name)
    assert np.array_equal(got.reshape(-1), get_scheme(name).dequantize(ref).reshape(-1))
    r = run_tool(llama_bin, "llama-simple", "-m", ours, "-n", "16", "The engineer measured")
    m = re.search(r"decoded (\d+) tokens", r.stdout + r.stderr)
    assert m and int(m.group(1)) == 16, (r.stdout + r.stderr)[-1500:]
    ppl = perplexity(llama_bin, ours, ROOT / "resources" / "calibration.txt")
    print(f"\n{name}: {len(typed)} tensors; perplexity {ppl:.2f}")
    assert np.isfinite(ppl) and ppl > 1

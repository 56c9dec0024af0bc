"""The GGML types whose llama.cpp quantizer is deterministic (MXFP4, TQ1_0, TQ2_0, NVFP4): the workbench's bytes
are llama.cpp's own, from ggml's C quantizer (kernels.ggml_ref) and from `llama-quantize` on
the same F32 GGUF, and the workbench's export runs in llama.cpp."""

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

from .conftest import ROOT, THREADS, generates_with_finite_perplexity, perplexity, run_tool

pytestmark = pytest.mark.runtime

# workbench scheme -> llama-quantize file type that, with --pure, types every weight so
LLAMA_FTYPE = {"mxfp4": "MXFP4_MOE", "tq1_0": "TQ1_0", "tq2_0": "TQ2_0", "iq4_xs": "IQ4_XS",
               "nvfp4": "Q8_0"}
# llama-quantize has no NVFP4 file type; --tensor-type gives every weight matrix NVFP4
LLAMA_ARGS = {"nvfp4": ("--tensor-type", "weight=nvfp4")}


@pytest.fixture(scope="module")
def ggml(llama_bin):
    if not ggml_ref.available():
        pytest.fail(f"libggml-base not found under {ggml_ref.cache_dir()}")
    return ggml_ref


def _hostile(cols: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((40, cols)) * rng.uniform(1e-3, 30, (40, 1))).astype(np.float32)
    w[0, :64] = 0.0
    w[1, :64] = -0.0
    w[2] *= np.float32(1e-6)
    w[3] = np.round(w[3] * 4) / 4                       # exact ties of the code grids
    w[4] = (rng.standard_normal(cols) * 1e-39).astype(np.float32)    # float32 subnormals
    w[5, 7] = 3e4                                       # an outlier
    w[6] = np.float32(0.37)
    w[7] *= np.float32(1e-30)
    return w


@pytest.mark.parametrize("name", list(LLAMA_FTYPE))
def test_bytes_equal_ggmls_quantizer(ggml, minilm, name):
    """Every block equal to ggml_quantize_chunk's, on real MiniLM matrices and on hostile
    ones, and ggml decodes them as the workbench does."""
    w_real = np.ascontiguousarray(minilm.read_matrix("encoder.layer.0.output.dense.weight"),
                                  np.float32)
    hostile = _hostile(1536, 1)
    if name == "nvfp4":
        hostile[5, 7] = 2e3                             # within its 2688 limit
    for w in (w_real, hostile):
        ours = quantize(w, name).arrays["blocks"]
        assert np.array_equal(ours, ggml.quantize(name, w))
        back = get_back(name, ours, w.shape)
        assert np.array_equal(ggml.dequantize(name, ours, w.shape[1]).view(np.uint32),
                              back.view(np.uint32))


def get_back(name, raw, shape):
    from workbench.schemes import get_scheme
    return get_scheme(name).dequantize_blocks(raw).reshape(shape)


def _tensors(path) -> dict:
    return {t.name: t for t in gguf.GGUFReader(str(path)).tensors}


@pytest.mark.parametrize("name", list(LLAMA_FTYPE))
def test_llama_quantize_bytes_equal_and_export_runs(llama_bin, demo_f32, tmp_path, name):
    """llama-quantize --pure on the F32 GGUF and the workbench's export of the same file:
    every tensor both give the type has the same bytes; the export generates text and has a
    finite perplexity in llama.cpp."""
    theirs = tmp_path / f"lq-{name}.gguf"
    run_tool(llama_bin, "llama-quantize", "--pure", *LLAMA_ARGS.get(name, ()), demo_f32, theirs,
             LLAMA_FTYPE[name], THREADS)
    ours = tmp_path / f"wb-{name}.gguf"
    info = run(export(open_model(demo_f32), Plan(default=name), "gguf", ours))
    assert info["runnable_by_llama_cpp"]
    a, b = _tensors(theirs), _tensors(ours)
    gtype = gguf.GGMLQuantizationType[name.upper()]
    both = [n for n in a if a[n].tensor_type == gtype and n in b and b[n].tensor_type == gtype]
    assert len(both) >= 21, both                       # 3 layers x 7 linear weights at least
    for n in both:
        assert np.array_equal(np.asarray(a[n].data).view(np.uint8),
                              np.asarray(b[n].data).view(np.uint8)), n
    ppl = generates_with_finite_perplexity(llama_bin, ours)
    print(f"\n{name}: {len(both)} tensors byte-equal to llama-quantize; perplexity {ppl:.2f}")
    if name == "nvfp4":                                # close to the float model's
        ppl32 = perplexity(llama_bin, demo_f32, ROOT / "resources" / "calibration.txt")
        print(f"F32 perplexity {ppl32:.2f}")
        assert ppl < 1.25 * ppl32


def test_iq4_xs_bytes_equal_with_the_same_imatrix(llama_bin, ggml, demo_f32, tmp_path):
    """llama-imatrix on the F32 GGUF, then llama-quantize --pure --imatrix ... IQ4_XS: the
    workbench's importance-weighted IQ4_XS (methods.ggml_weighted) given the same imatrix
    (E[x^2] = in_sum2 / counts, read by workbench.running.imatrix) has the same bytes for every
    tensor; a tensor the imatrix lacks is quantized plain by both."""
    from workbench.quant.methods.ggml_weighted import weighted_encode
    from workbench.running.imatrix import read_imatrix
    from workbench.schemes import get_scheme
    imat = tmp_path / "imatrix.gguf"
    run_tool(llama_bin, "llama-imatrix", "-m", demo_f32, "-f",
             ROOT / "resources" / "calibration.txt", "-o", imat, "-c", "128", "--chunks", "8",
             "-t", THREADS)
    theirs = tmp_path / "lq-iq4_xs-imatrix.gguf"
    run_tool(llama_bin, "llama-quantize", "--pure", "--imatrix", imat, demo_f32, theirs,
             "IQ4_XS", THREADS)
    e = read_imatrix(imat)
    src, out = _tensors(demo_f32), _tensors(theirs)
    s = get_scheme("iq4_xs")
    n_weighted = 0
    for n, t in out.items():
        if t.tensor_type != gguf.GGMLQuantizationType.IQ4_XS:
            continue
        w = np.ascontiguousarray(src[n].data, np.float32)
        if n in e:
            qv = np.asarray(e[n], np.float32)
            ours = weighted_encode(s, w, np.broadcast_to(qv, w.shape)).reshape(w.shape[0], -1)
            assert np.array_equal(ours, ggml.quantize("iq4_xs", w, imatrix=qv)), n
            n_weighted += 1
        else:
            ours = quantize(w, "iq4_xs").arrays["blocks"]
        assert np.array_equal(ours, np.asarray(t.data).view(np.uint8).reshape(ours.shape)), n
    assert n_weighted >= 21


@pytest.mark.parametrize("name", ["iq3_xxs", "iq3_s"])
def test_lattice_export_runs_and_reads_back(llama_bin, ggml, demo_f32, tmp_path, name):
    """IQ3_XXS / IQ3_S (the workbench's own search, not llama.cpp's bytes): the export of the
    F32 GGUF types every weight llama.cpp would, reads back (gguf-py and ggml's to_float) equal
    to what the workbench wrote, generates text and has a finite perplexity in llama.cpp; and
    with llama-imatrix's imatrix, each weight's importance-weighted error is at most
    llama-quantize --pure --imatrix's (summed over the tensors: below it)."""
    from workbench.quant.methods.ggml_weighted import weighted_encode
    from workbench.running.imatrix import read_imatrix
    from workbench.schemes import get_scheme
    s = get_scheme(name)
    ours = tmp_path / f"wb-{name}.gguf"
    info = run(export(open_model(demo_f32), Plan(default=name), "gguf", ours))
    assert info["runnable_by_llama_cpp"]
    src, b = _tensors(demo_f32), _tensors(ours)
    gtype = gguf.GGMLQuantizationType[name.upper()]
    typed = [n for n in b if b[n].tensor_type == gtype]
    assert len(typed) >= 21, typed
    for n in typed:
        w = np.ascontiguousarray(src[n].data, np.float32)
        raw = np.asarray(b[n].data).view(np.uint8).reshape(w.shape[0], -1)
        assert np.array_equal(raw, quantize(w, name).arrays["blocks"]), n
        assert np.array_equal(ggml.dequantize(name, raw, w.shape[1]).view(np.uint32),
                              get_back(name, raw, w.shape).view(np.uint32)), n
    r = run_tool(llama_bin, "llama-simple", "-m", ours, "-n", "16", "The engineer measured")
    m = re.search(r"decoded (\d+) tokens", r.stdout + r.stderr)
    assert m and int(m.group(1)) == 16, (r.stdout + r.stderr)[-1500:]
    ppl = perplexity(llama_bin, ours, ROOT / "resources" / "calibration.txt")
    assert np.isfinite(ppl) and ppl > 1
    imat = tmp_path / "imatrix.gguf"
    run_tool(llama_bin, "llama-imatrix", "-m", demo_f32, "-f",
             ROOT / "resources" / "calibration.txt", "-o", imat, "-c", "128", "--chunks", "8",
             "-t", THREADS)
    theirs = tmp_path / f"lq-{name}-imatrix.gguf"
    run_tool(llama_bin, "llama-quantize", "--pure", "--imatrix", imat, demo_f32, theirs,
             name.upper(), THREADS)
    e, t = read_imatrix(imat), _tensors(theirs)
    e_o = e_g = 0.0
    for n in typed:
        if n not in e or t[n].tensor_type != gtype:
            continue
        w = np.ascontiguousarray(src[n].data, np.float32)
        qv = np.broadcast_to(np.asarray(e[n], np.float32), w.shape)
        yo = s.decode(weighted_encode(s, w, qv).reshape(-1).view(s.block_dtype)).reshape(w.shape)
        yg = get_back(name, np.asarray(t[n].data).view(np.uint8), w.shape)
        e_o += float((qv * (w.astype(np.float64) - yo) ** 2).sum())
        e_g += float((qv * (w.astype(np.float64) - yg) ** 2).sum())
    print(f"\n{name}: perplexity {ppl:.2f}; imatrix-weighted error ours/llama-quantize "
          f"{e_o / e_g:.4f}")
    assert 0 < e_o < e_g

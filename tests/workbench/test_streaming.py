"""Weight work past RAM: the streamed (row-chunk) paths give the same bytes and figures as the
whole-tensor paths, and mapped pages are released. The thresholds are lowered so the small
demo model takes the streamed paths (big models take them for real)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from workbench.quant import streaming
from workbench.quant.evaluate import evaluate_tensor, quantize
from workbench.formats.loaders import open_model
from workbench.quant.plan import KEEP, Plan
from workbench.core.progress import run
from workbench.quant.runtimes import decide
from workbench.schemes import get_scheme, list_schemes

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "resources" / "demo_model"


@pytest.fixture
def stream_all(monkeypatch):
    """Every tensor above 1 element streamed, in chunks of a few rows (several per tensor)."""
    monkeypatch.setattr(streaming, "STREAM_ELEMENTS", 1)
    monkeypatch.setattr(streaming, "CHUNK_ELEMENTS", 256 * 37)   # 37 rows of 256: ragged tail


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(path.iterdir()) if path.is_dir() else [path]:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def test_row_local_schemes_quantize_rows_independently():
    """The declaration the streamed paths rely on, checked for every registered scheme:
    row_local schemes give the same codes for a matrix and for its row blocks."""
    w = np.random.default_rng(1).standard_t(4, (12, 512)).astype(np.float32) * 0.02
    w[:, 7] *= 15.0
    not_local = []
    for s in list_schemes():
        sch = get_scheme(s)
        if not sch.row_local:
            not_local.append(s)
            continue
        whole = quantize(w, s)
        parts = [quantize(w[a:b], s) for a, b in ((0, 5), (5, 12))]
        for k, arr in whole.arrays.items():
            cat = np.concatenate([p.arrays[k] for p in parts])
            assert cat.dtype == arr.dtype and np.array_equal(cat.view(np.uint8),
                                                             arr.view(np.uint8)), (s, k)
        assert sch.nbytes(w.shape) == whole.nbytes, s
    # a per-tensor scale, NVFP4's global scale, FP8 block scales spanning 128 rows
    assert not_local and all(s.startswith("int") and "-tensor" in s
                             or s in ("nvfp4-g16", "fp8-e4m3-b128") for s in not_local)


@pytest.mark.parametrize("scheme", ["q4_k", "q6_k", "q8_0", "iq4_nl", "nf4-g64", "fp8-e4m3",
                                    "int4-g128", "int3-channel-asym", "bf16", KEEP])
def test_evaluate_streamed_equals_whole(stream_all, scheme):
    model = open_model(DEMO)
    names = [n for n in model.tensors if model.info(n).ndim == 2]
    for n in names:
        info = model.info(n)
        d = decide(info, scheme, "any")
        streaming.STREAM_ELEMENTS = 1
        s = evaluate_tensor(model, n, scheme, cache=None, decision=d)
        streaming.STREAM_ELEMENTS = 1 << 40
        w = evaluate_tensor(model, n, scheme, cache=None, decision=d)
        assert s.scheme == w.scheme and s.bytes == w.bytes, n
        assert s.error.max_abs_err == w.error.max_abs_err
        assert np.array_equal(s.error.channel_rel_err, w.error.channel_rel_err)
        for k in ("sse", "sig", "mse", "cosine"):
            a, b = getattr(s.error, k), getattr(w.error, k)
            assert a == pytest.approx(b, rel=1e-12, abs=1e-300), (n, k)
        if scheme not in (KEEP, "bf16"):
            assert w.error.sse > 0   # a real error was measured, not a kept tensor


def test_streamed_is_used_only_where_it_keeps_the_result():
    model = open_model(DEMO)
    info = model.info("model.embed_tokens.weight")
    assert not streaming.streamed(info, "q4_k")            # small: the whole-tensor path
    old = streaming.STREAM_ELEMENTS
    try:
        streaming.STREAM_ELEMENTS = 1
        assert streaming.streamed(info, "q4_k") and streaming.streamed(info, KEEP)
        assert not streaming.streamed(info, "int4-tensor")  # one scale for the whole tensor
    finally:
        streaming.STREAM_ELEMENTS = old


def test_activation_error_streamed_equals_whole(stream_all):
    from workbench.quant.streaming import activation_error
    model = open_model(DEMO)
    rng = np.random.default_rng(0)
    for n in ["model.layers.0.mlp.down_proj.weight", "model.embed_tokens.weight"]:
        info = model.info(n)
        ex2 = rng.random(info.cols) + 0.1
        ex2_rows = rng.random(info.rows)
        streaming.STREAM_ELEMENTS = 1
        a = activation_error(model, n, "q4_k", ex2), activation_error(model, n, "q4_k",
                                                                      ex2_rows, rows=True)
        streaming.STREAM_ELEMENTS = 1 << 40
        b = activation_error(model, n, "q4_k", ex2), activation_error(model, n, "q4_k",
                                                                      ex2_rows, rows=True)
        assert a[0] > 0 and a[1] > 0
        assert a[0] == pytest.approx(b[0], rel=1e-12) and a[1] == pytest.approx(b[1], rel=1e-12)


@pytest.mark.parametrize("fmt,plan", [
    ("safetensors", Plan(default="q4_k")),
    ("safetensors", Plan(default="nf4-g64")),
    ("safetensors", Plan(default="int3-g64")),
    ("safetensors", Plan(default="fp8-e4m3")),
    ("gguf", Plan(default="q4_k")),
    ("gguf", Plan(default="q8_0")),
    ("compressed-tensors", Plan(default="int4-g128")),
    ("compressed-tensors", Plan(default="int8-channel")),
    ("compressed-tensors", Plan(default="fp8-e4m3")),
    ("compressed-tensors", Plan(default="int4-g128-asym")),
], ids=lambda v: v if isinstance(v, str) else v.default)
def test_exports_streamed_write_the_same_bytes(tmp_path, monkeypatch, fmt, plan):
    from workbench.export import export
    from workbench.export import gguf_tensor_data
    model = open_model(DEMO)
    whole = tmp_path / ("whole" + ("" if fmt == "compressed-tensors" else "." + fmt))
    run(export(model, plan, fmt, whole))
    monkeypatch.setattr(streaming, "STREAM_ELEMENTS", 1)
    monkeypatch.setattr(streaming, "CHUNK_ELEMENTS", 256 * 37)
    monkeypatch.setattr(gguf_tensor_data, "CHUNK_ELEMENTS", 256 * 37)
    calls = []
    real = streaming.quantized_row_blocks
    monkeypatch.setattr(streaming, "quantized_row_blocks",
                        lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    streamed = tmp_path / ("streamed" + ("" if fmt == "compressed-tensors" else "." + fmt))
    run(export(model, plan, fmt, streamed))
    if fmt == "gguf":   # GGUF names the source file in no key: the files are byte-identical
        assert streamed.read_bytes() == whole.read_bytes()
    elif fmt == "safetensors":
        assert streamed.read_bytes() == whole.read_bytes()
        assert open_model(streamed).read("model.layers.0.mlp.up_proj.weight").shape == (512, 256)
    else:
        assert _digest(streamed) == _digest(whole)
    if fmt != "gguf" and not plan.default.endswith("-asym"):
        assert calls, "the streamed path was not taken"


def test_writer_add_stream_matches_add(tmp_path):
    from workbench.export.st_writer import StreamingSafetensorsWriter
    a = np.arange(7 * 6, dtype=np.int32).reshape(7, 6)
    w1 = StreamingSafetensorsWriter(tmp_path / "a.safetensors")
    w1.add("x", a)
    w1.finish()
    w2 = StreamingSafetensorsWriter(tmp_path / "b.safetensors")
    assert w2.add_stream("x", [a[:3], a[3:5], a[5:]]) == (7, 6)
    w2.finish()
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()


def test_release_drops_mapped_pages_only():
    from workbench.formats.loaders.safetensors_format import map_region
    from workbench.core.pages import release
    path = DEMO / "model.safetensors"
    m = map_region(str(path), 8, 1 << 20, np.uint16)
    assert release(m[: 1 << 18]) >= 1 << 18
    assert int(m[: 1 << 18].astype(np.int64).sum()) >= 0     # still readable after
    assert release(np.zeros(1 << 16, np.uint16)) == 0          # not a mapping: untouched


def test_iter_rows_unchanged_by_release():
    model = open_model(DEMO)
    n = "model.embed_tokens.weight"
    got = np.concatenate([c for _r, c in model.iter_rows(n, max_elements=256 * 10)])
    assert np.array_equal(got, model.read_matrix(n))


@pytest.mark.parametrize("scheme", ["int4-tensor", "int2-tensor", "int8-tensor", "int4-tensor-asym",
                                    "int8-tensor-asym", "int4-tensor@mse", "int3-tensor@pot"])
def test_one_scale_per_tensor_found_from_chunks_equals_whole(stream_all, scheme):
    """A per-tensor scale is found from row chunks (range, then candidate errors) and each
    chunk quantized with it: the whole tensor's dequantized values, bit for bit."""
    model = open_model(DEMO)
    n = "model.embed_tokens.weight"
    info = model.info(n)
    assert not get_scheme(scheme).row_local and streaming.tensor_scale_chunked(info, scheme)
    parts = list(streaming.dequantized_rows(model, n, scheme))
    assert len(parts) > 2                                    # it did chunk
    assert [r0 for r0, _w, _d in parts] == sorted({r0 for r0, _w, _d in parts})
    got = np.concatenate([d for _r0, _w, d in parts])
    whole = model.read_matrix(n)
    want = quantize(whole, scheme, tensor=n)
    from workbench.quant.accel import dequantize
    assert np.array_equal(got, dequantize(want).reshape(whole.shape))
    assert not np.array_equal(got, whole)


def test_percentile_tensor_scales_stay_whole(stream_all):
    model = open_model(DEMO)
    info = model.info("model.embed_tokens.weight")
    assert not streaming.tensor_scale_chunked(info, "int4-tensor@p99.9")
    assert not streaming.tensor_scale_chunked(info, "int4-tensor-asym@mse")
    assert not streaming.tensor_scale_chunked(info, "q4_k")          # row-local: `streamed`
    assert streaming.dequantized_in_chunks(info, "q4_k")

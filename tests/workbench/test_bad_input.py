"""Bad input: every case gives one clear one-line WorkbenchError naming the file/tensor, or is handled."""

from __future__ import annotations

import json
import math
import struct

import numpy as np
import pytest

from tests.conftest import write_safetensors_raw
from workbench.core.errors import WorkbenchError
from workbench.quant.evaluate import evaluate, evaluate_tensor
from workbench.formats.loaders import open_model
from workbench.quant.plan import Plan
from workbench.core.progress import run
from workbench.schemes import get_scheme, list_schemes
from workbench.quant.stats import model_stats, tensor_stats


def _err(path, *needles):
    with pytest.raises(WorkbenchError) as ei:
        open_model(path)
    msg = str(ei.value)
    assert "\n" not in msg, msg
    assert str(path) in msg, msg
    for n in needles:
        assert n.lower() in msg.lower(), msg
    return msg


def test_missing_file(tmp_path):
    _err(tmp_path / "nope.safetensors", "not found")
    _err(tmp_path / "nope.bin", "not found")
    _err(tmp_path / "nope.gguf", "not found")


def test_empty_file(tmp_path):
    p = tmp_path / "empty.safetensors"
    p.write_bytes(b"")
    _err(p, "truncated")


def _valid_file(tmp_path, name="ok.safetensors"):
    header = {"a": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]},
              "b": {"dtype": "F16", "shape": [8], "data_offsets": [64, 80]}}
    data = np.arange(16, dtype=np.float32).tobytes() + np.ones(8, np.float16).tobytes()
    return write_safetensors_raw(tmp_path / name, header, data)


def test_truncated_in_header(tmp_path):
    p = _valid_file(tmp_path)
    blob = p.read_bytes()
    p.write_bytes(blob[:8 + 20])
    _err(p, "truncated")
    p.write_bytes(blob[:5])
    _err(p, "truncated")


def test_truncated_in_data(tmp_path):
    p = _valid_file(tmp_path)
    blob = p.read_bytes()
    p.write_bytes(blob[:-3])
    msg = _err(p, "truncated")
    assert "'b'" in msg  # names the tensor whose data is cut


@pytest.mark.parametrize("header_bytes, needle", [
    (b"{not json at all}", "corrupt"),
    (b"[1, 2, 3]", "not a json object"),
    (b"\"a string\"", "not a json object"),
    (b"\xff\xfe{}", "corrupt"),
    (b'{"a": 5}', "not an object"),
    (b'{"__metadata__": [1]}', "__metadata__"),
    (b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0]}}', "data_offsets"),
    (b'{"a": {"dtype": "F32", "shape": "2", "data_offsets": [0, 8]}}', "shape"),
    (b'{"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}', "shape"),
    (b'{"a": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}}', "shape"),
    (b'{"a": {"dtype": "F32", "shape": [true, 2], "data_offsets": [0, 8]}}', "shape"),
    (b'{"a": {"shape": [2], "data_offsets": [0, 8]}}', "dtype"),
    (b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 1e1]}}', "data_offsets"),
    (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, ' + b"9" * 5000 + b"]}}", ""),
    (b"[" * 100000 + b"]" * 100000, "corrupt"),
], ids=lambda v: v[:40].decode("latin-1") if isinstance(v, bytes) else v)
def test_corrupt_header(tmp_path, header_bytes, needle):
    p = tmp_path / "bad.safetensors"
    header_bytes += b" " * ((-len(header_bytes)) % 8)
    p.write_bytes(len(header_bytes).to_bytes(8, "little") + header_bytes + b"\0" * 8)
    _err(p, needle)


def test_wrong_magic_png(tmp_path):
    p = tmp_path / "picture.safetensors"
    p.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0\0\0\rIHDR" + b"\0" * 100)
    _err(p, "not a safetensors file")


def test_unrecognised_file_without_suffix(tmp_path):
    p = tmp_path / "weights"
    p.write_bytes(b"hello world, not a model")
    _err(p, "unrecognised")


def test_folder_without_models(tmp_path):
    (tmp_path / "readme.txt").write_text("x")
    _err(tmp_path, "no model files")


@pytest.mark.parametrize("entries, needle", [
    # offsets beyond the end of the file
    ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [100, 116]}}, "truncated or lying"),
    # size != numel * itemsize
    ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}}, "needs 16"),
    ({"a": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 16]}}, "needs 8"),
    # end before begin
    ({"a": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}}, "data_offsets"),
    ({"a": {"dtype": "F32", "shape": [0], "data_offsets": [-4, -4]}}, "data_offsets"),
    # overlapping tensors
    ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
      "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}, "overlap"),
    ({"a": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]},
      "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
      "c": {"dtype": "F32", "shape": [1], "data_offsets": [16, 20]}}, "overlap"),
    # unsupported dtypes
    ({"a": {"dtype": "F4", "shape": [4], "data_offsets": [0, 2]}}, "unsupported dtype F4"),
    ({"a": {"dtype": "C64", "shape": [4], "data_offsets": [0, 32]}}, "unsupported dtype C64"),
])
def test_lying_header(tmp_path, entries, needle):
    p = write_safetensors_raw(tmp_path / "lie.safetensors", entries, b"\0" * 32)
    msg = _err(p, needle)
    if "overlap" not in needle:
        assert "tensor 'a'" in msg


def test_empty_zero_d_and_one_d_tensors_are_handled(tmp_path):
    header = {"empty": {"dtype": "F32", "shape": [0, 4], "data_offsets": [0, 0]},
              "empty_cols": {"dtype": "F32", "shape": [3, 0], "data_offsets": [0, 0]},
              "scalar": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]},
              "vec": {"dtype": "F32", "shape": [5], "data_offsets": [4, 24]}}
    data = struct.pack("<f", 2.5) + np.array([1, -2, 3, -4, 5], np.float32).tobytes()
    p = write_safetensors_raw(tmp_path / "edge.safetensors", header, data)
    m = open_model(p)
    assert m.read("empty").shape == (0, 4)
    assert m.read("empty_cols").shape == (3, 0)
    assert m.read("scalar").shape == () and float(m.read("scalar")) == 2.5
    np.testing.assert_array_equal(m.read("vec"), [1, -2, 3, -4, 5])
    stats = run(model_stats(m, cache=None))
    assert stats["empty"].count == 0 and math.isnan(stats["empty"].min)
    assert stats["empty_cols"].count == 0 and stats["empty_cols"].ch_min.shape == (3,)
    s = stats["scalar"]
    assert (s.count, s.min, s.max, s.mean, s.std) == (1, 2.5, 2.5, 2.5, 0.0)
    v = stats["vec"]
    assert (v.min, v.max, v.absmax, v.count) == (-4.0, 5.0, 5.0, 5)
    assert v.mean == pytest.approx(0.6)
    # evaluate: plan default keeps 1-D/0-D; empty 2-D tensors are quantized to nothing
    ev = run(evaluate(m, Plan("int8-channel"), cache=None))
    assert ev.tensors["vec"].scheme == "keep" and ev.tensors["scalar"].scheme == "keep"
    assert ev.tensors["empty"].scheme == "int8-channel" and ev.tensors["empty"].bytes == 0
    assert ev.totals.params == 0 + 0 + 1 + 5
    # an explicit scheme on 1-D / 0-D tensors works too
    for name in ("vec", "scalar"):
        r = evaluate_tensor(m, name, "int8-channel", cache=None)
        assert r.scheme == "int8-channel"
        assert r.error.rel_rmse < 0.01
        assert r.bytes == get_scheme("int8-channel").nbytes(m.info(name).shape)


def test_nan_inf_counted_excluded_and_refused_by_quantizers(make_safetensors):
    w = np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32)
    w[0, 0] = np.nan
    w[3, 5] = np.inf
    w[7, 9] = -np.inf
    w[7, 10] = np.nan
    p = make_safetensors({"model.layers.0.mlp.up_proj.weight": w})
    m = open_model(p)
    name = "model.layers.0.mlp.up_proj.weight"
    st = run(tensor_stats(m, name))
    fin = w[np.isfinite(w)]
    assert (st.nan, st.inf, st.count) == (2, 2, w.size - 4)
    assert st.min == fin.min() and st.max == fin.max() and st.absmax == np.abs(fin).max()
    assert st.hist_counts.sum() == fin.size
    assert np.isfinite(st.hist_edges).all()
    assert np.isfinite(st.ch_min).all() and np.isfinite(st.ch_absmax).all()
    for scheme in ("int8-channel", "int4-g64", "nf4-g64", "ternary-g64", "fp8-e4m3"):
        with pytest.raises(WorkbenchError) as ei:
            evaluate_tensor(m, name, scheme, cache=None)
        msg = str(ei.value)
        assert name in msg and "NaN/Inf" in msg and "4" in msg, msg
    with pytest.raises(WorkbenchError, match="NaN/Inf"):
        run(evaluate(m, Plan("int4-channel"), cache=None))


def test_all_nan_tensor_stats(make_safetensors):
    p = make_safetensors({"w": np.full((3, 4), np.nan, np.float32)})
    st = run(tensor_stats(open_model(p), "w"))
    assert (st.nan, st.inf, st.count) == (12, 0, 0)
    assert math.isnan(st.min) and st.hist_counts.sum() == 0


def test_scheme_eligibility_reasons():
    for name in list_schemes():
        s = get_scheme(name)
        if s.block_size:
            reason = s.ineligible_reason((4, s.block_size + 1))
            assert reason and str(s.block_size) in reason and str(s.block_size + 1) in reason
            with pytest.raises(WorkbenchError) as ei:
                s.quantize(np.zeros((4, s.block_size + 1), np.float32), tensor="x.weight")
            assert "x.weight" in str(ei.value) and str(s.block_size) in str(ei.value)
            assert s.can_take((4, 2 * s.block_size))
        else:
            assert s.ineligible_reason((3, 7)) is None


def test_evaluate_ineligible_tensor_falls_back_with_note(make_safetensors):
    p = make_safetensors({"w": np.ones((4, 48), np.float32), "v": np.ones((4, 40), np.float32)})
    m = open_model(p)
    # a group scheme that does not fit falls back to per-channel of the same bits
    r = evaluate_tensor(m, "w", "int4-g32", cache=None)
    assert r.scheme == "int4-channel" and r.requested == "int4-g32" and r.kind == "fallback"
    assert "multiple of 32" in r.note and "48" in r.note
    # a GGML type: llama-quantize's chain, Q6_K -> Q8_0 -> (rows of 40 fit no block) F16
    r = evaluate_tensor(m, "v", "q6_k", cache=None)
    assert r.scheme == "fp16" and r.kind == "fallback"


def test_non_float_tensors_are_kept(make_safetensors):
    p = make_safetensors({"ids": np.arange(12, dtype=np.int64).reshape(3, 4),
                          "w": np.ones((3, 64), np.float32)})
    m = open_model(p)
    assert Plan("int8-channel").resolve(m) == {"ids": "keep", "w": "int8-channel"}
    r = evaluate_tensor(m, "ids", "int8-channel", cache=None)
    assert r.scheme == "keep" and "I64" in r.note and r.bytes == 96


def test_header_with_json_duplicate_and_unicode_names(tmp_path):
    header = {"wéight.ü": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}
    p = write_safetensors_raw(tmp_path / "u.safetensors", header, struct.pack("<f", 7.0))
    assert open_model(p).read("wéight.ü").tolist() == [7.0]


def test_metadata_values_become_strings(tmp_path):
    header = {"__metadata__": {"n": 3}, "a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}
    p = write_safetensors_raw(tmp_path / "m.safetensors", header, b"\x05")
    m = open_model(p)
    assert m.metadata == {"n": "3"}
    assert json.loads(json.dumps(m.metadata))

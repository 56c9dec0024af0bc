"""The project's GGUF reader (workbench.formats.loaders.gguf_reader) against the `gguf` package's
GGUFReader on files written by GGUFWriter: every key/value and every tensor's bytes agree."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

from workbench.core.errors import WorkbenchError
from workbench.formats.loaders.gguf_reader import GGUFFile

ROOT = Path(__file__).resolve().parents[2]
VT = gguf.GGUFValueType


def _write(path, alignment=None):
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment:
        w.add_custom_alignment(alignment)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -5)
    w.add_uint16("t.u16", 65000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 0.1)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float64("t.f64", 1e-300)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo")
    w.add_array("t.arr_i32", [1, -2, 3])
    w.add_array("t.arr_f32", [0.5, 1.5])
    w.add_array("t.arr_str", ["a", "", "ünï"])
    w.add_key_value("t.arr_bool", [True, False, True], VT.ARRAY, sub_type=VT.BOOL)
    rng = np.random.default_rng(0)
    tensors = {
        "f32": rng.standard_normal((3, 5)).astype(np.float32),
        "f16": rng.standard_normal((4, 8)).astype(np.float16),
        "i32": np.arange(7, dtype=np.int32),
    }
    for k, v in tensors.items():
        w.add_tensor(k, v)
    q = np.arange(2 * 34, dtype=np.uint8).reshape(2, 34)       # two Q8_0 rows of 32 values
    w.add_tensor("q8", q, raw_shape=(2, 34), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("alignment", [None, 64])
def test_fields_and_tensors_match_the_gguf_package(tmp_path, alignment):
    p = tmp_path / "t.gguf"
    _write(p, alignment)
    ref = gguf.GGUFReader(str(p))
    ours = GGUFFile(p)
    assert ours.alignment == (alignment or 32)
    keys = [k for k in ref.fields if not k.startswith("GGUF.")]
    assert keys == list(ours.fields)
    for k in keys:
        rf, of = ref.fields[k], ours.fields[k]
        assert [int(t) for t in rf.types] == [int(t) for t in of.types], k
        assert rf.contents() == of.contents(), k
    assert ours.fields["t.u64"].value == 2**63 + 5
    assert ours.fields["t.arr_str"].value == [b"a", b"", "ünï".encode()]
    assert [t.name for t in ref.tensors] == [t.name for t in ours.tensors]
    for rt, ot in zip(ref.tensors, ours.tensors):
        assert ot.tensor_type == rt.tensor_type
        assert [int(x) for x in rt.shape] == ot.shape
        assert ot.n_bytes == int(rt.n_bytes) and ot.data_offset == int(rt.data_offset)
        assert np.asarray(rt.data).tobytes() == ot.data.tobytes()


def _header(kv: bytes, n_kv: int, tensors: bytes = b"", n_t: int = 0) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_t, n_kv) + kv + tensors


def _kv_u32(key: bytes, v: int) -> bytes:
    return struct.pack("<Q", len(key)) + key + struct.pack("<II", 4, v)


@pytest.mark.parametrize("blob, message", [
    (_header(_kv_u32(b"a", 1) * 2, 2) + b"\0" * 32, "appears twice"),
    (_header(_kv_u32(b"general.alignment", 48), 1) + b"\0" * 32, "power of two"),
    (_header(b"", 0, struct.pack("<Q", 1) + b"w" + struct.pack("<IQQIQ", 2, 32, 4, 0, 0), 1)
     + b"\0" * 64, "runs past the end"),
    (_header(b"", 0, struct.pack("<Q", 1) + b"w" + struct.pack("<IQIQ", 1, 33, 8, 0), 1)
     + b"\0" * 96, "whole blocks"),
    (_header(b"", 0, struct.pack("<Q", 1) + b"w" + struct.pack("<IQIQ", 1, 4, 99, 0), 1)
     + b"\0" * 64, "unknown GGML tensor type"),
    (_header(struct.pack("<Q", 1) + b"k" + struct.pack("<I", 42), 1) + b"\0" * 32,
     "unknown GGUF value type 42"),
    (b"GGUF" + struct.pack("<IQQ", 3 << 24, 0, 0) + b"\0" * 8, "big-endian"),
])
def test_hostile_headers_are_refused_with_the_problem(tmp_path, blob, message):
    p = tmp_path / "bad.gguf"
    p.write_bytes(blob)
    with pytest.raises(WorkbenchError, match=message) as ei:
        GGUFFile(p)
    assert str(p) in str(ei.value)


def test_fast_metadata_writer_writes_the_packages_bytes(tmp_path):
    from workbench.export.gguf_header import _fast_writer_class
    rng = np.random.default_rng(1)
    toks = [f"tok{i}" for i in range(300)] + ["", "ünï", "\x00x"]
    scores = rng.standard_normal(len(toks)).astype(np.float32).tolist()
    blobs = []
    tup = tuple(toks)
    for i, cls in enumerate((gguf.GGUFWriter, _fast_writer_class())):
        p = tmp_path / f"w{i}.gguf"
        w = cls(str(p), "bert")
        w.add_token_list(toks)
        w.add_token_scores(scores)
        w.add_token_types([1, 3, 2] * (len(toks) // 3))
        w.add_key_value("t.bytes", [b"a", b"bc"] * 20, VT.ARRAY, sub_type=VT.STRING)
        w.add_key_value("t.u64", list(range(40)), VT.ARRAY, sub_type=VT.UINT64)
        w.add_key_value("t.bool", [True, False] * 20, VT.ARRAY, sub_type=VT.BOOL)
        w.add_array("t.short", [1, 2, 3])
        # arrays given without an item type (as add_token_list and friends give them): the
        # type the package infers, packed in one go
        w.add_array("t.ints", list(range(-50, 50)) + [2**31 - 1, -2**31])
        w.add_array("t.floats", [1e30, -2.5, 0.1, float("inf")] * 10)
        w.add_array("t.bytes2", [b"a", b"bc"] * 20)
        # token types as gguf's enum (an int subclass), not left to the package item by item
        w.add_array("t.enums", [gguf.TokenType.NORMAL, gguf.TokenType.CONTROL] * 20)
        w.add_array("t.flags", [True, False] * 20)            # bools stay the package's
        # a tokenizer's replayed arrays are tuples, packed once and reused: same bytes twice
        w.add_array("t.tup1", tup)
        w.add_array("t.tup2", tup)
        w.add_tensor("x", np.arange(8, dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        blobs.append(p.read_bytes())
    assert blobs[0] == blobs[1]
    from workbench.export.gguf_header import _PACKED
    assert any(v[0] is tup for v in _PACKED.values())


def test_misaligned_gguf_offset_is_refused_with_the_tensor(tmp_path):
    from workbench.formats.loaders import open_model

    def gstr(b):
        return struct.pack("<Q", len(b)) + b

    def write(shift):
        data = np.arange(64, dtype=np.float32).tobytes()
        head = b"GGUF" + struct.pack("<IQQ", 3, 1, 1)
        head += gstr(b"general.architecture") + struct.pack("<I", 8) + gstr(b"llama")
        head += gstr(b"blk.0.attn_q.weight") + struct.pack("<I", 2) + struct.pack("<2Q", 32, 2)
        head += struct.pack("<IQ", 0, shift)
        head += b"\0" * ((-len(head)) % 32)
        body = bytearray(96 + shift)
        body[shift:shift + len(data)] = data
        p = tmp_path / f"s{shift}.gguf"
        p.write_bytes(head + bytes(body))
        return p

    m = open_model(write(0))
    np.testing.assert_array_equal(m.read_matrix("blk.0.attn_q.weight").reshape(-1),
                                  np.arange(64, dtype=np.float32))
    for shift in (4, 16):
        with pytest.raises(WorkbenchError, match="breaks the file's 32-byte alignment") as e:
            open_model(write(shift))
        assert "blk.0.attn_q.weight" in str(e.value)


def test_gguf_with_sparse_padding_is_read(tmp_path, demo_gguf):
    """A valid GGUF followed by 100 GB of sparse padding: the header is read as far as it
    goes (before: the whole file memory-mapped, which a 2 GiB address-space limit refuses,
    and the file was called corrupt)."""
    import subprocess
    import sys
    pad = tmp_path / "pad.gguf"
    pad.write_bytes(demo_gguf.read_bytes())
    os.truncate(pad, 100 << 30)
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30));"
            "from workbench.formats.loaders import open_model; m = open_model(sys.argv[1]);"
            "n = 'blk.0.attn_q.weight'; print(len(m.tensors), m.raw(n).shape)")
    r = subprocess.run([sys.executable, "-c", code, str(pad)], capture_output=True, text=True,
                       cwd=ROOT, timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr[-800:]
    from workbench.formats.loaders import open_model
    assert r.stdout.split()[0] == str(len(open_model(demo_gguf).tensors))


def test_gguf_header_read_in_steps_is_the_same(tmp_path, demo_gguf, monkeypatch):
    from workbench.formats.loaders.gguf_reader import GGUFFile
    whole = GGUFFile(demo_gguf)
    monkeypatch.setattr(GGUFFile, "HEADER_STEP", 7)      # every read a short one
    steps = GGUFFile(demo_gguf)
    assert [(t.name, t.shape, t.data_offset) for t in whole.tensors] == \
        [(t.name, t.shape, t.data_offset) for t in steps.tensors]
    assert {k: f.contents() for k, f in whole.fields.items()} == \
        {k: f.contents() for k, f in steps.fields.items()}

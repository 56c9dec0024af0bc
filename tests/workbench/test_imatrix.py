import struct

import numpy as np
import pytest

from workbench.core.errors import WorkbenchError
from workbench.running.imatrix import read_imatrix, write_imatrix_gguf


class _M:
    path = "x"
    format = "safetensors"
    tensors = {"model.layers.0.self_attn.q_proj.weight": None, "model.embed_tokens.weight": None,
               "model.layers.0.mlp.down_proj.weight": None}


def test_gguf_round_trip_with_llama_names(tmp_path):
    pytest.importorskip("gguf")
    s2 = np.array([4.0, 8.0, 12.0])
    stats = {"model.layers.0.self_attn.q_proj.weight": (s2, 4),
             "model.layers.0.mlp.down_proj.weight": (s2 * 2, 2)}
    out = tmp_path / "im.gguf"
    write_imatrix_gguf(_M(), stats, out, "calib.txt", 3, 10)
    got = read_imatrix(out)
    assert set(got) == {"blk.0.attn_q.weight", "blk.0.ffn_down.weight"}
    np.testing.assert_allclose(got["blk.0.attn_q.weight"], [1.0, 2.0, 3.0])
    np.testing.assert_allclose(got["blk.0.ffn_down.weight"], [4.0, 8.0, 12.0])
    import gguf
    r = gguf.GGUFReader(str(out))
    assert bytes(r.fields["general.type"].parts[-1]).decode() == "imatrix"
    assert int(r.fields["imatrix.chunk_count"].parts[-1][0]) == 3


def test_legacy_dat(tmp_path):
    name = b"blk.0.attn_q.weight"
    vals = np.array([2.0, 4.0], dtype="<f4")
    data = struct.pack("<i", 1) + struct.pack("<i", len(name)) + name + struct.pack("<ii", 2, 2) + vals.tobytes()
    p = tmp_path / "im.dat"
    p.write_bytes(data)
    got = read_imatrix(p)
    np.testing.assert_allclose(got["blk.0.attn_q.weight"], [1.0, 2.0])


def _dat(entries) -> bytes:
    out = struct.pack("<i", len(entries))
    for name, ncall, vals in entries:
        nb = name.encode()
        out += struct.pack("<i", len(nb)) + nb + struct.pack("<ii", ncall, len(vals))
        out += np.asarray(vals, "<f4").tobytes()
    return out


def test_imatrix_dat_roundtrip_and_corruptions(tmp_path):
    from workbench.running.imatrix import read_imatrix
    good = _dat([("blk.0.attn_q.weight", 4, np.full(64, 8.0))])
    p = tmp_path / "x.dat"
    p.write_bytes(good)
    np.testing.assert_allclose(read_imatrix(p)["blk.0.attn_q.weight"], np.full(64, 2.0))
    bad = {
        "count": struct.pack("<i", 2**31 - 1) + good[4:],
        "name": good[:4] + struct.pack("<i", 2**30) + good[8:],
        "nval": good[:4 + 4 + 19 + 4] + struct.pack("<i", 2**30) + good[4 + 4 + 19 + 8:],
        "truncated": good[:-9],
        "nan": _dat([("a", 1, [1.0, float("nan")])]),
        "negative": _dat([("a", 1, [1.0, -2.0])]),
    }
    for why, raw in bad.items():
        p.write_bytes(raw)
        with pytest.raises(WorkbenchError) as e:
            read_imatrix(p)
        assert str(p) in str(e.value), (why, str(e.value))


def test_imatrix_gguf_must_be_an_imatrix_of_f32_sums(tmp_path):
    import gguf

    from workbench.running.imatrix import check_imatrix_for, read_imatrix
    from workbench.formats.model import Model, TensorInfo

    def write(kind, dtype=np.float32):
        p = tmp_path / f"{kind}-{np.dtype(dtype).name}.gguf"
        w = gguf.GGUFWriter(str(p), arch="")
        w.add_type(kind)
        w.add_tensor("blk.0.attn_q.weight.in_sum2", np.full((1, 64), 6.0, dtype))
        w.add_tensor("blk.0.attn_q.weight.counts", np.full((1, 1), 3.0, np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return p

    im = read_imatrix(write("imatrix"))
    np.testing.assert_allclose(im["blk.0.attn_q.weight"], np.full(64, 2.0))
    for p, match in ((write("model"), "not an imatrix"), (write("imatrix", np.float16),
                                                          "expected F32")):
        with pytest.raises(WorkbenchError, match=match) as e:
            read_imatrix(p)
        assert str(p) in str(e.value)
    info = TensorInfo("blk.0.attn_q.weight", (8, 32), "F32", 1024, "model.safetensors")
    m = Model("model.safetensors", "safetensors", {info.name: info}, lambda n: None, {})
    with pytest.raises(WorkbenchError, match="64 values for a tensor of 32") as e:
        check_imatrix_for(m, "x.gguf", info.name, im[info.name])
    assert "x.gguf" in str(e.value)

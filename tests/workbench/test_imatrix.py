import struct

import numpy as np
import pytest

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

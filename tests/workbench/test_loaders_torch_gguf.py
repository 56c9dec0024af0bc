"""PyTorch checkpoints (safe loading, nested state dicts) and a basic GGUF open."""

from __future__ import annotations

import os
import pickle
import pickletools
import time

import numpy as np
import pytest
import torch

from workbench.core.errors import WorkbenchError
from workbench.formats.loaders import open_model
from workbench.core.progress import run
from workbench.quant.stats import reference_stats, tensor_stats


def _state():
    g = torch.Generator().manual_seed(0)
    return {"layers.0.attention.wq.weight": torch.randn(8, 16, generator=g),
            "layers.0.attention_norm.weight": torch.randn(16, generator=g).to(torch.bfloat16),
            "tok_embeddings.weight": torch.randn(10, 16, generator=g).to(torch.float16),
            "layers.0.feed_forward.w1.weight": torch.randn(4, 16, generator=g).to(torch.bfloat16),
            "fp8": torch.randn(3, 4, generator=g).to(torch.float8_e4m3fn),
            "steps": torch.tensor([1, 2, 3], dtype=torch.int64),
            "mask": torch.tensor([[True, False]]),
            "u16": torch.tensor([0, 65535], dtype=torch.uint16)}


def _assert_same(m, state):
    assert set(m.names()) == set(state)
    for n, t in state.items():
        info = m.info(n)
        assert info.shape == tuple(t.shape)
        assert info.nbytes == t.numel() * t.element_size()
        np.testing.assert_array_equal(m.read(n), t.to(torch.float32).numpy())


@pytest.mark.parametrize("suffix", [".bin", ".pt", ".pth"])
@pytest.mark.parametrize("wrap", [None, "state_dict", "model"])
def test_torch_checkpoint(tmp_path, suffix, wrap):
    state = _state()
    obj = state if wrap is None else {wrap: state, "epoch": 3, "optimizer": {"lr": 0.1}}
    p = tmp_path / f"ckpt{suffix}"
    torch.save(obj, p)
    m = open_model(p)
    assert m.format == "pytorch"
    _assert_same(m, state)
    assert m.info("layers.0.attention_norm.weight").dtype == "BF16"
    assert m.info("layers.0.attention.wq.weight").role == "attn_q"
    assert m.info("layers.0.feed_forward.w1.weight").role == "mlp_gate"
    # bf16 statistics through the kernel equal the reference
    st = run(tensor_stats(m, "layers.0.feed_forward.w1.weight"))
    ref = reference_stats(state["layers.0.feed_forward.w1.weight"].float().numpy())
    assert (st.min, st.max, st.count) == (ref.min, ref.max, ref.count)


def test_torch_nested_module_dict_is_flattened(tmp_path):
    p = tmp_path / "nested.pt"
    torch.save({"model": {"encoder": {"w": torch.ones(2, 2)}, "head": torch.zeros(3)}}, p)
    m = open_model(p)
    assert sorted(m.names()) == ["encoder.w", "head"]


def test_torch_legacy_format(tmp_path):
    p = tmp_path / "legacy.bin"
    state = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
    torch.save(state, p, _use_new_zipfile_serialization=False)
    np.testing.assert_array_equal(open_model(p).read("w"), state["w"].numpy())


def test_torch_folder(tmp_path):
    torch.save({"w": torch.ones(2, 3)}, tmp_path / "pytorch_model.bin")
    m = open_model(tmp_path)
    assert m.names() == ["w"]


def test_torch_sharded_index(tmp_path):
    import json
    a, b, c = torch.randn(4, 8), torch.randn(3), torch.randn(2, 8).bfloat16()
    torch.save({"a.weight": a, "b.bias": b}, tmp_path / "pytorch_model-00001-of-00002.bin")
    torch.save({"c.weight": c}, tmp_path / "pytorch_model-00002-of-00002.bin")
    index = {"weight_map": {"a.weight": "pytorch_model-00001-of-00002.bin",
                            "b.bias": "pytorch_model-00001-of-00002.bin",
                            "c.weight": "pytorch_model-00002-of-00002.bin"}}
    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    for target in (tmp_path, tmp_path / "pytorch_model.bin.index.json"):
        m = open_model(target)
        assert m.format == "pytorch" and sorted(m.names()) == ["a.weight", "b.bias", "c.weight"]
        np.testing.assert_array_equal(m.read("a.weight"), a.numpy())
        np.testing.assert_array_equal(m.read("c.weight"), c.float().numpy())
        assert m.info("c.weight").dtype == "BF16"
    (tmp_path / "pytorch_model.bin.index.json").unlink()
    with pytest.raises(WorkbenchError, match="2 PyTorch files and no index"):
        open_model(tmp_path)


class Evil:
    """Unpickling this runs code (a custom class: torch's safe loader must refuse it)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_pickle_with_custom_class_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    p = tmp_path / "evil.pt"
    torch.save({"w": torch.ones(2), "payload": Evil(str(marker))}, p)
    assert not marker.exists()
    with pytest.raises(WorkbenchError) as ei:
        open_model(p)
    msg = str(ei.value)
    assert str(p) in msg and "refused" in msg and "\n" not in msg
    assert not marker.exists()


def _global_pickle(marker) -> bytes:
    """A hand-made protocol-2 pickle: GLOBAL os.system, then call it with a shell command."""
    cmd = f"touch {marker}".encode()
    return (b"\x80\x02" + b"cos\nsystem\n" + b"X" + len(cmd).to_bytes(4, "little") + cmd
            + b"\x85R.")


@pytest.mark.parametrize("suffix", [".bin", ".pt", ".pth", ".ckpt"])
def test_handmade_global_pickle_is_refused_and_never_runs(tmp_path, suffix):
    marker = tmp_path / "pwned"
    p = tmp_path / f"evil{suffix}"
    p.write_bytes(_global_pickle(marker))
    ops = [op.name for op, _, _ in pickletools.genops(p.read_bytes())]
    assert "GLOBAL" in ops and "REDUCE" in ops
    with pytest.raises(WorkbenchError) as ei:
        open_model(p)
    assert str(p) in str(ei.value) and "\n" not in str(ei.value)
    assert not marker.exists()


def test_handmade_global_pickle_inside_zip_is_refused(tmp_path):
    """The same payload as data.pkl of a torch zip archive."""
    import zipfile
    marker = tmp_path / "pwned"
    good = tmp_path / "good.pt"
    torch.save({"w": torch.ones(2)}, good)
    bad = tmp_path / "evil.pt"
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(bad, "w", zipfile.ZIP_STORED) as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename.endswith("data.pkl"):
                data = _global_pickle(marker)
            zout.writestr(item, data)
    with pytest.raises(WorkbenchError, match="refused"):
        open_model(bad)
    assert not marker.exists()


def test_corrupt_and_truncated_torch_files(tmp_path):
    good = tmp_path / "g.pt"
    torch.save({"w": torch.ones(64, 64)}, good)
    blob = good.read_bytes()
    trunc = tmp_path / "t.pt"
    trunc.write_bytes(blob[: len(blob) // 2])
    junk = tmp_path / "j.bin"
    junk.write_bytes(b"\x80\x02this is not a pickle")
    empty = tmp_path / "e.pth"
    empty.write_bytes(b"")
    nothing = tmp_path / "n.pt"
    torch.save({"a": 1, "b": [1, 2]}, nothing)
    for p in (trunc, junk, empty, nothing):
        with pytest.raises(WorkbenchError) as ei:
            open_model(p)
        assert str(p) in str(ei.value) and "\n" not in str(ei.value)


def test_torch_data_is_memory_mapped(tmp_path, monkeypatch):
    p = tmp_path / "m.pt"
    torch.save({"w": torch.ones(4, 4)}, p)
    calls = []
    real = torch.load

    def spy(*a, **k):
        calls.append(k)
        return real(*a, **k)

    monkeypatch.setattr(torch, "load", spy)
    open_model(p)
    assert calls and calls[0].get("weights_only") is True and calls[0].get("mmap") is True


def test_pickle_module_never_used_directly(tmp_path, monkeypatch):
    """Nothing calls the unrestricted pickle.load on a checkpoint."""
    p = tmp_path / "m.pt"
    torch.save({"w": torch.ones(4, 4)}, p)

    def boom(*a, **k):
        raise AssertionError("unrestricted pickle.load used")

    monkeypatch.setattr(pickle, "load", boom)
    monkeypatch.setattr(pickle, "loads", boom)
    assert open_model(p).names() == ["w"]


# ---- GGUF (basic open; the GGUF engineer owns deeper tests) --------------------------------

def test_gguf_basic_open(tmp_path):
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(0)
    f32 = rng.standard_normal((4, 32)).astype(np.float32)
    q = rng.standard_normal((8, 64)).astype(np.float32)
    q8 = gguf.quants.quantize(q, gguf.GGMLQuantizationType.Q8_0)
    p = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    w.add_block_count(1)
    w.add_tensor("blk.0.attn_norm.weight", f32)
    w.add_tensor("blk.0.ffn_down.weight", q8, raw_shape=q8.shape,
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    m = open_model(p)
    assert m.format == "gguf"
    assert m.metadata.get("general.architecture") == "llama"
    a = m.info("blk.0.attn_norm.weight")
    b = m.info("blk.0.ffn_down.weight")
    assert (a.shape, a.dtype, a.role, a.block) == ((4, 32), "F32", "norm", 0)
    assert (b.shape, b.dtype, b.role, b.block) == ((8, 64), "Q8_0", "mlp_down", 0)
    assert b.nbytes == 8 * 2 * 34
    np.testing.assert_array_equal(m.read("blk.0.attn_norm.weight"), f32)
    ref = gguf.quants.dequantize(q8, gguf.GGMLQuantizationType.Q8_0)
    np.testing.assert_array_equal(m.read("blk.0.ffn_down.weight"), ref)
    assert np.abs(ref - q).max() < 0.05
    st = run(tensor_stats(m, "blk.0.ffn_down.weight"))
    assert st.max == ref.max() and st.count == ref.size


def test_gguf_truncated(tmp_path):
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x01" * 7)
    with pytest.raises(WorkbenchError) as ei:
        open_model(p)
    assert str(p) in str(ei.value)
    assert not os.path.exists(tmp_path / "pwned")


@pytest.mark.parametrize("kind", ["self", "wrapper", "mutual", "fanout"])
def test_self_referencing_pickles_are_refused_quickly(tmp_path, kind):
    import torch

    from workbench.formats.loaders import open_model
    t = torch.ones(2, 2)
    if kind == "self":
        d = {"w": t}
        d["x"] = d
    elif kind == "wrapper":
        d = {"w": t}
        d["state_dict"] = d
    elif kind == "mutual":
        a, b = {"w": t}, {"v": t}
        a["b"], b["a"] = b, a
        d = {"model": a}
    else:
        d = {"t": t}
        for _ in range(40):
            d = {"a": d, "b": d}
    p = tmp_path / "m.pt"
    torch.save(d, p)
    t0 = time.process_time()
    with pytest.raises(WorkbenchError, match="itself|cycle|shared"):
        open_model(p)
    assert time.process_time() - t0 < 5.0

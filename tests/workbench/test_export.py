"""Exports: quantized safetensors re-open to exactly the reference result; atomic writes."""

from __future__ import annotations

import errno
import json
import os

import numpy as np
import pytest
import torch
from safetensors import safe_open

from workbench.core.errors import WorkbenchError
from workbench.export import export, list_exporters
from workbench.formats.loaders import open_model
from workbench.quant.plan import KEEP, Plan, Rule
from workbench.core.progress import run
from workbench.schemes import get_scheme


def _mixed_plan():
    return Plan("int4-g128", [
        Rule("model.embed_tokens.weight", "fp16"),
        Rule("re:self_attn\\.q_proj", "nf4-g64"),
        Rule("re:self_attn\\.k_proj", "fp8-e4m3"),
        Rule("re:self_attn\\.v_proj", "int3-g64-asym@mse"),
        Rule("re:self_attn\\.o_proj", "ternary-g64"),
        Rule("re:mlp\\.down_proj", "int8-channel"),
        Rule("re:mlp\\.gate_proj", "int4-g32@pot"),
        Rule("lm_head.weight", "bf16"),
    ])


def test_exporters_registered():
    names = {e.name for e in list_exporters()}
    assert {"plan", "safetensors"} <= names


def test_quantized_safetensors_round_trip(tiny_llama, tmp_path):
    path, tensors = tiny_llama
    m = open_model(path)
    plan = _mixed_plan()
    out = tmp_path / "q.safetensors"
    info = run(export(m, plan, "safetensors", out))
    assert info["tensors"] == len(tensors)
    q = open_model(out)
    assert q.format == "quantized-safetensors"
    assert set(q.names()) == set(tensors)
    assignment = plan.resolve(m)
    n_quant = 0
    for n, w in tensors.items():
        scheme = assignment[n]
        got = q.read(n)
        assert got.shape == w.shape and got.dtype == np.float32
        if scheme == KEEP:
            np.testing.assert_array_equal(got, w)
            assert q.info(n).quant is None
        else:
            n_quant += 1
            s = get_scheme(scheme)
            ref_qt = s.quantize(w)
            np.testing.assert_array_equal(got, s.dequantize(ref_qt).reshape(w.shape))
            assert q.info(n).quant == s.name and q.info(n).display_dtype == s.name
            assert q.info(n).nbytes == ref_qt.nbytes == s.nbytes(w.shape)
    assert info["quantized"] == n_quant
    assert json.loads(q.metadata["quant_workbench.plan"]) == plan.to_dict()
    # the file is a valid safetensors file for the reference library too
    with safe_open(str(out), framework="pt") as f:
        keys = set(f.keys())
        meta = json.loads(f.metadata()["quant_workbench"])
        assert meta["version"] == 1
        qk = "model.layers.0.mlp.down_proj.weight"
        assert {qk + "::codes", qk + "::scales"} <= keys
        assert meta["tensors"][qk]["scheme"] == "int8-channel"
        codes = f.get_tensor(qk + "::codes").numpy()
        ref = get_scheme("int8-channel").quantize(tensors[qk])
        np.testing.assert_array_equal(codes, ref.arrays["codes"])
        np.testing.assert_array_equal(f.get_tensor("model.norm.weight").numpy(),
                                      tensors["model.norm.weight"])
    # the quantized model can be inspected and evaluated again (statistics over dequantized data)
    from workbench.quant.stats import tensor_stats
    st = run(tensor_stats(q, "model.layers.1.mlp.down_proj.weight"))
    assert st.count == 256 * 512
    # out file is smaller than the original
    assert out.stat().st_size < path.stat().st_size / 2.5


def test_export_keeps_bf16_and_ints_bit_exact(make_safetensors, tmp_path):
    bf = torch.randn(4, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    p = make_safetensors({"n.weight": bf[0].clone(), "ids": torch.arange(6).reshape(2, 3),
                          "w": bf, "mask": torch.tensor([True, False])})
    out = tmp_path / "o.safetensors"
    run(export(open_model(p), Plan("int8-channel"), "safetensors", out))
    with safe_open(str(out), framework="pt") as f:
        assert torch.equal(f.get_tensor("n.weight"), bf[0])
        assert torch.equal(f.get_tensor("ids"), torch.arange(6).reshape(2, 3))
        assert torch.equal(f.get_tensor("mask"), torch.tensor([True, False]))
    q = open_model(out)
    assert q.info("n.weight").dtype == "BF16"
    np.testing.assert_array_equal(q.read("w"), get_scheme("int8-channel").dequantize(
        get_scheme("int8-channel").quantize(bf.float().numpy())))


def test_reexporting_a_quantized_model_keeps_values(tiny_llama, tmp_path):
    path, tensors = tiny_llama
    out1, out2 = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    run(export(open_model(path), Plan("int8-channel"), "safetensors", out1))
    q1 = open_model(out1)
    run(export(q1, Plan("fp32"), "safetensors", out2))
    q2 = open_model(out2)
    for n in tensors:
        np.testing.assert_array_equal(q2.read(n), q1.read(n))


def test_plan_export(tiny_llama, tmp_path):
    path, _ = tiny_llama
    out = tmp_path / "plan.json"
    plan = _mixed_plan()
    info = run(export(open_model(path), plan, "plan", out))
    assert info["rules"] == len(plan.rules)
    assert Plan.load(out) == plan


@pytest.mark.parametrize("fail_after", [0, 3])
def test_disk_full_leaves_existing_file_and_no_temp_files(tiny_llama, tmp_path, monkeypatch,
                                                          fail_after):
    path, _ = tiny_llama
    out = tmp_path / "out" / "q.safetensors"
    out.parent.mkdir()
    out.write_bytes(b"previous export")
    m = open_model(path)
    import workbench.export.st_writer as stw
    real_fdopen = os.fdopen
    calls = {"n": 0}

    class FullFile:
        def __init__(self, fh):
            self._fh = fh

        def write(self, data):
            calls["n"] += 1
            if calls["n"] > fail_after:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self._fh.write(data)

        def __getattr__(self, k):
            return getattr(self._fh, k)

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return self._fh.__exit__(*a)

    monkeypatch.setattr(stw.os, "fdopen", lambda *a, **k: FullFile(real_fdopen(*a, **k)))
    import workbench.core.atomic as atomic
    monkeypatch.setattr(atomic.os, "fdopen", lambda *a, **k: FullFile(real_fdopen(*a, **k)))
    with pytest.raises(WorkbenchError) as ei:
        run(export(m, Plan("int4-g64"), "safetensors", out))
    msg = str(ei.value)
    assert "disk full" in msg and str(out) in msg and "\n" not in msg
    assert out.read_bytes() == b"previous export"
    assert sorted(os.listdir(out.parent)) == ["q.safetensors"]


def test_disk_full_while_assembling(tiny_llama, tmp_path, monkeypatch):
    """ENOSPC in the final copy (header + data) also leaves the old file and no temp files."""
    path, _ = tiny_llama
    out = tmp_path / "o" / "q.safetensors"
    out.parent.mkdir()
    out.write_bytes(b"old")
    import shutil

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shutil, "copyfileobj", full)
    with pytest.raises(WorkbenchError, match="disk full"):
        run(export(open_model(path), Plan("int8-channel"), "safetensors", out))
    assert out.read_bytes() == b"old"
    assert os.listdir(out.parent) == ["q.safetensors"]


def test_plan_save_disk_full(tmp_path, monkeypatch):
    out = tmp_path / "plan.json"
    out.write_text("old")
    import workbench.core.atomic as atomic

    def boom(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", boom)
    with pytest.raises(WorkbenchError, match="disk full"):
        Plan("int8-channel").save(out)
    assert out.read_text() == "old" and os.listdir(tmp_path) == ["plan.json"]


def test_export_failure_midway_cleans_up(make_safetensors, tmp_path):
    w = np.ones((4, 64), np.float32)
    bad = w.copy()
    bad[0, 0] = np.nan
    p = make_safetensors({"a": w, "b": bad})
    out = tmp_path / "x" / "q.safetensors"
    out.parent.mkdir()
    with pytest.raises(WorkbenchError, match="'b'.*NaN/Inf"):
        run(export(open_model(p), Plan("int8-channel"), "safetensors", out))
    assert os.listdir(out.parent) == []


def test_export_to_missing_folder(tiny_llama, tmp_path):
    path, _ = tiny_llama
    for fmt in ("plan", "safetensors"):
        with pytest.raises(WorkbenchError, match="output folder does not exist"):
            run(export(open_model(path), Plan("int8-channel"), fmt, tmp_path / "no" / "x"))


def test_corrupt_quant_metadata(tmp_path, make_safetensors):
    p = make_safetensors({"w::codes": np.zeros(4, np.uint8)},
                         metadata={"quant_workbench": "{not json"})
    with pytest.raises(WorkbenchError, match="corrupt quant_workbench metadata"):
        open_model(p)
    p2 = make_safetensors({"w::codes": np.zeros(4, np.uint8)}, metadata={"quant_workbench": json.dumps(
        {"version": 1, "tensors": {"w": {"scheme": "int8-channel", "shape": [2, 2],
                                         "arrays": ["codes", "scales"]}}})})
    with pytest.raises(WorkbenchError, match="missing its array"):
        open_model(p2)
    p3 = make_safetensors({"w::codes": np.zeros(4, np.uint8)}, metadata={"quant_workbench": json.dumps(
        {"version": 1, "tensors": {"w": {"scheme": "int99", "shape": [2, 2], "arrays": ["codes"]}}})})
    with pytest.raises(WorkbenchError) as ei:
        open_model(p3)
    assert str(p3) in str(ei.value)

"""A GGUF given to a model-level command is read as the float Hugging Face model `convert --to
hf` writes, converted on the fly (workbench.export.convert.live), on tiny generated llama /
gemma3_text models exported to Q4_0 GGUFs by the project's exporter."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from workbench.cli import main
from workbench.export.convert import convert
from workbench.export import export
from workbench.formats.loaders import open_model
from workbench.quant.plan import Plan
from workbench.core.progress import run

pytest.importorskip("transformers")
ARCHS = ["llama", "gemma3_text"]


def _companions() -> set[str]:
    return {e for e in os.listdir(tempfile.gettempdir())
            if e.startswith(f"quant-workbench-gguf-hf-{os.getpid()}-")}


@pytest.fixture(scope="module")
def pairs(tiny_arch, tmp_path_factory):
    """{arch: (Q4_0 GGUF, the folder `convert --to hf --dtype f32` writes from it)}; the norm
    gains varied (Gemma's are stored as 1 + w in the GGUF)."""
    from safetensors.numpy import load_file, save_file
    d = tmp_path_factory.mktemp("live")
    out = {}
    for arch in ARCHS:
        folder = d / f"src-{arch}"
        shutil.copytree(tiny_arch(arch), folder)
        st = load_file(str(folder / "model.safetensors"))
        rng = np.random.default_rng(1)
        for k, v in st.items():
            if k.endswith("norm.weight"):
                st[k] = (v + rng.normal(0, 0.3, v.shape)).astype(v.dtype)
        save_file(st, str(folder / "model.safetensors"), metadata={"format": "pt"})
        f32 = d / f"{arch}-f32.gguf"
        run(export(open_model(folder), Plan(default="fp32"), "gguf", f32))
        q4 = d / "ggufs" / f"{arch}-q4_0.gguf"      # a folder of its own: no config.json beside
        q4.parent.mkdir(exist_ok=True)
        run(export(open_model(f32), Plan(default="q4_0"), "gguf", q4))
        run(convert(q4, "hf", d / f"hf-{arch}", dtype="f32"))
        out[arch] = (q4, d / f"hf-{arch}")
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_live_model_has_the_converted_folders_names_and_values(pairs, arch):
    from workbench.export.convert.live import open_live, wants_live
    gguf, hf = pairs[arch]
    assert wants_live(gguf) and not wants_live(hf / "model.safetensors")
    before = _companions()
    live = run(open_live(gguf))
    folder = open_model(hf)
    assert live.path == str(gguf) and live.format == "gguf-as-hf"
    assert list(live.tensors) == list(folder.tensors)
    for n, info in live.tensors.items():
        assert info.dtype == "F32" and info.shape == folder.info(n).shape, n
        np.testing.assert_array_equal(live.read(n), folder.read(n), err_msg=n)
        chunks = [c for _r0, c in live.iter_rows(n, max_elements=600)]   # row-chunked reads
        np.testing.assert_array_equal(np.concatenate(chunks), folder.read_matrix(n), err_msg=n)
    comp = Path(live.folder)
    assert comp.name in _companions() - before
    assert json.loads((comp / "config.json").read_text())["dtype"] == "float32"
    assert (comp / "tokenizer.json").is_file()
    live.close()
    assert not comp.exists() and _companions() == before


def _kld(capsys, *argv):
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err
    d = json.loads(capsys.readouterr().out)["kld"]
    return {k: v for k, v in d.items() if k not in ("seconds", "cache")}


@pytest.mark.parametrize("arch", ARCHS)
def test_check_on_the_gguf_equals_check_on_the_converted_folder(pairs, arch, capsys):
    gguf, hf = pairs[arch]
    common = ["--scheme", "q8_0", "--samples", "4"]
    a = _kld(capsys, "check", str(gguf), *common)
    b = _kld(capsys, "check", str(hf), *common)
    assert a == b and a["tokens"] > 0 and a["ppl_ratio"] > 1.0


def test_allocate_on_the_gguf_equals_allocate_on_the_converted_folder(pairs, tmp_path, capsys):
    import gguf as gg
    gguf, hf = pairs["llama"]
    out = {}
    for label, src in (("gguf", gguf), ("hf", hf)):
        plan = tmp_path / f"{label}.json"
        assert main(["allocate", str(src), "--budget-bpw", "6", "--schemes", "q4_0,q8_0",
                     "--target", "llama.cpp", "--samples", "4", "--methods", "rtn",
                     "-o", str(plan), "--json"]) == 0
        d = json.loads(capsys.readouterr().out)
        out[label] = (json.loads(plan.read_text()), d["measure"], d["predicted"])
    assert out["gguf"] == out["hf"] and out["gguf"][1] != "weight"
    # the plan names the Hugging Face tensors, and export applies it to the GGUF the same way
    names = json.dumps(out["gguf"][0])
    assert "model.layers.0.self_attn.q_proj.weight" in names and "blk.0" not in names
    files = [tmp_path / "a.gguf", tmp_path / "b.gguf"]
    for src, dst in zip((gguf, hf), files):
        assert main(["export", str(src), "--plan", str(tmp_path / "gguf.json"),
                     "--format", "gguf", "-o", str(dst)]) == 0
    a, b = (gg.GGUFReader(str(f)) for f in files)
    assert [t.name for t in a.tensors] == [t.name for t in b.tensors]
    assert "Q4_0" in {t.tensor_type.name for t in a.tensors}
    for ta, tb in zip(a.tensors, b.tensors):
        assert ta.tensor_type == tb.tensor_type and np.array_equal(ta.data, tb.data), ta.name


def test_inspect_still_reads_the_ggufs_own_tensors(pairs, capsys):
    gguf, _ = pairs["llama"]
    assert main(["inspect", str(gguf), "--no-stats", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["format"] == "gguf"
    assert {t["name"]: t["dtype"] for t in d["tensors"]}["blk.0.attn_q.weight"] == "Q4_0"


def test_a_gguf_with_a_config_beside_it_runs_as_before(pairs, tmp_path):
    from workbench.export.convert.live import wants_live
    gguf, hf = pairs["llama"]
    (tmp_path / "m.gguf").symlink_to(gguf)
    shutil.copy(hf / "config.json", tmp_path / "config.json")
    assert not wants_live(tmp_path / "m.gguf")


def test_unsupported_architecture_is_refused_naming_file_and_architecture(tmp_path, capsys):
    import gguf
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_tensor("blk.0.ssm_in.weight", np.ones((8, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    for cmd in (["check", str(path), "--scheme", "q8_0"],
                ["calibrate", str(path), "-o", str(tmp_path / "im.gguf")]):
        assert main(cmd) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and str(path) in err[0] and "'mamba'" in err[0], err
    assert not (tmp_path / "im.gguf").exists()


def test_companion_file_errors_name_the_gguf(pairs):
    from workbench.export.convert.live import open_live, public_error
    from workbench.core.errors import WorkbenchError
    gguf, _ = pairs["llama"]
    live = run(open_live(gguf))
    try:
        e = public_error(WorkbenchError("bad", path=os.path.join(live.folder, "tokenizer.json")))
        assert str(e) == f"{gguf} (its tokenizer.json, built from the GGUF's metadata): bad"
    finally:
        live.close()


def test_qwen3_head_size_comes_from_the_ggufs_key_length(tiny_arch, tmp_path):
    """transformers' Qwen3 GGUF config leaves head_dim at 128; llama.cpp reads
    attention.key_length (64 here): the live model and convert both take the GGUF's."""
    from workbench.export.convert.live import open_live
    src = tiny_arch("qwen3")
    (tmp_path / "g").mkdir()
    q = tmp_path / "g" / "qwen3.gguf"
    run(export(open_model(src), Plan(default="q8_0"), "gguf", q))
    run(convert(q, "hf", tmp_path / "hf", dtype="f32"))
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["head_dim"] == 64
    live = run(open_live(q))
    try:
        folder = open_model(tmp_path / "hf")
        assert list(live.tensors) == list(folder.tensors)
        for n in live.tensors:
            np.testing.assert_array_equal(live.read(n), folder.read(n), err_msg=n)
    finally:
        live.close()


def test_a_gguf_without_tokenizer_stays_weight_level(tmp_path, capsys):
    """A llama GGUF with no tokenizer or hyper-parameters cannot be built into a Hugging Face
    model: evaluate reads its own tensors as before, check says what is missing."""
    from tests.tiny_gguf import write_weights_only_gguf
    path = write_weights_only_gguf(tmp_path / "w.gguf")
    assert main(["evaluate", str(path), "--scheme", "q8_0", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["tensors"]
    assert [r["name"] for r in rows] == ["blk.0.ffn_up.weight"]
    assert main(["check", str(path), "--scheme", "q8_0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and "tokenizer.ggml.model" in err[0], err

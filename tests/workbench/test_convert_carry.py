"""Every tensor of a GGUF is carried by `convert --to hf` and by the on-the-fly conversion of
model-level commands (workbench.export.convert.carry), or refused by name: llama.cpp's
optional attention / FFN biases, Llama 3's rope_freqs, and 1-D tensors nobody knows. Tiny
llama models with biases (tests/tiny_archs.py), exported to GGUF by the project's exporter;
the reference is the original transformers model the GGUF was made from."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from workbench.cli import main
from workbench.core.errors import WorkbenchError
from workbench.core.progress import run
from workbench.export import export
from workbench.export.convert import convert
from workbench.formats.loaders import open_model
from workbench.quant.plan import Plan

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gguf_rewrite import rewrite_gguf  # noqa: E402
from tiny_archs import make_tiny  # noqa: E402

pytest.importorskip("transformers")
IDS = [1, 17, 300, 42, 99, 5, 250, 511, 7, 64]
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def _random_biases(folder: Path, keep=None, seed=0) -> None:
    """Biases of N(0, 0.5) (transformers initialises them to zero: a dropped one would not
    show); those whose projection is not in `keep` are deleted from the checkpoint (and are
    then zero in the network the config builds)."""
    from safetensors.numpy import load_file, save_file
    st = load_file(str(folder / "model.safetensors"))
    rng = np.random.default_rng(seed)
    for k in list(st):
        if k.endswith(".bias"):
            if keep is not None and k.split(".")[-2] not in keep:
                del st[k]
            else:
                st[k] = rng.normal(0, 0.5, st[k].shape).astype(st[k].dtype)
    save_file(st, str(folder / "model.safetensors"), metadata={"format": "pt"})


@pytest.fixture(scope="module")
def biased(tmp_path_factory):
    """{label: (HF folder, its F32 GGUF in a folder of its own)}: every bias, and q/k/v only
    (Qwen2's set, which llama.cpp's llama graph also loads)."""
    d = tmp_path_factory.mktemp("carry")
    out = {}
    for label, keep in (("all", None), ("qkv", ("q_proj", "k_proj", "v_proj"))):
        folder = make_tiny("llama", d / label, overrides=dict(attention_bias=True,
                                                               mlp_bias=keep is None))
        _random_biases(folder, keep)
        g = d / f"g-{label}" / "m.gguf"
        g.parent.mkdir()
        run(export(open_model(folder), Plan(default="fp32"), "gguf", g))
        out[label] = (folder, g)
    return out


def _logits(folder, state=None):
    import torch
    import transformers
    net = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    if state is not None:
        net.load_state_dict(state, strict=True)
    with torch.no_grad():
        return net(torch.tensor([IDS])).logits[0].numpy()


def _reference(folder: Path, tmp: Path):
    """The source network with every bias the checkpoint lacks at zero (as llama.cpp runs the
    GGUF): the folder's config with both bias flags on."""
    import torch
    from safetensors.torch import load_file
    ref = tmp / "ref"
    shutil.copytree(folder, ref)
    cfg = json.loads((ref / "config.json").read_text())
    cfg.update(attention_bias=True, mlp_bias=True)
    (ref / "config.json").write_text(json.dumps(cfg))
    st = load_file(str(folder / "model.safetensors"))
    import transformers
    net = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.from_pretrained(str(ref)), dtype=torch.float32)
    state = {k: st.get(k, torch.zeros_like(v)) for k, v in net.state_dict().items()}
    return _logits(ref, state)


@pytest.mark.parametrize("label", ["all", "qkv"])
def test_convert_carries_the_biases(biased, label, tmp_path):
    folder, g = biased[label]
    assert "blk.0.attn_q.bias" in open_model(g).tensors
    out = tmp_path / "hf"
    info = run(convert(g, "hf", out, dtype="f32"))
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["attention_bias"] is True and cfg["mlp_bias"] is (label == "all")
    assert info["unused"] == []
    a, b = _reference(folder, tmp_path), _logits(out)
    assert np.abs(a).max() > 1.0
    assert np.abs(a - b).max() < 1e-4 * np.abs(a).max(), np.abs(a - b).max()
    from safetensors.numpy import load_file
    st = load_file(str(out / "model.safetensors"))
    if label == "qkv":      # the biases llama.cpp does not have: zero
        assert not st["model.layers.0.self_attn.o_proj.bias"].any()
    assert np.abs(st["model.layers.1.self_attn.q_proj.bias"]).max() > 0.5


def test_live_model_runs_and_exports_with_the_biases(biased, tmp_path, capsys):
    """A GGUF given to a model-level command: its tensors include the biases (the values the
    folder of `convert --to hf` has), and `export --format gguf` writes them back."""
    import gguf
    from workbench.export.convert.live import open_live
    _, g = biased["all"]
    run(convert(g, "hf", tmp_path / "hf", dtype="f32"))
    live = run(open_live(g))
    try:
        folder = open_model(tmp_path / "hf")
        assert list(live.tensors) == list(folder.tensors)
        assert "model.layers.0.mlp.down_proj.bias" in live.tensors
        for n in live.tensors:
            np.testing.assert_array_equal(live.read(n), folder.read(n), err_msg=n)
    finally:
        live.close()
    out = tmp_path / "back.gguf"
    assert main(["export", str(g), "--scheme", "q8_0", "--format", "gguf", "-o", str(out)]) == 0
    capsys.readouterr()
    src = {t.name: np.array(t.data) for t in gguf.GGUFReader(str(g)).tensors}
    back = {t.name: np.array(t.data) for t in gguf.GGUFReader(str(out)).tensors}
    biases = [n for n in src if n.endswith(".bias")]
    assert len(biases) == 14
    for n in biases:
        np.testing.assert_array_equal(back[n], src[n], err_msg=n)


def test_check_scores_the_gguf_with_its_biases(biased, tmp_path, capsys):
    """`check` on the GGUF equals `check` on the converted folder, and differs from the same
    GGUF with its biases removed (before: both scored the model without them)."""
    _, g = biased["all"]
    run(convert(g, "hf", tmp_path / "hf", dtype="f32"))
    nob = tmp_path / "nob" / "m.gguf"
    nob.parent.mkdir()
    rewrite_gguf(g, nob, drop={t for t in open_model(g).tensors if t.endswith(".bias")})

    def kld(src):
        assert main(["check", str(src), "--scheme", "q8_0", "--samples", "3", "--json"]) == 0
        d = json.loads(capsys.readouterr().out)["kld"]
        return {k: v for k, v in d.items() if k not in ("seconds", "cache")}
    a, b, c = kld(g), kld(tmp_path / "hf"), kld(nob)
    assert a == b and a != c


def test_unknown_1d_tensor_is_refused_by_name(biased, tmp_path, capsys):
    _, g = biased["qkv"]
    bad = tmp_path / "g" / "m.gguf"
    bad.parent.mkdir()
    rewrite_gguf(g, bad, add={"blk.0.attn_sinks.weight": np.ones(4, np.float32)})
    rc = main(["convert", str(bad), "--to", "hf", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "blk.0.attn_sinks.weight" in err[0] \
        and str(bad) in err[0], err
    assert not (tmp_path / "out").exists()
    rc = main(["check", str(bad), "--scheme", "q8_0", "--samples", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "blk.0.attn_sinks.weight" in err[0], err


def test_a_bias_with_no_place_in_the_config_is_refused(tiny_arch, tmp_path, capsys):
    """Gemma 3 has no mlp_bias: an ffn bias in its GGUF is refused, naming it."""
    g = tmp_path / "a" / "m.gguf"
    g.parent.mkdir()
    run(export(open_model(tiny_arch("gemma3_text")), Plan(default="fp32"), "gguf", g))
    bad = tmp_path / "b" / "m.gguf"
    bad.parent.mkdir()
    rewrite_gguf(g, bad, add={"blk.1.ffn_up.bias": np.ones(512, np.float32)})
    with pytest.raises(WorkbenchError, match=r"blk\.1\.ffn_up\.bias"):
        run(convert(bad, "hf", tmp_path / "out", dtype="f32"))


# ---- Llama 3's rope_freqs ------------------------------------------------------------------------
ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256}


def test_rope_freqs_become_the_configs_llama3_rope(tmp_path):
    folder = make_tiny("llama", tmp_path / "src", overrides=dict(
        rope_parameters={**ROPE, "rope_theta": 10000.0}))
    g = tmp_path / "g" / "m.gguf"
    g.parent.mkdir()
    run(export(open_model(folder), Plan(default="fp32"), "gguf", g))
    assert "rope_freqs.weight" in open_model(g).tensors
    info = run(convert(g, "hf", tmp_path / "hf", dtype="f32"))
    assert info["in_config"] == {"rope_freqs.weight": "rope_parameters"}
    rp = json.loads((tmp_path / "hf" / "config.json").read_text())["rope_parameters"]
    assert {k: rp[k] for k in ROPE} == ROPE
    a, b = _logits(folder), _logits(tmp_path / "hf")
    assert np.abs(a - b).max() < 1e-4 * np.abs(a).max(), np.abs(a - b).max()
    # factors no llama3 scaling gives: refused, naming the tensor
    f = open_model(g).read("rope_freqs.weight").copy()
    f[::3] = 2.5
    bad = tmp_path / "b" / "m.gguf"
    bad.parent.mkdir()
    rewrite_gguf(g, bad, drop={"rope_freqs.weight"}, add={"rope_freqs.weight": f})
    with pytest.raises(WorkbenchError, match=r"rope_freqs\.weight"):
        run(convert(bad, "hf", tmp_path / "out", dtype="f32"))


def test_fit_llama3_gives_llama_3_1s_values():
    from workbench.export.convert.carry import fit_llama3, llama3_factors
    p = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 8192}
    f = llama3_factors(500000.0, 128, p).astype(np.float32)
    assert fit_llama3(f.astype(np.float64), 500000.0, 128) == p
    assert fit_llama3(np.ones(64), 500000.0, 128) == {}
    assert fit_llama3(np.linspace(1, 3, 64)[::-1].copy(), 500000.0, 128) is None

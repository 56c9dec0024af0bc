"""`convert` of an mlx-lm folder (workbench.export.convert.mlx_hf): mlx-lm's own quantized
folders (mlx_lm.convert on tiny generated models, uniform and the mixed_3_6 recipe) become float
Hugging Face folders with the loader's exact values, the float model's names (the stacked
experts split back), no quantization in config.json and the tokenizer carried; transformers
runs the result as mlx-lm runs the folder, and model-level commands run on it."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("mlx_lm", reason="mlx-lm is not installed (pip install -e .[mlx])")

from tests.mlx_folders import mlx_quantized, run_cli as _cli, tiny_hf  # noqa: E402


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlxconv")
    llama = tiny_hf("llama", root / "llama", tie_word_embeddings=True)
    moe = tiny_hf("qwen3_moe", root / "moe")
    return {"llama": llama, "moe": moe,
            "llama-mixed": mlx_quantized(llama, root / "llama-mixed",
                                         quant_predicate="mixed_3_6"),
            "llama-q4": mlx_quantized(llama, root / "llama-q4", q_bits=4, q_group_size=64),
            "moe-q4": mlx_quantized(moe, root / "moe-q4", q_bits=4, q_group_size=32)}



def _tensors(folder):
    """{name: float32 values} of a Hugging Face folder (the workbench's reader)."""
    from workbench.formats.loaders import open_model
    m = open_model(folder)
    return {n: m.read(n) for n in m.tensors}


def test_mixed_folder_converts_to_the_loaders_values(folders, tmp_path):
    from workbench.formats.loaders import open_model
    out = tmp_path / "hf"
    rc, text, err = _cli("convert", folders["llama-mixed"], "--to", "hf", out, "--json")
    assert rc == 0, err
    info = json.loads(text)
    assert info["dtype"] == "bf16" and "mlx-affine-b3-g64" in info["quantization"]
    cfg = json.loads((out / "config.json").read_text())
    assert "quantization" not in cfg and "quantization_config" not in cfg
    assert cfg["dtype"] == "bfloat16"
    for f in ("tokenizer.json", "tokenizer_config.json"):
        assert (out / f).read_bytes() == (folders["llama-mixed"] / f).read_bytes()
    got = _tensors(out)
    assert set(got) == set(_tensors(folders["llama"]))        # tied: no lm_head, as the source
    src = open_model(folders["llama-mixed"])
    for name, arr in got.items():
        np.testing.assert_array_equal(arr, src.read(name), err_msg=name)


def test_stacked_experts_split_back_into_hugging_face_names(folders, tmp_path):
    from workbench.formats.loaders import open_model
    out = tmp_path / "hf"
    rc, _, err = _cli("convert", folders["moe-q4"], "--to", "hf", out)
    assert rc == 0, err
    got = _tensors(out)
    assert set(got) == set(_tensors(folders["moe"]))
    src = open_model(folders["moe-q4"])
    stacked = src.read("model.layers.1.mlp.switch_mlp.down_proj.weight")
    assert stacked.shape[0] == 4
    for e in range(4):
        np.testing.assert_array_equal(
            got[f"model.layers.1.mlp.experts.{e}.down_proj.weight"], stacked[e])


def test_transformers_runs_the_result_as_mlx_lm_runs_the_folder(folders, tmp_path):
    """mlx-lm's forward of the 4-bit folder (bfloat16, as it loads) and transformers' of the
    converted folder (float32) on 64 tokens: measured mean KL 3e-4, top-1 100 % (mixed_3_6)."""
    import mlx.core as mx
    import mlx_lm
    import torch
    import transformers
    out = tmp_path / "hf"
    assert _cli("convert", folders["llama-q4"], "--to", "hf", out)[0] == 0
    ids = np.random.default_rng(0).integers(0, 512, (1, 64))
    net = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    with torch.no_grad():
        lt = torch.log_softmax(net(torch.from_numpy(ids)).logits[0].double(), -1)
    mm, _ = mlx_lm.load(str(folders["llama-q4"]))
    lm = torch.log_softmax(torch.from_numpy(
        np.array(mm(mx.array(ids)).astype(mx.float32))[0]).double(), -1)
    kl = (lt.exp() * (lt - lm)).sum(-1)
    assert float(kl.mean()) < 2e-3
    assert (lt.argmax(-1) == lm.argmax(-1)).float().mean() >= 0.95


def test_model_level_commands_run_on_the_result(folders, tmp_path):
    out = tmp_path / "hf"
    assert _cli("convert", folders["llama-mixed"], "--to", "hf", out)[0] == 0
    rc, text, err = _cli("check", out, "--scheme", "q8_0", "--ctx", "64", "--chunks", "2",
                         "--no-cache", "--json")
    assert rc == 0, err
    assert json.loads(text)["kld"]["tokens"] == 2 * 31


def test_refusals_before_any_work(folders, tmp_path):
    src = folders["llama-mixed"]
    for argv, says in (((src, "--to", "gguf", tmp_path / "x.gguf"), "Hugging Face folder"),
                       ((src, "--to", "hf", tmp_path / "y", "--off-grid"), "off_grid")):
        rc, _, err = _cli("convert", *argv)
        assert rc == 2 and says in err, err
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    rc, _, err = _cli("convert", src, "--to", "hf", full)
    assert rc == 2 and (full / "keep.txt").read_text() == "mine"
    assert not (tmp_path / "x.gguf").exists() and not (tmp_path / "y").exists()


def test_diff_against_a_gguf_quantization_of_the_same_model(folders, tmp_path):
    """diff of mlx-lm's 4-bit folder against the workbench's Q8_0 GGUF of the same float model
    (--source the float folder): every tensor matched across the two naming schemes."""
    gguf = tmp_path / "q8.gguf"
    rc, _, err = _cli("export", folders["llama"], "--scheme", "q8_0", "--format", "gguf",
                      "-o", gguf)
    assert rc == 0, err
    rc, text, err = _cli("diff", folders["llama-q4"], gguf, "--source", folders["llama"],
                         "--no-check", "--json")
    assert rc == 0, err
    res = json.loads(text)
    t = res["totals"]
    assert t["matched"] == t["a"]["tensors"] == 20 and t["only_a"] == t["only_b"] == 0
    row = next(r for r in res["tensors"] if r["name"] == "model.layers.1.mlp.down_proj.weight")
    assert row["a"]["type"] == "mlx-affine-b4-g64" and row["b"]["rel_rmse"] < row["a"]["rel_rmse"]


def test_converted_gguf_configs_carry_the_rope_keys_mlx_lm_reads():
    """convert --to hf writes transformers 5's rope_parameters; mlx-lm's classes read
    rope_theta (SmolLM2: 100,000; mlx-lm's default 10,000 put mlx-lm's float forward a mean KL
    of 0.39 from transformers') and Gemma 3's rope_local_base_freq."""
    from mlx_lm.models import gemma3_text, llama

    from workbench.export.convert.hf import legacy_rope
    smol = {"model_type": "llama", "rope_parameters": {"rope_theta": 100000.0,
                                                       "rope_type": "default"}}
    legacy_rope(smol)
    assert llama.ModelArgs.from_dict({**smol, "hidden_size": 64, "num_hidden_layers": 1,
                                      "intermediate_size": 64, "num_attention_heads": 1,
                                      "rms_norm_eps": 1e-6, "vocab_size": 8}).rope_theta == 1e5
    gemma = {"rope_parameters": {"full_attention": {"rope_theta": 1e6, "rope_type": "default"},
                                 "sliding_attention": {"rope_theta": 1e4,
                                                       "rope_type": "default"}}}
    legacy_rope(gemma)
    assert (gemma["rope_theta"], gemma["rope_local_base_freq"]) == (1e6, 1e4)
    assert "rope_theta" in gemma3_text.ModelArgs.__dataclass_fields__
    kept = {"rope_theta": 5.0, "rope_parameters": {"rope_theta": 7.0}}
    legacy_rope(kept)
    assert kept["rope_theta"] == 5.0

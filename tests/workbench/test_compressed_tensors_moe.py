"""compressed-tensors exports of mixture-of-experts models (Qwen3-MoE, Mixtral, DeepSeek-V3):
routers in `ignore` (vLLM's routers are unquantized layers), every expert a per-expert Linear
target of one config group per layer (vLLM's FusedMoE takes one scheme for all of a layer's
experts), checked with the compressed-tensors package: the config validates and every layer
decompressed by the package's compressor equals the workbench's own dequantized weights."""

from __future__ import annotations

import json
import re

import pytest

from workbench.core.errors import WorkbenchError
from workbench.export import export
from workbench.formats.loaders import open_model
from workbench.quant.plan import Plan
from workbench.core.progress import run

pytest.importorskip("compressed_tensors")
pytest.importorskip("transformers")

from tests.workbench.test_compressed_tensors import check_exact, package_weights  # noqa: E402

ROUTERS = {"qwen3_moe": r"model\.layers\.\d+\.mlp\.gate$",
           "mixtral": r"model\.layers\.\d+\.block_sparse_moe\.gate$",
           "deepseek_v3": r"model\.layers\.1\.mlp\.gate$"}
EXPERT = re.compile(r"\.experts\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w2|w3)$")


@pytest.mark.parametrize("arch", sorted(ROUTERS))
def test_moe_routers_ignored_experts_targeted(tiny_arch, tmp_path, arch):
    from compressed_tensors.quantization import QuantizationConfig
    folder = tiny_arch(arch)
    src = open_model(folder)
    plan = Plan(default="int4-g128")
    out = tmp_path / "ct"
    info = run(export(src, plan, "compressed-tensors", out))
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    QuantizationConfig.model_validate(cfg)               # the package accepts the config
    ignore = set(cfg["ignore"])
    routers = [n for n in ignore if re.fullmatch(ROUTERS[arch], n)]
    assert len(routers) == (1 if arch == "deepseek_v3" else 2), sorted(ignore)
    assert "lm_head" in ignore
    assert not [n for n in ignore if EXPERT.search(n)]
    targets = [t for g in cfg["config_groups"].values() for t in g["targets"]]
    experts = [t for t in targets if EXPERT.search(t)]
    n_layers = 1 if arch == "deepseek_v3" else 2
    assert len(experts) == n_layers * 4 * 3            # every expert's three projections
    assert not any(re.fullmatch(ROUTERS[arch], t) for t in targets)
    if arch == "deepseek_v3":   # MLA projections and the shared expert are vLLM Linear layers
        for part in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj",
                     "shared_experts.up_proj"):
            assert f"model.layers.1.self_attn.{part}" in targets or \
                f"model.layers.1.mlp.{part}" in targets, part
    n = check_exact(src, package_weights(out), plan)
    assert n == info["quantized"] == len(targets)
    src.close()


def test_moe_experts_of_a_layer_need_one_scheme(tiny_arch, tmp_path):
    src = open_model(tiny_arch("qwen3_moe"))
    plan = Plan(default="int4-g128", rules=[
        {"match": "model.layers.1.mlp.experts.2.down_proj.weight", "scheme": "int8-channel"}])
    with pytest.raises(WorkbenchError, match=r"experts of model\.layers\.1\.mlp.*int8-channel"):
        run(export(src, plan, "compressed-tensors", tmp_path / "x"))
    assert not (tmp_path / "x").exists()
    from workbench.export.preflight import check
    assert not check(src, plan, "compressed-tensors").ok
    # a whole layer's experts on another scheme is one FusedMoE scheme: fine
    plan = Plan(default="int4-g128", rules=[
        {"match": r"re:model\.layers\.1\.mlp\.experts\.", "scheme": "int8-channel"}])
    out = tmp_path / "y"
    run(export(src, plan, "compressed-tensors", out))
    assert check_exact(src, package_weights(out), plan) == 2 * 4 + 4 * 3 * 2
    # Mixtral's w1/w3 (gate/up) are fused like gate_proj/up_proj
    mix = open_model(tiny_arch("mixtral"))
    plan = Plan(default="int4-g128", rules=[
        {"match": r"re:layers\.0\.block_sparse_moe\.experts\.1\.w3", "scheme": "int8-channel"}])
    with pytest.raises(WorkbenchError, match=r"w1\.weight \(int4-g128\)"):
        run(export(mix, plan, "compressed-tensors", tmp_path / "z"))
    src.close()
    mix.close()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral", "phi3", "gemma2",
                                  "gemma3_text", "gpt2", "bert"])
def test_dense_architectures_export_and_read_back(tiny_arch, tmp_path, arch):
    """The other architectures of the table: every linear layer quantized (int8-channel), the
    config valid for the package, every layer decompressed by it equal to the workbench's."""
    from compressed_tensors.quantization import QuantizationConfig
    src = open_model(tiny_arch(arch))
    plan = Plan(default="int8-channel")
    out = tmp_path / "ct"
    info = run(export(src, plan, "compressed-tensors", out))
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    QuantizationConfig.model_validate(cfg)
    n_layers = 2
    per_layer = {"phi3": 4, "gpt2": 4, "bert": 6}.get(arch, 7)
    assert info["quantized"] == n_layers * per_layer, info["quantized"]
    assert check_exact(src, package_weights(out), plan) == n_layers * per_layer
    src.close()

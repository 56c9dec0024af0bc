"""compressed-tensors export (vLLM's format), read back by the real package: transformers'
compressed-tensors loader with dequantize=True, and the package's own compressor."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from workbench.core.errors import WorkbenchError
from workbench.quant.evaluate import quantize
from workbench.export import export
from workbench.formats.loaders import open_model
from workbench.quant.plan import Plan
from workbench.core.progress import run
from workbench.schemes import get_scheme

pytest.importorskip("compressed_tensors")
transformers = pytest.importorskip("transformers")

MIXED = Plan(default="int4-g128", rules=[
    {"match": "re:attention\\.self\\.", "scheme": "int8-channel"},
    {"match": "re:output\\.dense\\.weight$", "scheme": "int4-g64-asym"},
    {"match": "re:intermediate\\.dense\\.weight$", "scheme": "fp8-e4m3"},
    {"match": "encoder.layer.5.output.dense.weight", "scheme": "q4_k"},   # not expressible
])


@pytest.fixture(scope="module")
def minilm_folder(tmp_path_factory, minilm_path):
    dst = tmp_path_factory.mktemp("ct") / "minilm"
    shutil.copytree(minilm_path.parent, dst)
    return dst


def load_dequantized(folder, cls=None):
    from transformers import AutoModel, CompressedTensorsConfig
    cls = cls or AutoModel
    # float32: the demo model's config says bfloat16, which would round the weights on load
    return cls.from_pretrained(folder, dtype=torch.float32,
                               quantization_config=CompressedTensorsConfig(dequantize=True))


def package_weights(folder) -> dict:
    """Every layer decompressed by the package's own compressor for its config group's format
    (as vLLM does per layer), other tensors as stored."""
    from compressed_tensors.compressors.base import BaseCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from safetensors.torch import load_file
    sd = load_file(str(folder / "model.safetensors"))
    cfg = json.loads((folder / "config.json").read_text())["quantization_config"]
    out = {k: v for k, v in sd.items() if not k.split(".")[-1].startswith("weight_")}
    for group in cfg["config_groups"].values():
        scheme = QuantizationScheme.model_validate(group)
        comp = BaseCompressor.get_value_from_registry(group.get("format") or cfg["format"])
        for layer in group["targets"]:
            part = {k[len(layer) + 1:]: v for k, v in sd.items() if k.startswith(layer + ".weight")}
            out[layer + ".weight"] = comp.decompress(part, scheme)["weight"]
    return out


def check_exact(src, out_model, plan, prefix=""):
    """Every weight equals the workbench's own dequantization (or the source, when kept)."""
    from workbench.quant.runtimes import plan_decisions
    sd = out_model if isinstance(out_model, dict) else \
        {k: v.detach() for k, v in out_model.state_dict().items()}
    decisions = plan_decisions(src, plan, "vllm")
    n_quant = 0
    for name, d in decisions.items():
        key = prefix + name
        if key not in sd:
            continue
        got = sd[key].float().numpy()
        if d.applied == "keep":
            want = src.read(name).reshape(got.shape)
        else:
            qt = quantize(src.read_matrix(name), d.applied)
            want = get_scheme(d.applied).dequantize(qt).reshape(got.shape)
            n_quant += 1
        assert np.array_equal(got, want), (name, d.applied, np.abs(got - want).max())
    return n_quant


from workbench.bench.ct_peer import embed  # noqa: E402  (mean-pooled, normalized)


@pytest.mark.parametrize("plan,fmt,min_cos", [
    (Plan(default="int4-g128"), "pack-quantized", 0.94),  # RTN int4 on MiniLM: 0.943 (0.938 on -7..7)
    (Plan(default="int8-channel"), "pack-quantized", 0.995),
    (Plan(default="int4-g128-asym"), "pack-quantized", 0.92),
    (Plan(default="fp8-e4m3"), "float-quantized", 0.995),
    (MIXED, "mixed-precision", 0.92),
], ids=["int4-g128", "int8-channel", "int4-g128-asym", "fp8-e4m3", "mixed"])
def test_minilm_reads_back_exactly(minilm_folder, tmp_path, plan, fmt, min_cos):
    from transformers import AutoModel, AutoTokenizer
    src = open_model(minilm_folder)
    out = tmp_path / "out"
    info = run(export(src, plan, "compressed-tensors", out))
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert cfg["quant_method"] == "compressed-tensors" and cfg["format"] == fmt
    assert info["quantized"] == 36 - (1 if plan is MIXED else 0)   # 6 layers x 6 linears
    from compressed_tensors.quantization import QuantizationConfig
    QuantizationConfig.model_validate(cfg)                          # the package's own model
    assert check_exact(src, package_weights(out), plan) == info["quantized"]
    if plan is MIXED:
        # transformers' dequantize=True loader applies one config group to every layer
        # (transformers 5.23): run the float model with the package's decompressed weights
        model = AutoModel.from_pretrained(minilm_folder).eval()
        model.load_state_dict(package_weights(out), strict=False)
    else:
        model = load_dequantized(out).eval()
        assert check_exact(src, model, plan) == info["quantized"]
    tok = AutoTokenizer.from_pretrained(out)
    texts = ["The quick brown fox jumps over the lazy dog.", "Quantization saves memory."]
    ref = embed(AutoModel.from_pretrained(minilm_folder).eval(), tok, texts)
    cos = (embed(model, tok, texts) * ref).sum(-1)
    assert cos.min() >= min_cos, cos
    if plan is MIXED:
        note = info["notes"]["encoder.layer.5.output.dense.weight"]
        assert "cannot express q4_k" in note


def test_package_compressor_decompresses_each_layer(minilm_folder, tmp_path):
    """The package's PackedQuantizationCompressor on the raw tensors gives the same weights."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from safetensors.torch import load_file
    src = open_model(minilm_folder)
    out = tmp_path / "out"
    run(export(src, Plan(default="int4-g32-asym"), "compressed-tensors", out))
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    scheme = QuantizationScheme.model_validate(cfg["config_groups"]["group_0"])
    sd = load_file(str(out / "model.safetensors"))
    layer = "encoder.layer.2.intermediate.dense"
    part = {k.split(".")[-1]: v for k, v in sd.items() if k.startswith(layer + ".weight")}
    assert part["weight_packed"].dtype == torch.int32
    assert tuple(part["weight_packed"].shape) == (1536, 384 * 4 // 32)
    w = PackedQuantizationCompressor.decompress(part, scheme)["weight"].float().numpy()
    qt = quantize(src.read_matrix(layer + ".weight"), "int4-g32-asym")
    assert np.array_equal(w, get_scheme("int4-g32-asym").dequantize(qt).reshape(w.shape))


def test_demo_causal_lm_reads_back_exactly(demo_model_path, tmp_path):
    from transformers import AutoModelForCausalLM
    src = open_model(demo_model_path.parent)
    plan = Plan(default="int4-g64", rules=[{"match": "re:mlp\\.down_proj", "scheme": "int8-g128"},
                                           {"match": "re:layers\\.2\\.self_attn", "scheme": "fp8-e4m3"}])
    out = tmp_path / "demo-ct"
    info = run(export(src, plan, "compressed-tensors", out))
    assert info["quantized"] == 3 * 7
    assert check_exact(src, package_weights(out), plan) == 21
    single = Plan(default="int4-g64")
    run(export(src, single, "compressed-tensors", out, overwrite=True))   # replaces the first
    assert check_exact(src, load_dequantized(out, AutoModelForCausalLM), single) == 21
    assert (out / "tokenizer.json").is_file()


def test_split_fused_qkv_and_strict_are_refused(minilm_folder, demo_model_path, tmp_path):
    src = open_model(demo_model_path.parent)
    split = Plan(default="int4-g64", rules=[{"match": "re:k_proj", "scheme": "int8-channel"}])
    with pytest.raises(WorkbenchError, match="vLLM fuses"):
        run(export(src, split, "compressed-tensors", tmp_path / "x"))
    with pytest.raises(WorkbenchError, match="strict=True"):
        run(export(src, Plan(default="q4_k"), "compressed-tensors", tmp_path / "y", strict=True))
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
    with pytest.raises(WorkbenchError, match="overwrite the source"):
        run(export(src, Plan(default="int4-g64"), "compressed-tensors", demo_model_path.parent))


def test_variants_share_a_group_and_kept_fused_sibling_is_refused(demo_model_path, tmp_path):
    """@mse scales are stored like minmax ones: one config group, read back exactly. A q/k/v
    sibling that cannot be expressed (kept unquantized) splits the fused layer: refused."""
    src = open_model(demo_model_path.parent)
    plan = Plan(default="int4-g64", rules=[{"match": "re:q_proj", "scheme": "int4-g64@mse"}])
    out = tmp_path / "v"
    info = run(export(src, plan, "compressed-tensors", out))
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert info["quantized"] == 21 and len(cfg["config_groups"]) == 1
    assert check_exact(src, package_weights(out), plan) == 21
    kept_k = Plan(default="int4-g64", rules=[{"match": "re:k_proj", "scheme": "q4_k"}])
    with pytest.raises(WorkbenchError, match=r"k_proj\.weight \(keep\)"):
        run(export(src, kept_k, "compressed-tensors", tmp_path / "k"))
    assert not (tmp_path / "k").exists()


def test_existing_folder_with_other_files_is_never_replaced(demo_model_path, tmp_path):
    src = open_model(demo_model_path.parent)
    out = tmp_path / "o"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(WorkbenchError, match="output folder exists and holds .*files"):
        run(export(src, Plan(default="int8-channel"), "compressed-tensors", out))
    assert (out / "notes.txt").read_text() == "mine"
    (out / "notes.txt").unlink()
    run(export(src, Plan(default="int8-channel"), "compressed-tensors", out))   # empty: fine
    with pytest.raises(WorkbenchError, match="holds a model.*overwrite"):   # a model folder now
        run(export(src, Plan(default="int4-g64"), "compressed-tensors", out))
    run(export(src, Plan(default="int4-g64"), "compressed-tensors", out, overwrite=True))
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert cfg["config_groups"]["group_0"]["weights"]["group_size"] == 64


@pytest.mark.parametrize("shape", [(0, 32), (4, 0)])
@pytest.mark.parametrize("scheme", ["int4-g32", "int4-g32-asym"])
def test_an_empty_tensor_exports_and_reads_back_empty(tmp_path, shape, scheme):
    # the fuzz suite's roundtrip class found this: a 0-row group-quantized tensor wrote fine,
    # then reading the folder back raised a reshape error (and 0 columns a division by zero)
    from workbench.export.st_writer import StreamingSafetensorsWriter
    src = tmp_path / "src.safetensors"
    w = StreamingSafetensorsWriter(str(src))
    w.add("model.layers.0.mlp.up_proj.weight", np.zeros(shape, np.float32))
    w.add("model.layers.0.mlp.down_proj.weight",
          np.random.default_rng(0).standard_normal((8, 32)).astype(np.float32))
    w.finish()
    out = tmp_path / "out"
    run(export(open_model(src), Plan(default=scheme), "compressed-tensors", str(out)))
    back = open_model(out)
    assert back.read("model.layers.0.mlp.up_proj.weight").shape == shape
    full = back.read("model.layers.0.mlp.down_proj.weight")
    ref = open_model(src).read("model.layers.0.mlp.down_proj.weight")
    assert full.shape == (8, 32) and np.abs(full - ref).max() < 0.5 * np.abs(ref).max()

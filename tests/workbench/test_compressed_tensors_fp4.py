"""compressed-tensors NVFP4, MXFP4 and 128x128-block FP8 (workbench/schemes/microscaling.py,
export/compressed_tensors.py), read back by the real package's own decompressors and by
transformers' compressed-tensors loader."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from workbench.core.errors import WorkbenchError
from workbench.core.progress import run
from workbench.export import export
from workbench.formats.loaders import open_model
from workbench.quant.evaluate import quantize
from workbench.quant.plan import Plan
from workbench.schemes import get_scheme

pytest.importorskip("compressed_tensors")
pytest.importorskip("transformers")

from test_compressed_tensors import load_dequantized, package_weights  # noqa: E402

FORMATS = {"nvfp4-g16": "nvfp4-pack-quantized", "mxfp4-g32": "mxfp4-pack-quantized",
           "fp8-e4m3-b128": "float-quantized"}


def _bf16(a: np.ndarray) -> np.ndarray:
    return torch.from_numpy(a).to(torch.bfloat16).float().numpy()


def _logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


@pytest.mark.parametrize("scheme", list(FORMATS))
def test_demo_lm_reads_back_exactly(demo_model_path, tmp_path, scheme):
    """Every quantized weight as the package decompresses it and as transformers loads it is the
    workbench's own dequantization (NVFP4: the package decodes into bfloat16, so both give the
    bfloat16 rounding of it), and the model's logits stay close to the float model's."""
    from compressed_tensors.quantization import QuantizationConfig
    from transformers import AutoModelForCausalLM
    src = open_model(demo_model_path.parent)
    out = tmp_path / "ct"
    info = run(export(src, Plan(default=scheme), "compressed-tensors", out))
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert cfg["format"] == FORMATS[scheme] and info["quantized"] == 21
    assert "lm_head" in cfg["ignore"] or "lm_head" not in json.dumps(cfg["config_groups"])
    QuantizationConfig.model_validate(cfg)
    pkg = package_weights(out)
    loaded = load_dequantized(out, AutoModelForCausalLM)
    sd = {k: v.detach() for k, v in loaded.state_dict().items()}
    n = 0
    for name in src.tensors:
        if not name.endswith("proj.weight"):
            continue
        want = get_scheme(scheme).dequantize(quantize(src.read_matrix(name), scheme))
        exact = _bf16(want) if scheme == "nvfp4-g16" else want
        assert np.array_equal(pkg[name].float().numpy(), exact), name
        assert np.array_equal(sd[name].float().numpy(), exact), name
        n += 1
    assert n == 21
    ref = AutoModelForCausalLM.from_pretrained(demo_model_path.parent, dtype=torch.float32)
    ids = list(range(5, 69))
    a, b = _logits(ref.eval(), ids), _logits(loaded.eval(), ids)
    cos = torch.nn.functional.cosine_similarity(a, b, dim=-1)
    print(f"{scheme}: logits cosine to the float model min {cos.min():.4f} mean {cos.mean():.4f}")
    assert cos.mean() > {"fp8-e4m3-b128": 0.998, "nvfp4-g16": 0.985, "mxfp4-g32": 0.96}[scheme], cos


def test_layouts_as_the_package_documents():
    """NVFP4: w = e2m1 * e4m3 / global with global = 448*6/max|w|; MXFP4: the OCP shared
    exponent floor(log2 max|w|) - 2 (+127); FP4 codes magnitude | sign << 3, weight 2k in the
    low nibble; the package's own pack/unpack agree."""
    from compressed_tensors.compressors.nvfp4.helpers import (pack_fp4_to_uint8,
                                                              unpack_fp4_from_uint8)
    w = np.zeros((1, 32), np.float32)
    w[0, :4] = [6.0, -3.0, 0.5, -0.0]
    qt = get_scheme("mxfp4-g32").quantize(w)
    assert qt.arrays["scales"][0, 0] == 127                  # 2^(floor(log2 6) - 2) = 1
    assert list(qt.arrays["packed"][0, :2]) == [7 | (8 | 5) << 4, 1 | (8 | 0) << 4]
    back = unpack_fp4_from_uint8(torch.from_numpy(qt.arrays["packed"]), 1, 32, torch.float32)
    assert np.array_equal(back.numpy()[0, :4], [6.0, -3.0, 0.5, -0.0])
    assert np.array_equal(pack_fp4_to_uint8(back).numpy(), qt.arrays["packed"])
    q = get_scheme("nvfp4-g16").quantize(np.linspace(-2, 3, 64, dtype=np.float32)[None])
    g = q.arrays["global_scale"][0]
    assert g == np.float32(448 * 6) / np.float32(3)
    assert q.arrays["scales"][0, -1] == 0x7E                  # the largest group: 448
    assert get_scheme("nvfp4-g16").dequantize(q)[0, -1] == 3.0


def test_block_fp8_ragged_shape_as_the_package_decompresses(tmp_path):
    """A matrix whose sides are not multiples of 128: scales [ceil(r/128), ceil(c/128)], and the
    package's FloatQuantizationCompressor (padding the blocks) decodes the same floats."""
    from compressed_tensors.compressors.naive_quantized.base import NaiveQuantizationCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from workbench.export.compressed_tensors import _args_for, _layer_tensors
    s = get_scheme("fp8-e4m3-b128")
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((130, 260)) * rng.uniform(1e-3, 10, (130, 1))).astype(np.float32)
    qt = s.quantize(w)
    assert qt.arrays["scales"].shape == (2, 3) and qt.nbytes == s.nbytes(w.shape)
    args, fmt = _args_for(s)
    part = _layer_tensors(s, qt, w.shape)
    got = NaiveQuantizationCompressor.decompress(
        part, QuantizationScheme(targets=["Linear"], weights=args))["weight"].numpy()
    assert np.array_equal(got, s.dequantize(qt))
    assert np.abs(s.dequantize(qt) - w).max() <= np.abs(w).max() / 16


@pytest.mark.parametrize("scheme", list(FORMATS))
def test_hostile_values(scheme):
    """Zeros and -0 decode to zeros, tiny and huge (finite) magnitudes stay finite and close,
    NaN/Inf are a one-line refusal naming the tensor, and a row length the group does not
    divide is refused."""
    s = get_scheme(scheme)
    assert not s.dequantize(s.quantize(np.zeros((3, 128), np.float32))).any()
    assert not s.dequantize(s.quantize(np.full((3, 128), -0.0, np.float32))).any()
    rng = np.random.default_rng(1)
    for mag in (1e-30, 1e-6, 1.0, 1e30):
        w = (rng.standard_normal((4, 128)) * mag).astype(np.float32)
        back = s.dequantize(s.quantize(w))
        assert np.isfinite(back).all()
        d, w64 = back.astype(np.float64) - w, w.astype(np.float64)
        rel = np.sqrt((d ** 2).mean() / (w64 ** 2).mean())
        assert rel < (0.05 if scheme.startswith("fp8") else 0.2), (mag, rel)
    bad = np.ones((2, 128), np.float32)
    bad[1, 5] = np.nan
    with pytest.raises(WorkbenchError, match="NaN/Inf") as ei:
        s.quantize(bad, tensor="model.layers.0.mlp.up_proj.weight")
    assert "up_proj" in str(ei.value)
    if scheme != "fp8-e4m3-b128":
        assert s.ineligible_reason((4, 40)) is not None

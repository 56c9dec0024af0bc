"""Block-scaled and microscaled checkpoints opened as model sources, dequantized exactly:
compressed-tensors NVFP4 / MXFP4 / FP8 (block, channel, tensor), DeepSeek-V3-style FP8 with
``weight_scale_inv`` and gpt-oss-style MXFP4 ``*_blocks`` / ``*_scales``; hostile headers are a
one-line error (exit 2)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

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

pytest.importorskip("safetensors")
ROOT = Path(__file__).resolve().parents[2]


def _save(folder: Path, tensors: dict, qcfg: dict) -> Path:
    from safetensors.torch import save_file
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"model_type": "test",
                                                    "quantization_config": qcfg}))
    return folder


def _main(*argv) -> tuple[int, str]:
    from workbench.cli import main
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main([str(a) for a in argv])
    return rc, err.getvalue()


@pytest.mark.parametrize("scheme", ["nvfp4-g16", "mxfp4-g32", "fp8-e4m3-b128", "fp8-e4m3"])
def test_compressed_tensors_exports_open_as_their_dequantized_weights(tmp_path, scheme):
    src = open_model(ROOT / "resources" / "demo_model")
    out = tmp_path / "ct"
    run(export(src, Plan(default=scheme), "compressed-tensors", out))
    m = open_model(out)
    assert m.format == "compressed-tensors" and set(m.tensors) == set(src.tensors)
    n = 0
    for name in src.tensors:
        if name.endswith("proj.weight"):
            want = get_scheme(scheme).dequantize(quantize(src.read_matrix(name), scheme))
            assert np.array_equal(m.read(name), want), name
            assert m.info(name).quant and m.info(name).shape == src.info(name).shape
            n += 1
        else:
            assert np.array_equal(m.read(name), src.read(name)), name
    assert n == 21


def test_compressed_tensors_fp8_per_tensor_scale(tmp_path):
    w = torch.randn(8, 40).to(torch.float8_e4m3fn)
    folder = _save(tmp_path / "t", {"l.weight": w, "l.weight_scale": torch.tensor([0.37])},
                   {"quant_method": "compressed-tensors", "format": "float-quantized",
                    "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                        "num_bits": 8, "type": "float", "strategy": "tensor"}}}})
    got = open_model(folder).read("l.weight")
    assert np.array_equal(got, (w.float() * torch.tensor(0.37)).numpy())


def test_deepseek_fp8_weight_scale_inv(tmp_path):
    """w = fp8 * scale_inv of its 128x128 block (DeepSeek's weight_dequant), ragged edges too;
    tensors without a scale_inv are read as stored."""
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(200, 300, generator=g) * 3).to(torch.float8_e4m3fn)
    s = torch.rand(2, 3, generator=g) + 0.01
    bias = torch.randn(200, generator=g).to(torch.bfloat16)
    folder = _save(tmp_path / "ds", {"model.layers.0.mlp.up_proj.weight": w,
                                     "model.layers.0.mlp.up_proj.weight_scale_inv": s,
                                     "model.norm.weight": bias},
                   {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                    "weight_block_size": [128, 128]})
    m = open_model(folder)
    assert m.format == "fp8-block" and set(m.tensors) == {"model.layers.0.mlp.up_proj.weight",
                                                         "model.norm.weight"}
    full = s.repeat_interleave(128, 0)[:200].repeat_interleave(128, 1)[:, :300]
    want = (w.float() * full).numpy()
    assert np.array_equal(m.read("model.layers.0.mlp.up_proj.weight"), want)
    assert np.array_equal(m.read("model.norm.weight"), bias.float().numpy())


def test_gpt_oss_mxfp4_blocks_equal_transformers_dequantize(tmp_path):
    """The experts' _blocks/_scales decode to what transformers' own gpt-oss MXFP4
    dequantizer gives (in float32), in its layout [E, in, out]; a 2-D pair too."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    g = torch.Generator().manual_seed(1)
    blocks = torch.randint(0, 256, (2, 6, 3, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(115, 135, (2, 6, 3), generator=g, dtype=torch.uint8)
    b2 = torch.randint(0, 256, (4, 2, 16), generator=g, dtype=torch.uint8)
    s2 = torch.randint(120, 130, (4, 2), generator=g, dtype=torch.uint8)
    folder = _save(tmp_path / "oss", {"model.layers.0.mlp.experts.gate_up_proj_blocks": blocks,
                                      "model.layers.0.mlp.experts.gate_up_proj_scales": scales,
                                      "x.w_blocks": b2, "x.w_scales": s2},
                   {"quant_method": "mxfp4", "modules_to_not_convert": []})
    m = open_model(folder)
    name = "model.layers.0.mlp.experts.gate_up_proj"
    assert m.format == "mxfp4-blocks" and m.info(name).shape == (2, 96, 6)
    want = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32).numpy()
    assert np.array_equal(m.read(name), want)
    lut = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])
    v = torch.stack([lut[(b2 & 15).long()], lut[(b2 >> 4).long()]], -1).reshape(4, 2, 32)
    want2 = torch.ldexp(v, (s2.int() - 127)[..., None]).reshape(4, 64).numpy()
    assert np.array_equal(m.read("x.w"), want2)


@pytest.mark.parametrize("case", ["scale_shape", "block_size", "block_bool", "blocks_dim",
                                  "fp4_scale_shape", "nvfp4_no_global", "ds_dtype"])
def test_hostile_headers_are_one_line_errors(tmp_path, case):
    f8 = torch.zeros(16, 256).to(torch.float8_e4m3fn)
    ds = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    ct_fp4 = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
              "config_groups": {"g": {"targets": ["Linear"], "weights": {
                  "num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}}}}
    e4 = torch.zeros(8, 4).to(torch.float8_e4m3fn)
    tensors, cfg = {
        "scale_shape": ({"l.weight": f8, "l.weight_scale_inv": torch.ones(1, 3)}, ds),
        "block_size": ({"l.weight": f8, "l.weight_scale_inv": torch.ones(1, 2)},
                       {"quant_method": "fp8", "weight_block_size": [0, 128]}),
        "block_bool": ({"l.weight": f8, "l.weight_scale_inv": torch.ones(1, 2)},
                       {"quant_method": "fp8", "weight_block_size": [True, 128]}),
        "blocks_dim": ({"e_blocks": torch.zeros(2, 3, 15, dtype=torch.uint8),
                        "e_scales": torch.zeros(2, 3, dtype=torch.uint8)},
                       {"quant_method": "mxfp4"}),
        "fp4_scale_shape": ({"l.weight_packed": torch.zeros(8, 32, dtype=torch.uint8),
                             "l.weight_scale": torch.zeros(8, 3).to(torch.float8_e4m3fn),
                             "l.weight_global_scale": torch.ones(1)}, ct_fp4),
        "nvfp4_no_global": ({"l.weight_packed": torch.zeros(8, 32, dtype=torch.uint8),
                             "l.weight_scale": e4}, ct_fp4),
        "ds_dtype": ({"l.weight": torch.zeros(16, 256), "l.weight_scale_inv": torch.ones(1, 2)},
                     ds),
    }[case]
    folder = _save(tmp_path / case, tensors, cfg)
    with pytest.raises(WorkbenchError):
        m = open_model(folder)
        for n in m.tensors:
            m.read(n)
    rc, err = _main("inspect", folder)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err

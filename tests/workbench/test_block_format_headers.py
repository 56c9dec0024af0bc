"""Block-format sources (compressed-tensors, DeepSeek FP8, gpt-oss MXFP4) whose headers
contradict their tensors are refused when the model is opened, naming the file and the tensor
(exit 2 from `inspect` / `check`, WorkbenchError from `qw.open_model`); well-formed ones decode
to what the format's own package computes, 3-D gpt-oss experts included (`inspect`,
`qw.statistics`). References are computed with torch and the compressed-tensors package."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import workbench as qw
from workbench.core.errors import WorkbenchError

pytest.importorskip("safetensors")
pack_to_int32 = pytest.importorskip(
    "compressed_tensors.compressors.pack_quantized.helpers").pack_to_int32
from tests.workbench.test_block_fp_sources import _main, _save  # noqa: E402


def _ct(weights: dict, fmt="pack-quantized") -> dict:
    return {"quant_method": "compressed-tensors", "format": fmt,
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}}


def _int_layer(rows, cols, bits, gs, asym, seed=0):
    """compressed-tensors tensors of one int layer (packed by the package) and the float
    weights they stand for ((q - zp) * scale in float32, as the package dequantizes)."""
    g = torch.Generator().manual_seed(seed)
    half = 1 << (bits - 1)
    ng = -(-cols // gs)
    q = torch.randint(-half, half, (rows, cols), generator=g, dtype=torch.int8)
    scale = torch.rand(rows, ng, generator=g) + 0.01
    zp = torch.randint(-half, half, (rows, ng), generator=g, dtype=torch.int8)
    idx = torch.arange(cols) // gs
    want = (q.float() - (zp.float()[:, idx] if asym else 0)) * scale[:, idx]
    t = {"l.weight_packed": pack_to_int32(q, bits), "l.weight_scale": scale,
         "l.weight_shape": torch.tensor([rows, cols], dtype=torch.int64)}
    if asym:
        t["l.weight_zero_point"] = pack_to_int32(zp, bits, packed_dim=0)
    args = {"num_bits": bits, "type": "int", "symmetric": not asym, "strategy": "group",
            "group_size": gs}
    return t, args, want.numpy()


def _refused(folder: Path, tensor: str, match: str) -> None:
    """Refused by qw.open_model (naming the tensor) and by inspect and check (exit 2, one
    line naming the file and the tensor)."""
    with pytest.raises(WorkbenchError, match=match) as ei:
        qw.open_model(folder)
    assert ei.value.tensor == tensor and "model.safetensors" in ei.value.path
    for cmd in (["inspect"], ["check", "--scheme", "q8_0"]):
        rc, err = _main(*cmd, folder)
        assert rc == 2 and len(err.strip().splitlines()) == 1, (cmd, err)
        assert str(folder) in err and f"'{tensor}'" in err, (cmd, err)


# ---- 1. missing companions ------------------------------------------------------------------
def test_fp8_weight_without_weight_scale(tmp_path):
    """Read unscaled before (absmax 448 for a weight of absmax 0.18)."""
    w = torch.full((8, 32), 448.0).to(torch.float8_e4m3fn)
    folder = _save(tmp_path / "f", {"l.weight": w, "other.weight": torch.ones(4, 4)},
                   _ct({"num_bits": 8, "type": "float", "strategy": "channel"},
                       "float-quantized"))
    _refused(folder, "l.weight", "without its weight_scale")


def test_deepseek_fp8_weight_without_weight_scale_inv(tmp_path):
    w = torch.full((16, 256), 448.0).to(torch.float8_e4m3fn)
    folder = _save(tmp_path / "d", {"l.weight": w, "n.weight": torch.ones(16)},
                   {"quant_method": "fp8", "weight_block_size": [128, 128]})
    _refused(folder, "l.weight", "without its weight_scale_inv")


def test_int8_asymmetric_without_zero_point(tmp_path):
    """Read as symmetric before."""
    t, args, _ = _int_layer(8, 64, 8, 32, asym=True)
    del t["l.weight_zero_point"]
    _refused(_save(tmp_path / "a", t, _ct(args)), "l.weight_packed",
             "without its weight_zero_point")


def test_companion_without_its_weight(tmp_path):
    t, args, _ = _int_layer(8, 64, 4, 32, asym=False)
    t["x.weight_scale"] = torch.ones(8, 2)
    _refused(_save(tmp_path / "o", t, _ct(args)), "x.weight_scale", "without its quantized")


# ---- 2. headers that contradict the data ----------------------------------------------------
@pytest.mark.parametrize("case,tensor,match", [
    ("bits3", "l.weight_packed", r"weight_shape \[8, 64\] does not match the packed data"),
    ("few_groups", "l.weight_scale", r"expected \[8, 2\]"),
    ("shape_cols", "l.weight_packed", r"weight_shape \[8, 56\] does not match"),
    ("zp_shape", "l.weight_zero_point", r"expected \[1, 2\]"),
    ("sym_with_zp", "l.weight_zero_point", "beside symmetric: true"),
    ("scale_bool", "l.weight_scale", "weight_scale is BOOL"),
    ("scale_i64", "l.weight_scale", "weight_scale is I64"),
    ("float_args", "l.weight_packed", "the config group says float"),
    ("huge_shape", "l.weight_packed", r"weight_shape \[2147483648, 2147483648\]"),
    ("g_idx", "l.weight_g_idx", "activation-order groups"),
])
def test_contradicting_compressed_tensors_headers(tmp_path, case, tensor, match):
    t, args, _ = _int_layer(8, 64, 4, 32, asym=True)
    if case == "bits3":
        args["num_bits"] = 3
    elif case == "few_groups":
        t["l.weight_scale"] = torch.ones(8, 1)      # groups of 32 of 64 columns: 2
    elif case == "shape_cols":
        t["l.weight_shape"] = torch.tensor([8, 56])
    elif case == "zp_shape":
        t["l.weight_zero_point"] = torch.zeros(2, 2, dtype=torch.int32)
    elif case == "sym_with_zp":
        args["symmetric"] = True
    elif case == "scale_bool":
        t["l.weight_scale"] = torch.ones(8, 2, dtype=torch.bool)
    elif case == "scale_i64":
        t["l.weight_scale"] = torch.ones(8, 2, dtype=torch.int64)
    elif case == "float_args":
        args["type"] = "float"
    elif case == "huge_shape":
        t["l.weight_shape"] = torch.tensor([2**31, 2**31])
    elif case == "g_idx":     # GPTQ activation order: listed as a tensor and ignored before
        t["l.weight_g_idx"] = torch.arange(64, dtype=torch.int32) % 2
    _refused(_save(tmp_path / case, t, _ct(args)), tensor, match)


def test_float_weight_beside_a_weight_scale(tmp_path):
    folder = _save(tmp_path / "f32", {"l.weight": torch.ones(8, 32),
                                      "l.weight_scale": torch.ones(8, 1)},
                   _ct({"num_bits": 8, "type": "float", "strategy": "channel"},
                       "float-quantized"))
    _refused(folder, "l.weight", "F32 weight beside a weight_scale")


@pytest.mark.parametrize("field,value", [("num_bits", 9), ("num_bits", "4"),
                                         ("strategy", "rows"), ("group_size", 0),
                                         ("symmetric", "no"), ("type", "posit")])
def test_config_fields_out_of_range_name_config_json(tmp_path, field, value):
    t, args, _ = _int_layer(8, 64, 4, 32, asym=False)
    args[field] = value
    folder = _save(tmp_path / "c", t, _ct(args))
    with pytest.raises(WorkbenchError, match=field) as ei:
        qw.open_model(folder)
    assert ei.value.path.endswith("config.json")
    rc, err = _main("inspect", folder)
    assert rc == 2 and "config.json" in err and len(err.strip().splitlines()) == 1


# ---- correct results: ragged groups, a per-tensor scale --------------------------------------
@pytest.mark.parametrize("cols,gs,asym", [(100, 32, True), (64, 32, False), (72, 72, True)])
def test_int_layers_decode_as_the_package_packs_them(tmp_path, cols, gs, asym):
    """A last group shorter than group_size (100 = 3 x 32 + 4) was grouped by 25 before."""
    t, args, want = _int_layer(6, cols, 4, gs, asym, seed=cols)
    m = qw.open_model(_save(tmp_path / "ok", t, _ct(args)))
    assert np.array_equal(m.read("l.weight"), want)
    assert qw.statistics(m)["l.weight"].absmax == float(np.abs(want).max())


def test_int_per_tensor_scale(tmp_path):
    """A [1] scale (strategy tensor) ended in a reshape ValueError."""
    g = torch.Generator().manual_seed(3)
    q = torch.randint(-8, 8, (5, 40), generator=g, dtype=torch.int8)
    t = {"l.weight_packed": pack_to_int32(q, 4), "l.weight_scale": torch.tensor([0.25]),
         "l.weight_shape": torch.tensor([5, 40])}
    m = qw.open_model(_save(tmp_path / "t", t, _ct({"num_bits": 4, "type": "int",
                                                     "strategy": "tensor"})))
    assert np.array_equal(m.read("l.weight"), q.float().numpy() * np.float32(0.25))


# ---- 4. gpt-oss MXFP4 experts: inspect and statistics ---------------------------------------
def _gpt_oss(folder: Path):
    g = torch.Generator().manual_seed(5)
    e, hidden, inter = 4, 64, 96
    t = {"model.embed_tokens.weight": torch.randn(50, hidden, generator=g).bfloat16(),
         "model.layers.0.mlp.router.weight": torch.randn(e, hidden, generator=g).bfloat16()}
    for proj, out, inn in (("gate_up_proj", 2 * inter, hidden), ("down_proj", hidden, inter)):
        p = f"model.layers.0.mlp.experts.{proj}"
        t[f"{p}_blocks"] = torch.randint(0, 256, (e, out, inn // 32, 16), generator=g,
                                         dtype=torch.uint8)
        t[f"{p}_scales"] = torch.randint(119, 129, (e, out, inn // 32), generator=g,
                                         dtype=torch.uint8)
        t[f"{p}_bias"] = torch.randn(e, out, generator=g)
    return _save(folder, t, {"quant_method": "mxfp4", "modules_to_not_convert": []}), t


def test_gpt_oss_experts_inspect_and_statistics(tmp_path):
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    folder, t = _gpt_oss(tmp_path / "oss")
    rc, err = _main("inspect", folder)
    assert rc == 0, err
    m = qw.open_model(folder)
    stats = qw.statistics(m)
    for proj in ("gate_up_proj", "down_proj"):
        name = f"model.layers.0.mlp.experts.{proj}"
        want = convert_moe_packed_tensors(t[f"{name}_blocks"], t[f"{name}_scales"],
                                          dtype=torch.float32).numpy()
        info = m.info(name)
        assert info.shape == want.shape and info.merged_experts
        assert np.array_equal(m.read(name), want)
        # statistics of the (experts * rows, cols) matrix: every value counted once
        assert m.read_matrix(name).shape == (want.shape[0] * want.shape[1], want.shape[2])
        s = stats[name]
        assert s.count == want.size and s.absmax == float(np.abs(want).max())
        assert s.std == pytest.approx(float(want.astype(np.float64).std()), rel=1e-6)


def test_gpt_oss_scales_without_blocks(tmp_path):
    folder, _ = _gpt_oss(tmp_path / "oss")
    from safetensors.torch import load_file, save_file
    sd = load_file(str(folder / "model.safetensors"))
    del sd["model.layers.0.mlp.experts.down_proj_blocks"]
    save_file(sd, str(folder / "model.safetensors"))
    _refused(folder, "model.layers.0.mlp.experts.down_proj_scales", "without its _blocks")


@pytest.mark.parametrize("shape", [(0, 64), (5, 0), (0, 0)])
@pytest.mark.parametrize("scheme", ["int4-g32-asym", "int8-channel", "fp8-e4m3",
                                    "fp8-e4m3-b128", "nvfp4-g16", "mxfp4-g32"])
def test_empty_weights_of_an_export_still_open(tmp_path, shape, scheme):
    """The exporter writes an empty weight's scales as [rows, 0] / [0, 0]: still read."""
    from workbench.core.progress import run
    from workbench.export import export
    from workbench.export.st_writer import StreamingSafetensorsWriter
    from workbench.quant.plan import Plan
    src = tmp_path / "src"
    src.mkdir()
    w = StreamingSafetensorsWriter(src / "model.safetensors")
    w.add("model.layers.0.mlp.up_proj.weight", np.ones(shape, np.float32))
    w.finish()
    run(export(qw.open_model(src), Plan(default=scheme), "compressed-tensors", tmp_path / "ct"))
    m = qw.open_model(tmp_path / "ct")
    got = m.read("model.layers.0.mlp.up_proj.weight")
    assert got.shape == shape and m.info("model.layers.0.mlp.up_proj.weight").quant

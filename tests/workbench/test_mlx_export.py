"""`export --format mlx` (workbench.export.mlx_folder): folders mlx_lm.load runs with no
warning, for the demo model and the tiny generated architectures mlx-lm has a class for;
mixed plans in config.json's per-module entries; read back by the workbench's own mlx loader
to the exact dequantized values; the safetensors' size predicted to the byte; mlx-lm's logits
against the workbench's in-process evaluation of the same plan."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

import workbench as qw
from workbench.quant.plan import KEEP, Plan

pytest.importorskip("mlx_lm")

TOKENS = [1, 5, 9, 33, 100, 7, 42, 250]


def _mixed(model) -> Plan:
    """A plan using four MLX modes and a kept tensor (per-module config entries); the experts
    of one projection share a scheme (MLX stacks them into one module)."""
    import re
    rules, keys = {}, {}
    for n in model.tensors:
        if model.info(n).ndim != 2 or not re.search(r"(proj|w[123])\.weight$", n):
            continue
        i = keys.setdefault(re.sub(r"\.experts\.\d+\.", ".experts.*.", n), len(keys))
        rules[n] = ["mlx-q3-g32", "mlx-q8-g64", "mlx-mxfp4", "mlx-q5-g128", "mlx-nvfp4",
                    "mlx-q6-g32", "mlx-mxfp8", KEEP][i % 8]
    return Plan(default="mlx-q4-g64", rules=[{"match": n, "scheme": s} for n, s in rules.items()])


def _load(folder: Path):
    from mlx_lm import load
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return load(str(folder))


def _dequantized(folder: Path) -> dict:
    """{mlx parameter: float32 values} of every quantized module of an MLX folder, as the
    workbench's mlx loader reads them."""
    back = qw.open_model(str(folder))
    return {n: np.asarray(back.read(n), np.float32).reshape(back.info(n).shape)
            for n in back.tensors if back.info(n).quant}


def _mlx_logprobs(folder: Path, weights: dict | None = None) -> np.ndarray:
    import mlx.core as mx
    model, _ = _load(folder)
    if weights:
        model.load_weights([(k, mx.array(v)) for k, v in weights.items()], strict=False)
    out = model(mx.array([TOKENS])).astype(mx.float32)
    z = np.array(out)[0].astype(np.float64)
    return z - np.log(np.exp(z - z.max(1, keepdims=True)).sum(1, keepdims=True)) - z.max(
        1, keepdims=True)


def _workbench_logprobs(model, plan) -> np.ndarray:
    """The workbench's in-process evaluation of `plan` for the mlx runtime: each tensor the
    runtime quantizes dequantized by its scheme (numpy reference), run in torch."""
    import torch
    from workbench.core.progress import run
    from workbench.quant.runtimes import plan_decisions
    from workbench.quant.streaming import dequantized
    from workbench.running.runner_passes import get_runner, plan_override, run_outputs
    weights = {n: dequantized(model, n, d.applied)
               for n, d in plan_decisions(model, plan, "mlx").items() if d.applied != KEEP}
    runner = get_runner(model, "cpu")
    out = run(run_outputs(runner, [torch.tensor(TOKENS)], override=plan_override(
        model, weights=weights)))
    return np.asarray(out[0], np.float64)


def _agreement(a: np.ndarray, b: np.ndarray) -> dict:
    """Mean KL(a || b) over positions and top-1 agreement (a, b: log-probs, same positions)."""
    n = min(len(a), len(b))
    a, b = a[:n], b[:n]
    kl = (np.exp(a) * (a - b)).sum(1)
    return {"kl": float(kl.mean()), "top1": float((a.argmax(1) == b.argmax(1)).mean())}


def _export(model, plan, out: Path) -> dict:
    return qw.export_plan(model, plan, "mlx", out, progress=None)


def _read_back_exact(folder: Path, model, plan, info: dict) -> None:
    """Every written tensor, opened by the workbench's mlx loader, is the export scheme's
    dequantized value of the weight in the export's dtype (quantized) or the weight in that
    dtype (float)."""
    from workbench.export import mlx_layout as L
    from workbench.formats.llama_names import read_config
    from workbench.quant.runtimes import plan_decisions
    from workbench.schemes import get_scheme
    from workbench.schemes.mlx.reference import round_to
    back = qw.open_model(str(folder))
    dtype = info["dtype"]
    mods = L.modules(model, plan_decisions(model, plan, "mlx"), read_config(model))
    for m in mods:
        ws = [round_to(np.asarray(model.read_matrix(n), np.float32), dtype) for n in m.sources]
        if m.scheme == KEEP:
            name = next(iter(m.arrays))
            got = np.asarray(back.read(name), np.float32).reshape(-1)
            want = np.concatenate([w.reshape(-1) for w in ws])
        else:
            s = get_scheme(m.scheme).for_dtype(dtype)
            got = np.asarray(back.read(f"{m.path}.weight"), np.float32).reshape(-1)
            want = np.concatenate([s.dequantize(s.quantize(w)).reshape(-1) for w in ws])
        np.testing.assert_array_equal(got, want, err_msg=m.path)


def _entries_match(model, plan, q: dict, default: dict) -> None:
    """Each quantized module's config entry (its own, else the default) is its scheme's."""
    from workbench.export import mlx_layout as L
    from workbench.formats.llama_names import read_config
    from workbench.quant.runtimes import plan_decisions
    from workbench.schemes import get_scheme
    mods = L.modules(model, plan_decisions(model, plan, "mlx"), read_config(model))
    seen = set()
    for m in mods:
        if m.scheme != KEEP:
            assert q.get(m.path, default) == get_scheme(m.scheme).mlx_config, m.path
            seen.add(q.get(m.path, default)["mode"])
        else:
            assert m.path not in q
    assert seen == {"affine", "mxfp4", "nvfp4", "mxfp8"}


def test_demo_model_uniform_and_mixed(tmp_path):
    model = qw.open_model()
    for plan, name in ((Plan(default="mlx-q4-g64"), "uniform"), (_mixed(model), "mixed")):
        out = tmp_path / name
        info = _export(model, plan, out)
        files = sorted(p.name for p in out.iterdir())
        assert "model.safetensors" in files and "config.json" in files and "tokenizer.json" in files
        assert info["safetensors_bytes"] == info["predicted_bytes"] == (
            out / "model.safetensors").stat().st_size
        cfg = json.loads((out / "config.json").read_text())
        q = cfg["quantization"]
        assert q == cfg["quantization_config"]
        default = {k: q[k] for k in ("group_size", "bits", "mode")}
        if name == "uniform":
            assert q == {"group_size": 64, "bits": 4, "mode": "affine"}
        else:
            _entries_match(model, plan, q, default)
        _read_back_exact(out, model, plan, info)
        agree = _agreement(_workbench_logprobs(model, plan), _mlx_logprobs(out))
        # the demo model is bfloat16: mlx runs it in bfloat16, the workbench in float32
        assert agree["kl"] < 0.02 and agree["top1"] >= 0.85, agree


ARCHS = ["llama", "qwen3", "gemma3_text", "phi3", "qwen3_moe", "mixtral"]


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_architectures_load_in_mlx_lm(arch, tiny_arch, tmp_path):
    if arch == "gemma3_text":    # mlx-lm's Gemma 3 needs a global layer: 6 (its pattern)
        from tests.tiny_archs import available, make_tiny
        if arch not in available():
            pytest.skip(f"transformers has no {arch} architecture")
        folder = make_tiny(arch, tmp_path / "src", overrides={"num_hidden_layers": 6})
    else:
        folder = tiny_arch(arch)
    model = qw.open_model(str(folder))
    plan = _mixed(model)
    out = tmp_path / "mlx"
    info = _export(model, plan, out)
    assert info["quantized"] > 0
    assert info["safetensors_bytes"] == info["predicted_bytes"]
    q = json.loads((out / "config.json").read_text())["quantization"]
    _entries_match(model, plan, q, {k: q[k] for k in ("group_size", "bits", "mode")})
    _read_back_exact(out, model, plan, info)
    # mlx-lm's quantized network against the same network in mlx with the workbench's
    # dequantized weights (what its mlx loader reads back) in float: mlx reads the folder as
    # the workbench wrote it
    _export(model, Plan(default=KEEP), tmp_path / "float")
    same = _agreement(_mlx_logprobs(tmp_path / "float", _dequantized(out)), _mlx_logprobs(out))
    assert same["kl"] < 1e-3 and same["top1"] == 1.0, same
    # against the workbench's own in-process evaluation (torch): as close as mlx-lm's float
    # network is to transformers' (Mixtral's differ: routing amplifies it)
    base = _agreement(_workbench_logprobs(model, Plan(default=KEEP)),
                      _mlx_logprobs(tmp_path / "float"))
    agree = _agreement(_workbench_logprobs(model, plan), _mlx_logprobs(out))
    if base["kl"] < 1e-4:
        assert agree["kl"] < 2e-3 and agree["top1"] == 1.0, (agree, base)


@pytest.mark.parametrize("fmt", ["mlx", "gguf", "safetensors"])
def test_activation_ranges_are_refused_by_a_format_that_drops_them(fmt, tmp_path, capsys):
    """`--activations` on a format that stores no activation ranges: a one-line error before
    any work, nothing written (mlx, gguf and safetensors calibrated the ranges, then wrote the
    weights without them, exit 0; found by the fuzz, area mlx-export)."""
    from workbench.cli import main
    from workbench.core.errors import WorkbenchError
    out = tmp_path / "out"
    scheme = "mlx-q4-g64" if fmt == "mlx" else "q8_0"
    assert main(["export", "--scheme", scheme, "--format", fmt, "--activations", "minmax",
                 "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "activation ranges" in err and "onnx" in err, err
    assert not out.exists()
    with pytest.raises(WorkbenchError, match="activations='int8'"):
        qw.export_plan(qw.open_model(), Plan(default=scheme), fmt, out, activations="int8")

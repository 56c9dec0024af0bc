"""Method exports checked by llama.cpp: MiniLM GGUFs quantized with imatrix / GPTQ / AWQ
(calibrated on lines the embedding check does not use) load in llama-embedding, give sentence
embeddings close to the float model's, and closer than round-to-nearest in the same bytes."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from workbench.export import export
from workbench.formats.loaders import open_model
from workbench.running.methods_apply import prepare
from workbench.quant.plan import Plan
from workbench.core.progress import run

from .conftest import ROOT, llama_embeddings

pytestmark = pytest.mark.runtime


def _cos(a, b):
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.fixture(scope="module")
def calib_lines(tmp_path_factory):
    lines = [s for s in (ROOT / "resources" / "calibration.txt").read_text().splitlines()
             if s.strip()][24:]                      # the embedding check uses the first 24
    p = tmp_path_factory.mktemp("calib") / "calib.txt"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_method_ggufs_embed_in_llama_cpp(llama_bin, minilm_folder, sentences, minilm_reference,
                                         calib_lines, tmp_path):
    model = open_model(minilm_folder)
    cos = {}
    for method in ("rtn", "imatrix", "gptq", "awq"):
        plan = Plan("q3_k", method=method)
        mm = run(prepare(model, plan, calib=str(calib_lines), runtime="llama.cpp"))
        out = tmp_path / f"minilm-q3k-{method}.gguf"
        info = run(export(mm, plan, "gguf", out))
        assert info["runnable_by_llama_cpp"]
        types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(out)).tensors}
        assert types["blk.0.ffn_down.weight"] == "Q3_K"
        c = _cos(llama_embeddings(llama_bin, out, sentences[1]), minilm_reference)
        cos[method] = c
        print(f"\nllama-embedding q3_k {method}: cosine mean {c.mean():.5f} min {c.min():.5f}")
    for method in ("imatrix", "gptq", "awq"):
        assert cos[method].min() >= 0.9, method
        assert cos[method].mean() > cos["rtn"].mean(), (method, cos[method].mean(),
                                                        cos["rtn"].mean())

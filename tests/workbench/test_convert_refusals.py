"""`convert`'s refusals name the user's files, never the temporary folder it wrote into (gone
by the time the message is read): a GGUF whose tensors or metadata do not make a network."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from workbench.cli import main
from workbench.core.progress import run
from workbench.export import export
from workbench.formats.loaders import open_model
from workbench.quant.plan import Plan

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gguf_rewrite import rewrite_gguf  # noqa: E402

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def f32(tiny_arch, tmp_path_factory):
    g = tmp_path_factory.mktemp("refuse") / "m.gguf"
    run(export(open_model(tiny_arch("llama")), Plan(default="fp32"), "gguf", g))
    return g


@pytest.mark.parametrize("change, words", [
    (dict(drop={"blk.0.attn_q.weight"}), "q_proj.weight"),
    (dict(kv={"llama.block_count": 3}), "num_hidden_layers is 3"),
    (dict(kv={"llama.embedding_length": 128}), "hidden_size is 128"),
])
def test_refusal_names_the_output_and_the_gguf(f32, tmp_path, capsys, change, words):
    bad = tmp_path / "src" / "bad.gguf"
    bad.parent.mkdir()
    rewrite_gguf(f32, bad, **change)
    out = tmp_path / "out"
    for argv, named in ((["convert", str(bad), "--to", "hf", str(out)], str(out)),
                        (["check", str(bad), "--scheme", "q8_0", "--samples", "2"], str(bad))):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err
        assert "quant-workbench-" not in err[0] and ".tmp" not in err[0], err   # no temp folder
        assert named in err[0] and str(bad) in err[0], err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["src"]

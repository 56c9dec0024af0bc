"""`convert` and the on-the-fly model read a GGUF's vocabulary through the project's header
parser (workbench.export.convert.gguf_meta), once: the config and tokenizer equal those
transformers builds on its own; a tokenizer listing more tokens than the embedding has rows is
refused before any tokenizer is built; the limits prescan walks a vocabulary in memory."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from workbench.cli import main
from workbench.core.errors import WorkbenchError
from workbench.core.progress import run
from workbench.export import export
from workbench.formats.loaders import open_model
from workbench.quant.plan import Plan

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gguf_rewrite import rewrite_gguf  # noqa: E402

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def ggufs(tiny_arch, tmp_path_factory):
    d = tmp_path_factory.mktemp("vocab")
    out = {}
    for arch in ("llama", "gemma3_text"):
        g = d / arch / "m.gguf"
        g.parent.mkdir()
        run(export(open_model(tiny_arch(arch)), Plan(default="q8_0"), "gguf", g))
        out[arch] = g
    return out


def _plain(gguf_path: Path):
    """transformers' own config and tokenizer of the GGUF (no workbench reader)."""
    import transformers
    cfg = transformers.AutoConfig.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    tok = transformers.AutoTokenizer.from_pretrained(str(gguf_path.parent),
                                                     gguf_file=gguf_path.name)
    return json.loads(cfg.to_json_string(use_diff=False)), tok


def _tokenizer_json(tok, folder: Path) -> dict:
    tok.save_pretrained(str(folder))
    return json.loads((folder / "tokenizer.json").read_text())


@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_the_fast_reader_gives_transformers_own_config_and_tokenizer(ggufs, arch, tmp_path):
    from workbench.export.convert.hf import _clean_config, read_config_and_tokenizer
    import transformers
    g = ggufs[arch]
    md_arch = open_model(g).metadata["general.architecture"]
    cfg, tok = read_config_and_tokenizer(str(g), md_arch, open_model(g).source)
    ref_cfg, ref_tok = _plain(g)
    ref = _clean_config(transformers.AutoConfig.for_model(**{
        k: v for k, v in ref_cfg.items() if k != "transformers_version"}))
    assert cfg == ref
    assert _tokenizer_json(tok, tmp_path / "a") == _tokenizer_json(ref_tok, tmp_path / "b")
    text = "hello world, the quick brown fox"
    assert tok(text).input_ids == ref_tok(text).input_ids


def test_more_tokens_than_embedding_rows_is_refused_before_any_tokenizer(ggufs, tmp_path,
                                                                         capsys):
    import gguf
    src = ggufs["llama"]
    r = gguf.GGUFReader(str(src))
    toks = r.fields["tokenizer.ggml.tokens"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    n = 200_000
    big = tmp_path / "g" / "big.gguf"
    big.parent.mkdir()
    rewrite_gguf(src, big, kv={"tokenizer.ggml.tokens": toks + [f"extra{i}" for i in range(n)],
                               "tokenizer.ggml.token_type": types + [1] * n})
    for argv in (["convert", str(big), "--to", "hf", str(tmp_path / "out")],
                 ["check", str(big), "--scheme", "q8_0", "--samples", "2"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and str(big) in err[0] and "tokenizer.ggml.tokens lists 200,512 " \
            "tokens, but token_embd.weight has 512 rows" in err[0], err
    assert not (tmp_path / "out").exists()


def test_prescan_walks_string_arrays_and_still_refuses_a_truncated_one(ggufs, tmp_path):
    from workbench.core.limits import prescan_gguf
    src = ggufs["llama"]
    prescan_gguf(src)
    data = src.read_bytes()
    pos = data.index(b"tokenizer.ggml.tokens")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:pos + 4000])          # inside the token array
    with pytest.raises(WorkbenchError, match="truncated GGUF header|runs past the file"):
        prescan_gguf(cut)
    # a token whose length runs past the file
    bad = bytearray(data)
    first = pos + len(b"tokenizer.ggml.tokens") + 4 + 4 + 8     # type, item type, count
    bad[first:first + 8] = np.uint64(len(data)).tobytes()
    (tmp_path / "bad.gguf").write_bytes(bytes(bad))
    with pytest.raises(WorkbenchError, match="GGUF string of .* bytes runs past the file"):
        prescan_gguf(tmp_path / "bad.gguf")

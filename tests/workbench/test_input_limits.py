"""Limits on what an input may make the workbench do: repetition counts RE2 would read as
literal text, a folder holding only a PyTorch index, the wording of JSON header errors; sidecar
files (config.json, tokenizer files, shard indexes), plans and sessions size-limited before they
are read; untrusted regular expressions run on RE2; JSON nested too deep is one line naming it."""

from __future__ import annotations

import json

import pytest

from workbench.core.errors import WorkbenchError
from workbench.formats.loaders import open_model
from workbench.core.patterns import compile_pattern
from workbench.quant.plan import Plan


@pytest.mark.parametrize("pattern", ["a{4294967296}", "a{2,99999999999999999999}", "a{1001}",
                                     "(x|y){5000}"])
def test_huge_repetition_counts_are_refused(pattern):
    with pytest.raises(WorkbenchError, match="repetition count"):
        compile_pattern(pattern)


def test_repetition_limit_keeps_re_search_semantics():
    assert compile_pattern("a{1000}").search("b" + "a" * 1000)
    assert not compile_pattern("a{1000}").search("a" * 999)
    # braces that are literal text (escaped, inside a class) are not counts
    assert compile_pattern(r"\{99999}").search("x{99999}")
    assert compile_pattern("[{]{2}").search("{{")


def test_plan_rule_with_overflowing_count_is_a_clear_error(tmp_path):
    p = tmp_path / "plan.json"
    p.write_text(json.dumps({"format": "quant-workbench-plan", "version": 1,
                             "default": "int8-channel",
                             "rules": [{"match": "re:a{4294967296}", "scheme": "fp16"}]}))
    with pytest.raises(WorkbenchError) as ei:
        Plan.load(p)
    assert str(p) in str(ei.value) and "4294967296" in str(ei.value)


def test_folder_with_only_a_pytorch_index_pointing_outside(tmp_path):
    (tmp_path / "pytorch_model.bin.index.json").write_text(
        json.dumps({"weight_map": {"a": "/etc/passwd"}}))
    with pytest.raises(WorkbenchError) as ei:
        open_model(tmp_path)
    msg = str(ei.value)
    assert "outside its folder" in msg and "root:" not in msg


def test_duplicate_key_header_error_reads_once(tmp_path):
    hb = (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},'
          b' "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}')
    p = tmp_path / "d.safetensors"
    p.write_bytes(len(hb).to_bytes(8, "little") + hb + b"\0" * 4)
    with pytest.raises(WorkbenchError) as ei:
        open_model(p)
    msg = str(ei.value)
    assert msg == f"{p}: corrupt safetensors header (duplicate key 'a')"


def test_pytorch_record_cut_short_is_refused(tmp_path):
    """mmap=True would map the bytes after a short record as weights: refused instead."""
    import io
    import zipfile

    import torch

    from workbench.core.errors import WorkbenchError
    from workbench.formats.loaders import open_model
    buf = io.BytesIO()
    torch.save({"a": torch.arange(64, dtype=torch.float32).reshape(8, 8), "b": torch.ones(8, 8)},
               buf)
    src = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename.endswith("/data/0"):
                data = data[:100]
            z.writestr(info, data)
    p = tmp_path / "short.pt"
    p.write_bytes(out.getvalue())
    import pytest
    with pytest.raises(WorkbenchError, match="cut short"):
        open_model(p)
    ok = tmp_path / "ok.pt"
    torch.save({"a": torch.ones(4, 4), "view": torch.ones(4, 4)[1:]}, ok)
    assert open_model(ok).info("view").shape == (3, 4)

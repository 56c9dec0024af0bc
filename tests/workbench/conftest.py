"""Fixtures of tests/workbench: a small safetensors model written on demand, the demo model as a
q8_0 GGUF (exported once per session), the CLI run in-process."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "resources" / "demo_model"


def _main(*argv) -> tuple[int, str]:
    from workbench.cli import main
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main([str(a) for a in argv])
    return rc, err.getvalue()


@pytest.fixture
def cli_main():
    """cli_main(*argv) -> (exit code, stderr) of `quant-workbench ARGV` run in this process."""
    return _main


def _small_model(folder: Path, tensors=None) -> Path:
    from workbench.export.st_writer import StreamingSafetensorsWriter
    folder.mkdir(parents=True, exist_ok=True)
    w = StreamingSafetensorsWriter(str(folder / "model.safetensors"))
    rng = np.random.default_rng(0)
    for name, shape in (tensors or [("blk.0.attn_q.weight", (8, 64)),
                                    ("blk.0.ffn_up.weight", (16, 64))]):
        w.add(name, rng.standard_normal(shape).astype(np.float32))
    w.finish()
    return folder / "model.safetensors"


@pytest.fixture
def small_model():
    """small_model(folder, tensors=None) -> folder/model.safetensors: float32 tensors of the
    given (name, shape) pairs, by default a (8, 64) attn_q and a (16, 64) ffn_up of block 0."""
    return _small_model


@pytest.fixture(scope="session")
def demo_gguf(tmp_path_factory) -> Path:
    """The demo model exported as a q8_0 GGUF, once per session (tests only read it)."""
    out = tmp_path_factory.mktemp("demo-gguf") / "demo.gguf"
    rc, err = _main("export", DEMO, "--scheme", "q8_0", "--format", "gguf", "-o", out)
    assert rc == 0, err
    return out

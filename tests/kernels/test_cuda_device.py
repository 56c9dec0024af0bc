"""The CUDA kernels on a real GPU (skipped without one): cudasim_checks.py --real in a fresh
process, every base scheme bit for bit against the numpy references on matrices that fill
many thread blocks. CI has no GPU; run it where one is (docs/kernels.md, "On a GPU")."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def _gpu() -> bool:
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or not (
            os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl")):
        return False
    proc = subprocess.run([sys.executable, "-c", "from numba import cuda; "
                           "print(int(cuda.is_available()))"],
                          capture_output=True, text=True, timeout=120)
    return proc.stdout.strip().endswith("1")


@pytest.mark.skipif(not _gpu(), reason="no CUDA GPU (numba.cuda.is_available() is False)")
def test_cuda_kernels_on_the_gpu_equal_the_references():
    here = os.path.dirname(__file__)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    proc = subprocess.run([sys.executable, os.path.join(here, "cudasim_checks.py"), "--real"],
                          env=env, capture_output=True, text=True, timeout=900)
    print(proc.stdout[-3000:])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "cuda:" in proc.stdout and " 0 failure(s)" in proc.stdout

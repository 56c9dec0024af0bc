"""numba's start in a fresh process: the kernels load without importing scipy.linalg (numba's
BLAS check gets the cython_blas extension loaded on its own, kernels/_numba_prelude.py) and a
GGML quantize with backend "auto" runs the CPU kernel without probing for a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(code: str) -> dict:
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_kernels_load_without_scipy_linalg_and_blas_stays_available():
    got = _run(
        "import json, sys, numpy as np\n"
        "from kernels import convert\n"
        "a = convert.f16_to_f32(np.arange(100, dtype=np.float16))\n"
        "from numba.np import arraymath\n"
        "before = 'scipy.linalg' in sys.modules\n"
        "import scipy.linalg, scipy.linalg.cython_blas as cb\n"
        "from scipy.linalg import cython_blas as cb2\n"
        "print(json.dumps({'linalg_before': before, 'blas': bool(arraymath._HAVE_BLAS),\n"
        "  'same': cb is cb2 is sys.modules['scipy.linalg.cython_blas'],\n"
        "  'capi': 'sgemm' in getattr(cb, '__pyx_capi__', {}),\n"
        "  'ok': a.tolist() == list(range(100))}))\n")
    assert got == {"linalg_before": False, "blas": True, "same": True, "capi": True, "ok": True}


def test_ggml_quantize_on_auto_backend_does_not_probe_cuda():
    got = _run(
        "import json, sys, numpy as np\n"
        "from workbench import accel\n"
        "from workbench.schemes import get_scheme\n"
        "w = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)\n"
        "qt = accel.quantize('q8_0', w)\n"
        "ref = get_scheme('q8_0').quantize(w)\n"
        "print(json.dumps({'cuda': 'numba.cuda' in sys.modules,\n"
        "  'kernel': accel.has_kernel('q8_0', 'quantize', 'cpu'),\n"
        "  'equal': qt.arrays['blocks'].tobytes() == ref.arrays['blocks'].tobytes()}))\n")
    assert got == {"cuda": False, "kernel": True, "equal": True}

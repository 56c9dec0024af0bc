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
        "from workbench.quant import accel\n"
        "from workbench.schemes import get_scheme\n"
        "w = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)\n"
        "qt = accel.quantize('q8_0', w)\n"
        "ref = get_scheme('q8_0').quantize(w)\n"
        "print(json.dumps({'cuda': 'numba.cuda' in sys.modules,\n"
        "  'kernel': accel.has_kernel('q8_0', 'quantize', 'cpu'),\n"
        "  'equal': qt.arrays['blocks'].tobytes() == ref.arrays['blocks'].tobytes()}))\n")
    assert got == {"cuda": False, "kernel": True, "equal": True}


def test_cached_kernels_load_without_numba_registries_and_give_the_same_bytes():
    """A kernel loaded from numba's cache in a fresh process skips the CPU context's refresh
    (numba's linalg/polynomial/cffi registries are never imported) and computes the very bytes
    a process with numba's own refresh computes; a kernel family not used is not imported."""
    code = (
        "import hashlib, json, os, sys, numpy as np\n"
        "if os.environ.get('QW_FULL_REFRESH'):\n"
        "    import numba  # numba's own load path: refresh first\n"
        "    from numba.core import caching\n"
        "    import kernels._numba_prelude\n"
        "    caching.Cache.load_overload = caching.Cache.load_overload.__wrapped__\n"
        "from workbench.quant import accel\n"
        "from kernels import convert\n"
        "rng = np.random.default_rng(1)\n"
        "w = (rng.standard_normal((96, 512)) * 0.05).astype(np.float16)\n"
        "f = convert.f16_to_f32(w)\n"
        "h = hashlib.sha256(f.tobytes())\n"
        "for s in ('q4_0', 'q8_0', 'q6_k', 'q4_k', 'q5_0'):\n"
        "    h.update(accel.quantize(s, f, backend='cpu').arrays['blocks'].tobytes())\n"
        "print(json.dumps({'sha': h.hexdigest(),\n"
        "  'registries': sorted(m for m in ('numba.np.linalg', 'numba.np.polynomial',\n"
        "                                   'numba.core.typing.cffi_utils') if m in sys.modules),\n"
        "  'affine': any(m.startswith('kernels.cpu_affine') for m in sys.modules)}))\n")
    _run(code)                                  # compiles into the cache where needed
    fast = _run(code)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       timeout=600, env={**os.environ, "QW_FULL_REFRESH": "1"})
    assert p.returncode == 0, p.stderr[-2000:]
    full = json.loads(p.stdout.strip().splitlines()[-1])
    assert fast == {"sha": full["sha"], "registries": [], "affine": False}
    assert full["registries"] == ["numba.core.typing.cffi_utils", "numba.np.linalg",
                                  "numba.np.polynomial"]


def test_cache_loads_for_other_targets_and_failures_take_numbas_own_path():
    got = _run(
        "import json\n"
        "import kernels._numba_prelude\n"
        "from numba.core import caching\n"
        "calls = []\n"
        "class Ctx:\n"
        "    def refresh(self): calls.append('refresh')\n"
        "class C:\n"
        "    load_overload = caching.Cache.load_overload\n"
        "    def _load_overload(self, sig, ctx): calls.append('load'); return 'cres'\n"
        "    def _guard_against_spurious_io_errors(self):\n"
        "        import contextlib; return contextlib.nullcontext()\n"
        "r = C().load_overload(None, Ctx())\n"
        "print(json.dumps({'calls': calls, 'r': r,\n"
        "  'marked': caching.Cache.load_overload._skips_refresh}))\n")
    # a context that is not numba's CPU context: refresh first, then load (numba's method)
    assert got == {"calls": ["refresh", "load"], "r": "cres", "marked": True}


def test_a_change_to_any_kernels_module_makes_every_cached_kernel_stale(tmp_path):
    """numba stamps a cache entry with the function's own file; the kernels inline helpers
    from other modules, so kernels/ stamps every entry with a digest of all its modules: a
    helper's edit alone then recompiles the kernels that inline it. Functions elsewhere keep
    numba's own locators and stamps."""
    from kernels._numba_prelude import package_digest
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "b.py").write_text("y = 2\n")
    (tmp_path / "notes.txt").write_text("not a module\n")
    d0 = package_digest(str(tmp_path))
    assert package_digest(str(tmp_path)) == d0
    (tmp_path / "notes.txt").write_text("changed, still not a module\n")
    assert package_digest(str(tmp_path)) == d0
    (tmp_path / "b.py").write_text("y = 3\n")          # same size, new content
    os.utime(tmp_path / "b.py", ns=(1, 1))
    d1 = package_digest(str(tmp_path))
    assert d1 != d0
    (tmp_path / "c.py").write_text("")                  # a new module
    assert package_digest(str(tmp_path)) != d1
    mod = tmp_path / "elsewhere.py"
    mod.write_text("from numba import njit\n\n@njit(cache=True)\ndef f(x):\n    return x + 1\n")
    got = _run(
        "import json, sys, numpy as np\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "from kernels import cpu_affine_fused, cpu_common\n"
        "from kernels._numba_prelude import package_digest\n"
        "from workbench.quant import accel\n"
        "accel.quantize('int4-g128', np.ones((2, 256), np.float32), backend='cpu')\n"
        "import elsewhere\n"
        "elsewhere.f(1)\n"
        "loc = cpu_affine_fused.quant_rows._cache._impl._locator\n"
        "other = elsewhere.f._cache._impl._locator\n"
        "print(json.dumps({'mine': type(loc).__name__,\n"
        "  'stamp': loc.get_source_stamp() == package_digest(),\n"
        "  'helper_module': type(cpu_common._acc_row._cache._impl._locator).__name__,\n"
        "  'other': type(other).__name__,\n"
        "  'other_stamp': other.get_source_stamp() != package_digest()}))\n")
    assert got == {"mine": "WholePackageInTreeCacheLocator", "stamp": True,
                   "helper_module": "WholePackageInTreeCacheLocator",
                   "other": "InTreeCacheLocator", "other_stamp": True}

"""Backend selection, cheap import, fallbacks and warm-up."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import kernels

from workbench.quant import accel
from kernels import backend as kb
from workbench.schemes import get_scheme


def test_import_is_cheap_and_does_not_import_numba_or_qt():
    code = ("import sys, kernels; assert 'numba' not in sys.modules, 'numba imported'; "
            "assert not any(m.startswith('PySide') for m in sys.modules); print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


@pytest.mark.skipif(kb.cuda_available(), reason="a GPU is present")
def test_auto_is_cpu_without_gpu():
    assert kernels.backend_name() == "cpu"
    assert kb.resolve("auto") == "cpu"
    assert kernels.device_name().startswith("CPU")
    with pytest.raises(RuntimeError):
        kb.resolve("cuda")
    w = np.ones((2, 64), np.float32)
    qt = accel.quantize("int8-g64", w)          # auto
    assert np.array_equal(accel.dequantize(qt), get_scheme("int8-g64").dequantize(qt))


def test_unknown_backend():
    with pytest.raises(ValueError):
        kb.resolve("tpu")


def test_has_kernel_reports_fallbacks():
    assert accel.has_kernel("int4-g128", "dequantize", "cpu")
    assert accel.has_kernel("int4-g128@mse", "quantize", "cpu")
    assert accel.has_kernel("q4_0", "quantize", "cpu") == ("q4_0" in _registered())
    if "q4_k" in _registered():
        assert accel.has_kernel("q4_k", "quantize", "cpu")       # kernels/kquant_affine.py
        assert not accel.has_kernel("q4_k", "quantize", "numpy")
        assert accel.has_kernel("q4_k", "dequantize", "cuda")
    assert not accel.has_kernel("ternary-g64", "quantize", "cuda")
    assert accel.has_kernel("fp8-e4m3", "quantize", "cuda")
    assert not accel.has_kernel("int4-g128", "dequantize", "numpy")


def _registered():
    from workbench.schemes import list_schemes
    return set(list_schemes())


def test_fallback_for_a_scheme_without_kernel():
    from workbench.schemes.base import Scheme

    class Halver(Scheme, register=False):
        name = "halver-test"

        def nbytes(self, shape):
            return 4 * int(np.prod(shape))

        def _quantize(self, w):
            return {"data": (w / 2).astype(np.float32)}

        def _dequantize(self, arrays, rows, cols):
            return (arrays["data"] * 2).reshape(rows, cols)

    s = Halver()
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert not accel.has_kernel(s, "dequantize", "cpu")
    qt = accel.quantize(s, w, backend="cpu")
    with pytest.MonkeyPatch.context() as mp:
        import workbench.schemes.base as base
        mp.setattr(base, "get_scheme", lambda n: s)
        mp.setattr(accel, "_scheme", lambda x: s)
        assert np.array_equal(accel.dequantize(qt, backend="cpu"), w)
        assert accel.dequant_error(w, qt, backend="cpu").sse == 0.0


def test_warmup_compiles_and_reports():
    done = accel.warmup(["int4-g128", "nf4-g64", "fp16", "fp8-e4m3"])
    assert done == ["int4-g128", "nf4-g64", "fp16", "fp8-e4m3"]
    assert accel.warmup([], backend="numpy") == []


def test_warmup_on_a_background_thread():
    import threading
    errors = []

    def run():
        try:
            accel.warmup(["int2-g32", "bf16"])
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
    t = threading.Thread(target=run)
    t.start()
    t.join(300)
    assert not errors and not t.is_alive()


def test_empty_tensor():
    s = get_scheme("int4-channel")
    w = np.zeros((0, 8), np.float32)
    qt = accel.quantize(s, w, backend="cpu")
    assert accel.dequantize(qt, backend="cpu").shape == (0, 8)


def test_a_gpu_whose_numba_cuda_compiler_cannot_load_means_the_cpu_kernels(tmp_path):
    """Seen on a GPU machine: numba-cuda's compiler imports np.row_stack, which numpy 2.5
    removed, so the first kernel launch raised. The backend probe loads the compiler: such a
    GPU is not used, "auto" is the CPU, and asking for "cuda" says why."""
    import os
    fake = tmp_path / "numba"
    (fake / "cuda").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "cuda" / "__init__.py").write_text("def is_available():\n    return True\n")
    (fake / "cuda" / "cudaimpl.py").write_text(
        "raise AttributeError(\"module 'numpy' has no attribute 'row_stack'\")\n")
    code = ("from kernels import backend as kb\n"
            "assert kb.cuda_available() is False\n"
            "assert kb.resolve('auto') == 'cpu'\n"
            "why = kb.cuda_problem()\n"
            "assert 'row_stack' in why and 'numpy' in why, why\n"
            "try:\n    kb.resolve('cuda')\nexcept RuntimeError as e:\n    print('refused:', e)\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), root]))
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert "refused: backend 'cuda' requested but a GPU is present but numba's CUDA compiler" \
        in out.stdout

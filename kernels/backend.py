"""Backend selection: "auto" = CUDA when ``numba.cuda.is_available()``, else the CPU kernels.

Nothing here imports numba until a question is asked, and no answer ever raises: without a GPU
(or without a working CUDA driver) "auto" quietly means "cpu".
"""

from __future__ import annotations

import os
import threading
from functools import lru_cache

BACKENDS = ("auto", "cpu", "cuda", "numpy")
_lock = threading.Lock()


@lru_cache(maxsize=None)
def cuda_available() -> bool:
    """True when numba.cuda sees a usable GPU (or the CUDA simulator is enabled) and its
    kernel compiler loads: a numba-cuda that cannot load beside the installed numpy (seen:
    numba-cuda importing ``np.row_stack``, which numpy 2.5 removed) would fail at the first
    kernel launch, so the GPU is not used and `cuda_problem()` says why."""
    with _lock:
        try:
            from numba import cuda
            if not cuda.is_available():
                return False
        except Exception as exc:  # noqa: BLE001  (no driver, broken toolkit: all mean "no")
            _PROBLEM[0] = f"numba.cuda: {type(exc).__name__}: {exc}"
            return False
        if simulator_enabled():
            return True
        try:
            import numba.cuda.cudaimpl  # noqa: F401  (the compiler's lowering registries)
        except Exception as exc:  # noqa: BLE001
            import numpy
            _PROBLEM[0] = (f"a GPU is present but numba's CUDA compiler does not load with numpy "
                           f"{numpy.__version__} ({type(exc).__name__}: {exc}); "
                           "using the CPU kernels")
            return False
        return True


_PROBLEM: list = [None]


def cuda_problem() -> str | None:
    """Why CUDA is not used although numba.cuda is installed (None: no known problem)."""
    cuda_available()
    return _PROBLEM[0]


def simulator_enabled() -> bool:
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def resolve(backend: str = "auto") -> str:
    """The concrete backend ("cpu", "cuda" or "numpy") that `backend` stands for."""
    b = (backend or "auto").lower()
    if b not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if b == "auto":
        return "cuda" if cuda_available() else "cpu"
    if b == "cuda" and not cuda_available():
        why = cuda_problem() or "numba.cuda finds no GPU"
        raise RuntimeError(f"backend 'cuda' requested but {why}")
    return b


def backend_name() -> str:
    """What "auto" uses: "cuda" or "cpu"."""
    return resolve("auto")


@lru_cache(maxsize=None)
def device_name() -> str:
    """A human description of the device "auto" runs on (for the GUI status bar, bench JSON)."""
    if backend_name() == "cuda":
        try:
            from numba import cuda
            if simulator_enabled():
                return "CUDA simulator"
            dev = cuda.get_current_device()
            name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
            return f"CUDA {name}"
        except Exception:  # noqa: BLE001
            return "CUDA device"
    import platform
    try:
        import numba
        threads = numba.config.NUMBA_NUM_THREADS
    except Exception:  # noqa: BLE001
        threads = os.cpu_count() or 1
    cpu = platform.processor() or platform.machine() or "CPU"
    return f"CPU {cpu}, {threads} thread(s)"

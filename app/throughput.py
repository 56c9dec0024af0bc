"""Measured dequantization throughput of the kernels (Qt-free, compute thread only).

`dequant_gbs(model, name, scheme)` times `accel.dequantize(qt)` on the real tensor:
float32 bytes written / seconds, best of a few runs after a warm-up run. The best, not the
median: the GUI thread holds the GIL while it paints, and a run that the interpreter's
5 ms switch interval interrupts measures the GUI, not the kernel (the `bench` command, which
runs alone, reports medians). A scheme without a dequantize kernel is timed on the numpy
reference accel falls back to (what the window then runs).
"""

from __future__ import annotations

import time

from workbench.api.tensors import quantize
from workbench.api.plans import KEEP
from workbench.api.plans import get_scheme


def backend_name() -> str:
    import kernels
    return str(kernels.backend_name())


def warmup() -> str:
    """Import and warm the kernels (JIT) — call on a background thread at start-up."""
    import kernels
    from workbench.api.tensors import accel
    accel.warmup()
    return str(kernels.backend_name())


def warmup_job(first=()):
    """Job: compile (or load from numba's cache) the kernels scheme by scheme, `first` (the
    open plan's schemes) before the rest, so the work queue shows each kernel as it is ready
    ("compiled q4_k", i/N) and a cancel stops between two schemes. Returns the backend name."""
    import kernels
    from workbench.core.progress import Progress
    from workbench.api.tensors import accel
    from workbench.api.plans import list_schemes
    names = list(dict.fromkeys([s for s in first if s != KEEP] + list(list_schemes())))
    yield Progress(0, len(names), f"compiling {names[0]}" if names else "")
    for i, name in enumerate(names):
        try:
            accel.warmup([name])
        except Exception:  # noqa: BLE001 - a kernel that fails here fails where used, loudly
            pass
        yield Progress(i + 1, len(names), f"compiled {name}")
    return str(kernels.backend_name())


def dequant_gbs(model, name: str, scheme_name: str, repeats: int = 25,
                budget_s: float = 0.5) -> float | None:
    """GB/s of float32 output for dequantizing this tensor with this scheme, or None."""
    from workbench.api.tensors import accel
    if scheme_name == KEEP:
        return None
    info = model.info(name)
    if not info.is_float or get_scheme(scheme_name).ineligible_reason(info.shape):
        return None
    import numpy as np
    qt = quantize(model.read_matrix(name), scheme_name, tensor=name)
    out = np.empty(info.numel, np.float32)
    return warm_gbs(lambda: accel.dequantize(qt, out=out), info.numel * 4, repeats, budget_s)


def warm_gbs(run, out_bytes: int, repeats: int = 25, budget_s: float = 0.5,
             max_warmup: int = 5) -> float | None:
    """GB/s of `run()` (writing `out_bytes`) measured warm only.

    Warm-up calls (JIT compilation, caches, page faults) repeat until one is no slower than
    twice the one before it (at most `max_warmup`), so a compile — numba's first call of a
    type, or a compile still running on another thread — never enters the figure; then the
    best of the timed runs."""
    prev = None
    for _ in range(max_warmup):
        t0 = time.perf_counter()
        run()
        t = time.perf_counter() - t0
        if prev is not None and t <= 2.0 * prev:
            break
        prev = t
    times = []
    start = time.perf_counter()
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
        if time.perf_counter() - start > budget_s and len(times) >= 3:
            break
    sec = min(times)
    return out_bytes / sec / 1e9 if sec > 0 else None

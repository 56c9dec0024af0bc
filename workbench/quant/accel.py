"""The bridge from schemes to the kernel layer: dequantize, quantize, dequant_error,
has_kernel, warmup.

    from workbench.quant import accel
    qt = accel.quantize("int4-g128", w)        # == get_scheme("int4-g128").quantize(w)
    w2 = accel.dequantize(qt)                  # float32, bit-identical to the numpy reference
    sums = accel.dequant_error(w, qt)          # workbench.quant.metrics.ErrorSums, one pass

Every call picks a backend ("auto" | "cpu" | "cuda" | "numpy"), turns the scheme's declared
layout (``Scheme.kernel_layout()``, plain data) into a kernel spec (``kernels.spec.make_spec``)
and hands the kernels plain arrays and that spec; a scheme no kernel covers runs its numpy
reference. Results are bit-identical to the reference (tests/kernels). The layers read top
to bottom: ``workbench`` imports ``kernels``; ``kernels`` imports nothing from ``workbench``.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from kernels import backend as _backend
from kernels.spec import Spec, make_spec


_CUDA_QUANT = ("int", "nf4", "fp8")   # spec.quant kinds with a CUDA quantize kernel


def _scheme(s):
    from workbench.schemes import get_scheme
    return get_scheme(s) if isinstance(s, str) else s


@lru_cache(maxsize=None)
def _spec_cached(scheme) -> Spec | None:
    return make_spec(scheme.kernel_layout())


def spec_for(scheme) -> Spec | None:
    """The kernel spec of a scheme object (or name); None when no kernel covers it."""
    scheme = _scheme(scheme)
    try:
        return _spec_cached(scheme)
    except TypeError:          # unhashable scheme object
        return make_spec(scheme.kernel_layout())


def _choose_qparams(scheme, w2d):
    """The scheme's reference qparams for host.int_qparams: from per-block (lo, hi) pairs, or
    (None) from the whole blocks (clipping that needs every value)."""
    def choose(lo_hi):
        if lo_hi is not None:
            return scheme.choose_qparams(lo_hi)
        from workbench.schemes.granularity import as_blocks
        return scheme.choose_qparams(as_blocks(w2d, scheme.gran))
    return choose


def has_kernel(scheme, op: str = "dequantize", backend: str = "cpu") -> bool:
    """True when `op` ("dequantize" | "quantize" | "error") of `scheme` runs a fast kernel on
    `backend` ("cpu" | "cuda"; "auto" = the backend auto picks), False when it uses numpy."""
    b = _backend.backend_name() if backend == "auto" else backend
    if b == "numpy":
        return False
    spec = spec_for(_scheme(scheme))
    if spec is None:
        return False
    if op == "quantize":
        if b == "cuda":
            return spec.quant in ("int", "nf4", "fp8")
        return spec.quant is not None
    if op in ("dequantize", "error"):
        return b in ("cpu", "cuda")
    raise ValueError(f"unknown op {op!r}")


def _out_array(out, shape, n):
    if out is None:
        return np.empty(shape, np.float32)
    if out.dtype != np.float32 or out.size != n or not out.flags.c_contiguous:
        raise ValueError("out must be a C-contiguous float32 array with one element per weight")
    return out


def dequantize(qt, backend: str = "auto", out: np.ndarray | None = None, device_array: bool = False):
    """Dequantize a QuantizedTensor to float32 of its original shape.

    backend: "auto" (CUDA when available, else CPU), "cpu", "cuda" or "numpy" (the reference).
    out: an optional float32 array to write into (same number of elements).
    device_array: with the CUDA backend, return the numba device array (no copy to the host).
    """
    from workbench.schemes.base import matrix_shape
    scheme = _scheme(qt.scheme)
    b = _backend.resolve(backend)
    rows, cols = matrix_shape(qt.shape)
    n = rows * cols
    spec = spec_for(scheme)
    if b == "numpy" or spec is None or n == 0:
        res = scheme.dequantize(qt)
        if out is not None:
            o = _out_array(out, qt.shape, n)
            o.reshape(res.shape)[...] = res
            return o
        if device_array and b == "cuda":
            from numba import cuda
            return cuda.to_device(np.ascontiguousarray(res))
        return res
    if b == "cuda":
        from kernels import cuda_ops
        dev = cuda_ops.dequantize(spec, qt.arrays, rows, cols)
        if device_array:
            return dev.reshape(qt.shape) if len(qt.shape) != 2 else dev
        o = _out_array(out, qt.shape, n)
        dev.copy_to_host(o.reshape(rows, cols))
        return o.reshape(qt.shape) if out is None else o
    o = _out_array(out, qt.shape, n)
    from kernels import cpu_ops
    cpu_ops.dequantize(spec, qt.arrays, o.reshape(rows, cols))
    return o.reshape(qt.shape) if out is None else o


def quantize(scheme, w: np.ndarray, backend: str = "auto", tensor: str | None = None):
    """Quantize `w` with `scheme` (object or name): identical to ``scheme.quantize(w)``."""
    from workbench.core.errors import WorkbenchError
    from workbench.schemes.base import QuantizedTensor, matrix_shape
    from workbench.schemes.base import Scheme
    scheme = _scheme(scheme)
    spec = spec_for(scheme)
    if (backend or "auto").lower() == "auto" and spec is not None \
            and spec.quant not in _CUDA_QUANT:
        b = "cpu"   # no CUDA quantize kernel: the CPU one, without probing for a GPU
    else:
        b = _backend.resolve(backend)
    w = np.asarray(w)
    shape = tuple(int(s) for s in w.shape)
    n = int(np.prod(shape)) if shape else 1
    if (b == "numpy" or spec is None or spec.quant is None or n == 0
            or (b == "cuda" and spec.quant not in _CUDA_QUANT)):
        return scheme.quantize(w, tensor=tensor)
    reason = scheme.ineligible_reason(shape)
    if reason:
        raise WorkbenchError(reason, tensor=tensor)
    w2 = np.ascontiguousarray(w, dtype=np.float32).reshape(matrix_shape(shape))
    # the range check needs finite weights; a scheme without one (GGML: its kernels test
    # for NaN/Inf themselves) skips that extra pass over the tensor
    if type(scheme).check_range is not Scheme.check_range and np.isfinite(w2).all():
        scheme.check_range(w2, tensor)
    from kernels import cpu_ops

    def refuse(bad):
        return WorkbenchError(f"cannot quantize with {scheme.name}: {bad} NaN/Inf weight(s)",
                              tensor=tensor)
    if b == "cuda":
        if not scheme.accepts_nonfinite:
            bad = cpu_ops.count_nonfinite(w2)
            if bad:
                raise refuse(bad)
        from kernels import cuda_ops
        arrays = cuda_ops.quantize(spec, w2, _choose_qparams(scheme, w2))
    else:
        try:
            arrays = cpu_ops.quantize(spec, w2, check_finite=not scheme.accepts_nonfinite,
                                      choose_qparams=_choose_qparams(scheme, w2))
        except cpu_ops.NonFinite as exc:      # counted inside the kernels' single pass
            raise refuse(exc.args[0]) from None
    if arrays is None:                      # the kernel declined: the reference decides
        return scheme.quantize(w, tensor=tensor)
    qt = QuantizedTensor(scheme.name, shape, arrays)
    if scheme.reference_needed(qt):         # a scale at the edge of its range (issue 9):
        return scheme.quantize(w, tensor=tensor)   # the reference refuses or handles it
    return qt


def quantize_widening(scheme, raw: np.ndarray, dtype: str):
    """``quantize(scheme, widened raw)`` for float16 / bfloat16 weights (`dtype` "F16" or
    "BF16"; `raw` their 2-D storage: float16, or uint16 bits), widened inside the kernel in the
    same pass, for the schemes whose kernel does that (Q4_0, Q8_0). None when there is no such
    kernel, or the weights need the float32 path's decisions (NaN/Inf, a float16 scale that
    overflows): the caller then widens and calls ``quantize``. The bytes are ``quantize``'s."""
    from workbench.schemes.base import QuantizedTensor, Scheme
    scheme = _scheme(scheme)
    spec = spec_for(scheme)
    raw = np.asarray(raw)
    if (spec is None or dtype not in ("F16", "BF16") or raw.ndim != 2 or raw.size == 0
            or raw.dtype.itemsize != 2 or type(scheme).check_range is not Scheme.check_range
            or scheme.ineligible_reason(raw.shape)):
        return None
    from kernels import cpu_ops
    arrays = cpu_ops.quantize_ggml_f16(spec, raw, dtype == "BF16")
    if arrays is None:
        return None
    qt = QuantizedTensor(scheme.name, tuple(int(s) for s in raw.shape), arrays)
    return None if scheme.reference_needed(qt) else qt


def dequant_error(w: np.ndarray, qt, backend: str = "auto"):
    """ErrorSums of `w` against the dequantized `qt`, in one pass, without writing the
    dequantized tensor (float64 sums; max_abs_err exact)."""
    from workbench.quant.metrics import ErrorSums
    from workbench.schemes.base import matrix_shape
    scheme = _scheme(qt.scheme)
    b = _backend.resolve(backend)
    rows, cols = matrix_shape(qt.shape)
    w2 = np.ascontiguousarray(w, dtype=np.float32).reshape(rows, cols)
    spec = spec_for(scheme)
    if b == "numpy" or spec is None or rows * cols == 0:
        return ErrorSums.from_arrays(w2, scheme.dequantize(qt).reshape(rows, cols))
    if b == "cuda":
        from kernels import cuda_ops
        acc = cuda_ops.error_sums(spec, qt.arrays, w2)
    else:
        from kernels import cpu_ops
        acc = cpu_ops.error_sums(spec, qt.arrays, w2)
    return _sums(acc, rows * cols)


def _sums(acc: np.ndarray, n: int):
    """ErrorSums from the kernels' (rows, 5) per-row sse, sig, deq, dot, max|err|."""
    from workbench.quant.metrics import ErrorSums
    return ErrorSums(n=n, sse=float(acc[:, 0].sum()), sig=float(acc[:, 1].sum()),
                     deq=float(acc[:, 2].sum()), dot=float(acc[:, 3].sum()),
                     max_abs_err=float(np.max(acc[:, 4])), ch_sse=acc[:, 0].copy(),
                     ch_sig=acc[:, 1].copy())


def quantize_error(scheme, w: np.ndarray, backend: str = "auto"):
    """(quantized bytes, ErrorSums) of `w` under `scheme` from one pass over `w` on the CPU
    (kernels.cpu_ops.quantize_error), without keeping the quantized tensor: the same figures
    as ``quantize`` followed by ``dequant_error``. None when that path does not apply (no such
    kernel for the scheme or shape, the CUDA or numpy backend, NaN/Inf weights, a scale at
    the edge of its range): the caller then takes those two steps."""
    from workbench.schemes.base import QuantizedTensor, Scheme, matrix_shape
    scheme = _scheme(scheme)
    spec = spec_for(scheme)
    if spec is None or spec.family != "affine" or spec.quant not in ("int", "ternary"):
        return None
    if _backend.resolve(backend) != "cpu":
        return None
    w = np.asarray(w)
    shape = tuple(int(s) for s in w.shape)
    if not shape or scheme.ineligible_reason(shape) \
            or type(scheme).check_range is not Scheme.check_range:
        return None
    rows, cols = matrix_shape(shape)
    w2 = np.ascontiguousarray(w, dtype=np.float32).reshape(rows, cols)
    from kernels import cpu_ops
    got = cpu_ops.quantize_error(spec, w2)
    if got is None:
        return None
    arrays, acc = got
    small = QuantizedTensor(scheme.name, shape, arrays)     # scales and zero points only
    if scheme.reference_needed(small) or any(
            a.dtype.kind == "f" and not np.isfinite(a).all() for a in arrays.values()):
        return None
    nbytes = small.nbytes + rows * cols * spec.bits // 8    # + the packed codes
    return nbytes, _sums(acc, rows * cols)


def warmup(schemes=None, backend: str = "auto") -> list[str]:
    """Compile (or load from the on-disk cache) the kernels that `schemes` need, by running
    each on a tiny tensor. Safe to call on a background thread. Returns the scheme names done."""
    from workbench.schemes import list_schemes
    b = _backend.resolve(backend)
    if b == "numpy":
        return []
    names = list(schemes) if schemes is not None else list_schemes()
    done, seen = [], set()
    rng = np.random.default_rng(0)
    for name in names:
        scheme = _scheme(name)
        spec = spec_for(scheme)
        if spec is None:
            continue
        # every GGML type has kernels of its own (all of them have spec.quant "ggml"); an
        # integer scheme's qparams kernel follows its symmetry and granularity, an MLX
        # scheme's quantize its mode (affine or a microscaling float)
        key = (spec.family, spec.quant, spec.ggml_name, getattr(scheme, "clip", None),
               spec.asym, spec.gran == "tensor", getattr(spec, "mlx_mode", None))
        cols = int(scheme.block_size or 1) * 2 if scheme.block_size else 64
        cols = max(cols, 256) if spec.family == "ggml" else cols
        shapes = [(2, cols)]
        if spec.quant == "int" and not scheme.ineligible_reason((2, 60)):
            shapes.append((2, 60))   # a width the one-pass kernel does not take (60 % 8)
        if key not in seen:
            for shape in shapes:
                w = rng.standard_normal(shape).astype(np.float32)
                # the kernels take every input read-only (kernels.host.readonly), so one
                # call each compiles what both a file's read-only maps and in-memory arrays
                # use
                qt = quantize(scheme, w, backend=b)
                dequantize(qt, backend=b)
                dequant_error(w, qt, backend=b)
                quantize_error(scheme, w, backend=b)  # the one-pass error (where it applies)
            seen.add(key)
        done.append(scheme.name if hasattr(scheme, "name") else str(name))
    return done

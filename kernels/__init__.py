"""numba kernels for Quant Workbench: dequantize / quantize / fused error over plain arrays.

The kernel layer knows storage layouts, not schemes: ``spec.make_spec(layout)`` turns the
plain-data layout a scheme declares into a :class:`spec.Spec`, and ``cpu_ops`` / ``cuda_ops``
run the kernels on a spec and numpy arrays. The scheme-facing entry points are in
``workbench.accel`` (quantize, dequantize, dequant_error, has_kernel, warmup); this package
imports nothing from ``workbench`` and never imports Qt.

Backends: "auto" (CUDA when numba.cuda.is_available(), else CPU), "cpu", "cuda", "numpy".
Importing this package is cheap and never fails without a GPU: numba is imported, and the
kernels compiled (or loaded from the on-disk cache), on first use.
"""

from .backend import BACKENDS, backend_name, cuda_available, device_name

__all__ = ["BACKENDS", "backend_name", "cuda_available", "device_name"]

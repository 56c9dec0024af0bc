"""numba kernels for Quant Workbench: dequantize / quantize / fused error for every scheme.

    from kernels import dequantize, quantize, dequant_error, backend_name
    qt = quantize("int4-g128", w)              # == get_scheme("int4-g128").quantize(w)
    w2 = dequantize(qt)                        # float32, bit-identical to the numpy reference
    sums = dequant_error(w, qt)                # workbench.metrics.ErrorSums, one pass

Backends: "auto" (CUDA when numba.cuda.is_available(), else CPU), "cpu", "cuda", "numpy".
Importing this package is cheap and never fails without a GPU: numba is imported, and the
kernels compiled (or loaded from the on-disk cache), on first use. Never imports Qt.
"""

from .api import dequant_error, dequantize, has_kernel, quantize, warmup
from .backend import BACKENDS, backend_name, cuda_available, device_name

__all__ = ["BACKENDS", "backend_name", "cuda_available", "dequant_error", "dequantize",
           "device_name", "has_kernel", "quantize", "warmup"]

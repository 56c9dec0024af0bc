"""The scheme registry: ``get_scheme(name)``, ``list_schemes()``.

>>> from workbench.schemes import get_scheme
>>> s = get_scheme("int4-g128"); qt = s.quantize(w); w2 = s.dequantize(qt); qt.nbytes
"""

from workbench.schemes.base import QuantizedTensor, Scheme, get_scheme, list_schemes, matrix_shape

__all__ = ["QuantizedTensor", "Scheme", "get_scheme", "list_schemes", "matrix_shape"]

"""Calibration-aware quantization methods, registered like schemes: ``get_method(name)``.

A method turns a weight matrix W [out, in] (float32), a scheme (``workbench.schemes``) and
calibration statistics of the layer's inputs (:class:`~workbench.quant.methods.stats.LayerStats`)
into the same :class:`~workbench.schemes.QuantizedTensor` the scheme's own ``quantize``
returns — same byte format, so every exporter writes it unchanged.

| name    | statistics used                         | schemes                                   |
|---------|-----------------------------------------|-------------------------------------------|
| rtn     | none (the scheme's own quantize)        | every scheme                              |
| imatrix | d_j = E[x_j^2] (or a llama.cpp imatrix) | integer schemes, GGML types (weighted)    |
| gptq    | H = 2 X X^T / N                         | integer schemes, GGML types, codebooks    |
| awq     | mean|x_j| and a sample of inputs X      | integer schemes, GGML types (see awq.py)  |

>>> from workbench.quant.methods import get_method
>>> qt = get_method("gptq").quantize(w, get_scheme("int4-g128"), stats)
"""

from __future__ import annotations

from workbench.quant.methods.base import Method, get_method, list_methods, quantize_with_method
from workbench.quant.methods.stats import LayerStats

__all__ = ["LayerStats", "Method", "get_method", "list_methods", "quantize_with_method"]

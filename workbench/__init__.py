"""Quant Workbench domain layer: loading, statistics, schemes, metrics, plans, export.

Pure Python + numpy/torch/safetensors/gguf. Never imports Qt.
"""

__version__ = "0.1.0"

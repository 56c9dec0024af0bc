"""Apple MLX's quantization modes (mlx.core.quantize) as schemes: importing this package
registers them (``mlx-q4-g64``, ``mlx-mxfp4``, ...; see schemes.py)."""

from workbench.schemes.mlx.schemes import MLXScheme  # noqa: F401  (registers the family)

__all__ = ["MLXScheme"]

"""`--budget-of` an mlx-lm folder: its safetensors bytes (the sum of its .safetensors files'
sizes) as a file budget for the mlx target. The solve is workbench.planning.budget.solve's
for a file budget of format "mlx": the plan's MLX safetensors predicted to the byte
(workbench.export.mlx_layout), tightened until it fits.
"""

from __future__ import annotations

from pathlib import Path

from workbench.core.errors import WorkbenchError


def folder_files(folder) -> list[Path]:
    """The .safetensors files of an mlx-lm folder (config.json with mlx's quantization) that
    its model is read from."""
    from workbench.formats.loaders import weight_files
    from workbench.formats.loaders.mlx_format import mlx_quantization
    p = Path(folder)
    if mlx_quantization(p) is None:
        raise WorkbenchError("--budget-of: a folder is an mlx-lm folder's budget, but its "
                             "config.json has no mlx \"quantization\" object", path=str(p))
    try:
        files = weight_files(p)      # the index's shards (checked), else the folder's files
    except WorkbenchError as exc:
        raise WorkbenchError(f"--budget-of: {exc.problem}", path=exc.path or str(p)) from None
    if not files:
        raise WorkbenchError("--budget-of: an mlx-lm folder with no .safetensors files",
                             path=str(p))
    return files


def folder_bytes(folder) -> int:
    """The sum of the folder's .safetensors files' sizes (the folder opened by the mlx loader
    first: a damaged folder is refused, naming it)."""
    from workbench.planning.budget import _readable
    files = folder_files(folder)
    _readable(Path(folder), "an mlx-lm")
    return sum(f.stat().st_size for f in files)

"""The config.json beside a checkpoint (a folder, or a file in one), for the loaders that pick a
reading by what it declares (block_fp_sources.source_kind, mlx_format.mlx_quantization)."""

from __future__ import annotations

from pathlib import Path


def folder_config(path) -> tuple[Path, object] | None:
    """(config.json's path, its parsed JSON) of the folder `path` is or is in; None without
    one. Read through workbench.core.limits (size and nesting limits: a one-line error)."""
    p = Path(path)
    cfg = (p if p.is_dir() else p.parent) / "config.json"
    if not cfg.is_file():
        return None
    from workbench.core.limits import load_sidecar_json
    return cfg, load_sidecar_json(cfg, "config.json")

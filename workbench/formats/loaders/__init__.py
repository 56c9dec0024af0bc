"""`open_model(path)`: open any supported checkpoint lazily (headers only)."""

from __future__ import annotations

import os
from pathlib import Path

from workbench.core.errors import WorkbenchError
from workbench.formats.model import Model

SAFETENSORS_MAGIC_HINT = b"{"
TORCH_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")


def detect_format(path: Path) -> str:
    if path.is_dir():
        if list(path.glob("*.safetensors")) or list(path.glob("*.safetensors.index.json")):
            return "safetensors"
        if list(path.glob("*.gguf")):
            return "gguf"
        bins = [p for p in path.iterdir() if p.suffix in TORCH_SUFFIXES]
        if bins or list(path.glob("*.bin.index.json")) or list(path.glob("*.pt.index.json")):
            return "pytorch"
        raise WorkbenchError("folder has no model files (.safetensors, .gguf, .bin, .pt)",
                             path=str(path))
    name = path.name.lower()
    if name.endswith((".bin.index.json", ".pt.index.json")):
        return "pytorch"
    if name.endswith(".safetensors") or name.endswith(".safetensors.index.json"):
        return "safetensors"
    if name.endswith(".gguf"):
        return "gguf"
    if name.endswith(TORCH_SUFFIXES):
        return "pytorch"
    # sniff the content
    try:
        with open(path, "rb") as fh:
            head = fh.read(16)
    except OSError as exc:
        raise WorkbenchError(f"cannot read ({exc.strerror})", path=str(path)) from None
    if head[:4] == b"GGUF":
        return "gguf"
    if head[:2] == b"PK" or head[:1] == b"\x80":
        return "pytorch"
    if len(head) >= 9 and head[8:9] == SAFETENSORS_MAGIC_HINT:
        return "safetensors"
    raise WorkbenchError("unrecognised model file (expected safetensors, GGUF or PyTorch)",
                         path=str(path))


def open_model(path: str | os.PathLike) -> Model:
    """Open a checkpoint by path. Reads headers only; data is read on demand (loaders.region)."""
    p = Path(path).expanduser()
    try:
        p.stat()
    except FileNotFoundError:
        raise WorkbenchError("file not found", path=str(p)) from None
    except (OSError, ValueError) as exc:     # a name too long, a loop of links, a NUL
        raise WorkbenchError(f"cannot open it ({getattr(exc, 'strerror', None) or exc})",
                             path=str(p)) from None
    if not p.is_dir():
        from workbench.core.limits import check_regular_file
        check_regular_file(p)
    fmt = detect_format(p)
    if fmt == "safetensors":
        from workbench.formats.loaders import mlx_format
        from workbench.formats.loaders.safetensors_format import open_safetensors
        mlx = mlx_format.mlx_quantization(p)   # an mlx-lm folder: dequantized as mlx does
        if mlx is not None:
            return mlx_format.open_mlx(open_safetensors(p), *mlx)
        from workbench.formats.loaders.block_fp_sources import source_kind
        kind = source_kind(p)           # a quantized checkpoint: opened dequantized, exactly
        if kind == "compressed-tensors":
            from workbench.formats.loaders.compressed_tensors_format import open_compressed_tensors
            return open_compressed_tensors(p)
        if kind == "fp8-block":
            from workbench.formats.loaders.block_fp_sources import open_fp8_block
            return open_fp8_block(p)
        if kind == "mxfp4-blocks":
            from workbench.formats.loaders.block_fp_sources import open_mxfp4_blocks
            return open_mxfp4_blocks(p)
        model = open_safetensors(p)
        packed = mlx_format.quantized_without_config(model)
        if packed is not None:
            raise WorkbenchError("stored as mlx-lm quantizes (uint32 beside .scales), but there "
                                 "is no config.json with its \"quantization\" object beside "
                                 "it: open the mlx-lm folder", path=str(p), tensor=packed)
        return model
    if fmt == "gguf":
        from workbench.formats.loaders.gguf_format import open_gguf
        found = [p] if p.is_file() else sorted(p.glob("*.gguf"))
        if len(found) > 1:      # which one is meant is the user's choice, never the first
            names = ", ".join(q.name for q in found[:6]) + (", ..." if len(found) > 6 else "")
            raise WorkbenchError(f"folder holds {len(found)} GGUF files ({names}): open one "
                                 "of them by its path", path=str(p))
        return open_gguf(found[0])
    from workbench.formats.loaders.torch_format import open_torch, open_torch_shards
    if p.is_dir():
        index = sorted(p.glob("*.bin.index.json")) + sorted(p.glob("*.pt.index.json"))
        if index:
            return open_torch_shards(index[0])
        files = sorted(q for q in p.iterdir() if q.suffix in TORCH_SUFFIXES)
        if len(files) > 1:
            raise WorkbenchError(f"folder has {len(files)} PyTorch files and no index JSON; "
                                 "open one file, or add pytorch_model.bin.index.json",
                                 path=str(p))
        p = files[0]
    elif p.name.endswith(".index.json"):
        return open_torch_shards(p)
    return open_torch(p)


def weight_files(folder) -> list[Path]:
    """The .safetensors files a folder's model is read from, as the loader reads them: those
    its model.safetensors.index.json lists (inside the folder; a subfolder's included), else the
    folder's own; a stray file the index does not list is not part of it. What --budget-of an
    mlx-lm folder counts."""
    from workbench.formats.loaders.safetensors_format import _shard_files
    return _shard_files(Path(folder))

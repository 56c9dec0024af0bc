"""A small llama GGUF with quantized tensors and no config.json beside it (what a published
GGUF is): exported from the tiny generated llama (tests/tiny_archs.py) by this workbench."""

from __future__ import annotations

from pathlib import Path


def write_llama_gguf(tiny_folder, out_dir, scheme: str = "q4_0") -> Path:
    """The tiny llama in `tiny_folder` as a `scheme` GGUF in a folder of its own under
    `out_dir` (returns its path)."""
    from workbench.export import export
    from workbench.formats.loaders import open_model
    from workbench.quant.plan import Plan
    from workbench.core.progress import run
    out_dir = Path(out_dir)
    f32 = out_dir / "f32" / "tiny-f32.gguf"
    f32.parent.mkdir(parents=True, exist_ok=True)
    run(export(open_model(str(tiny_folder)), Plan(default="fp32"), "gguf", f32))
    q = out_dir / "gguf" / f"tiny-{scheme}.gguf"
    q.parent.mkdir(parents=True, exist_ok=True)
    run(export(open_model(str(f32)), Plan(default=scheme), "gguf", q))
    return q

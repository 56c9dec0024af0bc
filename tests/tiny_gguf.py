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


def write_weights_only_gguf(path) -> Path:
    """A llama GGUF of one float matrix and nothing else (no tokenizer, no hyper-parameters):
    its weights are read as they are; it cannot be built into a model that runs."""
    import gguf
    import numpy as np
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("blk.0.ffn_up.weight", np.random.default_rng(0).standard_normal(
        (8, 64)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)

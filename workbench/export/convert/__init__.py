"""`convert`: a (quantized) GGUF as a float model: a Hugging Face folder or an F16/BF16 GGUF;
an mlx-lm folder (any mode, mixed) as a float Hugging Face folder.

    job = convert("model.Q4_1.gguf", "hf", "out-folder", dtype="bf16", off_grid_seed=0)
    info = progress.run(job)

* ``to="hf"``: workbench.export.convert.hf (config and tokenizer from transformers' GGUF support,
  weights from the project's dequantizer, one tensor at a time).
* ``to="gguf"``: the project's GGUF exporter on a float32 view of the source: every
  key/value (tokenizer included) copied, 2-D tensors in F16/BF16 (or F32), 1-D ones in F32 as
  llama.cpp's converter writes them.
* an mlx-lm folder (``to="hf"`` only): workbench.export.convert.mlx_hf (the loader's exact
  dequantization; ``dtype`` None: the folder's own float dtype).
* ``off_grid_seed`` (None: off): the exact reparametrisation of workbench.export.convert.off_grid.

The result dict names the tensors still on the source's quantization grid
(``on_source_grid``). Outputs are never replaced: an existing file, or a non-empty folder, is
refused before anything is read. Docs: docs/real-models.md.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from workbench.core.errors import WorkbenchError
from workbench.core.progress import Progress

TARGETS = ("hf", "gguf")
DTYPES = ("bf16", "f16", "f32")
DEFAULT_DTYPE = "bf16"
SCHEME_OF = {"f32": "fp32", "f16": "fp16", "bf16": "bf16"}


def check_output(to: str, out: Path, src=None) -> None:
    """convert never replaces anything: a new file (--to gguf), a new or empty folder (--to
    hf), never the source (workbench.core.outputs.check_output)."""
    from workbench.core.outputs import check_output as check
    check(out, kind="folder" if to == "hf" else "file", replace_file=False, overwrite=None,
          inputs={"the source": os.fspath(src)} if isinstance(src, (str, os.PathLike)) else None)


def open_source(src):
    from workbench.formats.loaders import open_model
    model = open_model(src)
    if model.format != "gguf" or model.source is None:
        raise WorkbenchError("convert reads a GGUF file or an mlx-lm folder (this is a "
                             f"{model.format} checkpoint)", path=str(src))
    try:
        check_vocabulary(model)
    except WorkbenchError:
        model.close()
        raise
    return model


def check_vocabulary(model) -> None:
    """A GGUF whose tokenizer lists more tokens than its embedding has rows is refused before
    any tokenizer is built (the ids past the rows have no embedding: the network would fail on
    them, or read another tensor's memory in llama.cpp)."""
    fields = getattr(model.source, "fields", None) or {}
    f = fields.get("tokenizer.ggml.tokens")
    emb = model.tensors.get("token_embd.weight")
    if f is None or emb is None or not isinstance(f.value, list):
        return
    n, rows = len(f.value), int(emb.shape[0])
    if n > rows:
        raise WorkbenchError(f"tokenizer.ggml.tokens lists {n:,} tokens, but token_embd.weight "
                             f"has {rows:,} rows: ids {rows:,} and above have no embedding; "
                             "nothing was converted", path=model.path)


def convert(src, to: str, output, dtype: str | None = DEFAULT_DTYPE,
            off_grid_seed: int | None = None):
    """Job: convert the GGUF or mlx-lm folder `src` into `output` (see the module doc; `dtype`
    None: bf16 for a GGUF). Returns a dict:
    source, output, to, dtype, tensors, bytes, seconds, off_grid (or None), on_source_grid,
    unused (always empty: a tensor with no place is refused), in_config (tensors the config
    carries: rope_freqs as llama3 rope_parameters)."""
    from workbench.export.convert.off_grid import off_grid, on_source_grid
    from workbench.export.convert.source import FloatView
    if to not in TARGETS:
        raise WorkbenchError(f"to={to!r}: choose hf or gguf", params=("to",))
    if dtype is not None and dtype not in DTYPES:
        raise WorkbenchError(f"dtype={dtype!r}: choose one of {', '.join(DTYPES)}",
                             params=("dtype",))
    out = Path(output)
    if _is_mlx(src):
        return (yield from convert_mlx(src, to, out, dtype, off_grid_seed))
    dtype = dtype or DEFAULT_DTYPE
    check_output(to, out, src)
    t0 = time.monotonic()
    model = open_source(src)
    og = None
    if off_grid_seed is not None:
        yield Progress(0, 1, "reading the norms (off-grid)")
        og = off_grid(model, off_grid_seed)
    view = FloatView(model, og.changes if og is not None else None)
    if to == "hf":
        from workbench.export.convert.hf import write_hf
        info = yield from write_hf(view, out, dtype)
    else:
        info = yield from write_gguf(view, out, dtype)
    return {"source": str(src), "output": str(out), "to": to, "dtype": dtype,
            "tensors": info["tensors"], "bytes": info["bytes"],
            "seconds": round(time.monotonic() - t0, 2),
            "off_grid": og.to_dict() if og is not None else None,
            "on_source_grid": {n: model.info(n).dtype
                               for n in on_source_grid(model, view.changes)},
            "unused": info.get("unused", []), "in_config": info.get("in_config", {})}


def _is_mlx(src) -> bool:
    from workbench.formats.loaders.mlx_format import mlx_quantization
    p = Path(src)
    return (p.is_dir() or p.suffix == ".safetensors") and mlx_quantization(p) is not None


def convert_mlx(src, to: str, out: Path, dtype: str | None, off_grid_seed: int | None):
    """Job: the mlx-lm folder `src` as a float Hugging Face folder (convert's dict)."""
    from workbench.export.convert.mlx_hf import write_mlx_hf
    from workbench.formats.loaders import open_model
    if to != "hf":
        raise WorkbenchError("an mlx-lm folder converts to a Hugging Face folder (to 'hf'), "
                             f"not {to!r}", path=str(src))
    if off_grid_seed is not None:
        raise WorkbenchError("off_grid takes a GGUF off its grid: an mlx-lm folder is "
                             "converted as it is", path=str(src))
    check_output(to, out, src)
    t0 = time.monotonic()
    model = open_model(src)
    try:
        info = yield from write_mlx_hf(model, out, dtype)
    finally:
        model.close()
    return {"source": str(src), "output": str(out), "to": to, "dtype": info["dtype"],
            "tensors": info["tensors"], "bytes": info["bytes"],
            "seconds": round(time.monotonic() - t0, 2), "off_grid": None,
            "on_source_grid": {}, "unused": [], "in_config": {},
            "quantization": model.metadata.get("mlx.quantization")}


def write_gguf(view, out: Path, dtype: str):
    """Job: the view's model as a GGUF through the project's exporter (metadata copied)."""
    from workbench.export.gguf_file import export_gguf
    from workbench.quant.plan import KEEP, Plan, Rule
    from workbench.quant.runtimes import plan_decisions
    model = view.as_model()
    scheme = SCHEME_OF[dtype]
    # every tensor named: norms and biases F32 (llama.cpp's converter writes them so), the
    # rest in the chosen dtype; nothing is copied from the source's bytes
    plan = Plan(default=scheme, rules=[Rule(n, "fp32" if i.ndim < 2 else scheme)
                                       for n, i in model.tensors.items()])
    kept = [n for n, d in plan_decisions(model, plan, "llama.cpp").items() if d.applied == KEEP]
    if kept:
        raise WorkbenchError(f"{kept[0]} would be copied unconverted ({len(kept)} such "
                             "tensors): not written", path=model.path)
    job = export_gguf(model, plan, out)
    n = len(model.tensors)
    i = 0
    try:
        while True:
            try:
                ev = next(job)
            except StopIteration as stop:
                res = stop.value
                break
            if ev.message.startswith("writing "):
                i += 1
                yield Progress(ev.done, ev.total, f"tensor {i}/{n} {ev.message[8:]}")
            else:
                yield ev
    finally:
        job.close()     # a cancelled run: the exporter removes its temporary file
    return {"tensors": res["tensors"], "bytes": os.path.getsize(out), "unused": [],
            "file_type": res.get("file_type")}

"""A GGUF as a float Hugging Face folder: config.json, tokenizer files, model.safetensors.

* config.json and the tokenizer come from transformers' own GGUF support
  (``AutoConfig`` / ``AutoTokenizer.from_pretrained(folder, gguf_file=name)``: the metadata
  only, no tensors), saved without a ``quantization_config``, with ``architectures`` (the
  model type's causal-LM class) and ``dtype`` set.
* The weights come from the project's GGUF loader and dequantizer through a
  :class:`~workbench.export.convert.source.FloatView`, one tensor at a time (the largest in row
  chunks), never a second copy of the model. Their names, and the undoing of
  convert_hf_to_gguf's q/k row permutation on Llama GGUFs, are the runner's
  (``workbench.running.runner.Runner``: the gguf package's name map for the file's architecture),
  through :class:`~workbench.export.convert.live.HFNames`, which model-level commands also read a
  GGUF through on the fly;
  Gemma's norms, which convert_hf_to_gguf stores as 1 + w (ArchSpec.norm_plus_one in
  workbench.export.gguf_arch), get the 1 taken off again.
* Written into a temporary folder beside the target, renamed into place when whole.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from workbench.core.atomic import TEMP_TAG, clean_stale_temps, default_file_mode
from workbench.core.errors import WorkbenchError
from workbench.core.progress import Progress
from workbench.export.convert.source import CHUNK_ELEMENTS

STREAM_ABOVE = 1 << 24      # tensors of more elements are written in row chunks
ST_DTYPES = {"f32": "F32", "bf16": "BF16", "f16": "F16"}
ITEMSIZE = {"f32": 4, "bf16": 2, "f16": 2}
TORCH_NAMES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}


def waiting(fn, message: str, every: float = 2.0):
    """Run fn() on a thread, yielding a progress event every `every` seconds until it is
    done (transformers' GGUF metadata reader holds a large vocabulary for tens of seconds)."""
    box: dict = {}

    def work():
        try:
            box["value"] = fn()
        except BaseException as exc:   # noqa: BLE001 - re-raised on the job's thread
            box["error"] = exc

    th = threading.Thread(target=work, daemon=True)
    t0 = time.monotonic()
    th.start()
    yield Progress(0, 1, message)
    while th.is_alive():
        th.join(every)
        yield Progress(0, 1, f"{message} ({time.monotonic() - t0:.0f} s)")
    if "error" in box:
        raise box["error"]
    return box["value"]


def read_config_and_tokenizer(gguf_path: str, arch: str = "", header=None):
    """(config dict, tokenizer) of a GGUF (of llama.cpp architecture `arch`; `header`: the
    loader's parse of it, reused) from transformers' GGUF support."""
    from workbench.core.optional import require
    from workbench.export.convert.gguf_meta import parse_once
    transformers = require("transformers", "model")
    p = Path(gguf_path)
    logger = transformers.logging
    level = logger.get_verbosity()
    logger.set_verbosity_error()
    try:
        with parse_once(p, arch, header):
            cfg, tok = _config_and_tokenizer(transformers, p)
    finally:
        logger.set_verbosity(level)
    return _clean_config(cfg), tok


def _config_and_tokenizer(transformers, p: Path):
    try:
        cfg = transformers.AutoConfig.from_pretrained(str(p.parent), gguf_file=p.name,
                                                      local_files_only=True)
    except WorkbenchError:
        raise
    except Exception as exc:   # noqa: BLE001 - transformers raises many kinds
        raise WorkbenchError(f"transformers {transformers.__version__} cannot read a config "
                             f"from this GGUF ({type(exc).__name__}: {_first(exc)})",
                             path=str(p)) from None
    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name,
                                                         local_files_only=True)
    except Exception as exc:   # noqa: BLE001
        raise WorkbenchError(f"transformers {transformers.__version__} cannot read the "
                             f"tokenizer of this GGUF ({type(exc).__name__}: {_first(exc)})",
                             path=str(p)) from None
    return cfg, tok


def _header(model):
    """The loader's GGUFFile of a GGUF model (its header already parsed), else None."""
    from workbench.formats.loaders.gguf_reader import GGUFFile
    return model.source if isinstance(model.source, GGUFFile) else None


def _first(exc) -> str:
    s = str(exc)
    return s.splitlines()[0][:200] if s else ""


def _clean_config(cfg) -> dict:
    from transformers.models.auto import modeling_auto as ma
    d = json.loads(cfg.to_json_string(use_diff=False))
    for k in ("_model_name_or_path", "_name_or_path", "quantization_config"):
        d.pop(k, None)
    arch = ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(d.get("model_type"))
    if arch:
        d["architectures"] = [arch]
    return d


def legacy_rope(cfg: dict) -> None:
    """Beside transformers 5's ``rope_parameters``, the rope keys older readers take from
    config.json (mlx-lm's model classes: without them SmolLM2 runs at mlx-lm's default
    rope_theta 10,000 instead of its 100,000): ``rope_theta`` and Gemma 3's
    ``rope_local_base_freq`` (its sliding layers' theta). Keys already there are kept (a
    scaled rope type stays in rope_parameters only)."""
    rp = cfg.get("rope_parameters")
    if not isinstance(rp, dict):
        return
    full, local = rp, None
    if isinstance(rp.get("full_attention"), dict):
        full, local = rp["full_attention"], rp.get("sliding_attention")
    if "rope_theta" in full:
        cfg.setdefault("rope_theta", full["rope_theta"])
    if isinstance(local, dict) and "rope_theta" in local:
        cfg.setdefault("rope_local_base_freq", local["rope_theta"])


def llama_cpp_semantics(cfg: dict, arch: str, metadata: dict | None = None) -> None:
    """Set what a GGUF leaves to llama.cpp's code where transformers' GGUF config guesses
    otherwise. The head size: llama.cpp reads `ARCH.attention.key_length` where the GGUF has
    one (transformers' Qwen3 config leaves head_dim at its default 128). Gemma 3: llama.cpp
    scales queries by 1/sqrt(head_dim) (1/sqrt(hidden / heads) for the 62-layer 27B:
    src/models/gemma3.cpp), transformers by 1/sqrt(query_pre_attn_scalar), which its GGUF
    config leaves at the default 256."""
    kl = (metadata or {}).get(f"{arch}.attention.key_length")
    if isinstance(kl, int) and kl > 0 and "head_dim" in cfg and \
            (metadata or {}).get(f"{arch}.attention.value_length", kl) == kl:
        cfg["head_dim"] = kl
    if arch == "gemma3" and cfg.get("head_dim"):
        if cfg.get("num_hidden_layers") == 62:
            cfg["query_pre_attn_scalar"] = cfg["hidden_size"] // cfg["num_attention_heads"]
        else:
            cfg["query_pre_attn_scalar"] = cfg["head_dim"]


def make_temp_dir(target: Path) -> Path:
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise WorkbenchError("output folder's parent does not exist", path=str(target))
    clean_stale_temps(parent)
    try:
        return Path(tempfile.mkdtemp(prefix=f".{target.name}.{TEMP_TAG}-{os.getpid()}-",
                                     suffix=".tmp", dir=parent))
    except OSError as exc:
        raise WorkbenchError(f"cannot write here ({exc.strerror or exc})", path=str(target)) \
            from None


def cast(w: np.ndarray, dtype: str, name: str) -> np.ndarray:
    """float32 values as the stored dtype's array (bfloat16 as its uint16 bits)."""
    if dtype == "f32":
        return np.ascontiguousarray(w, np.float32)
    if dtype == "bf16":
        from workbench.core.floatbits import f32_to_bf16
        return f32_to_bf16(w)
    with np.errstate(over="ignore"):
        h = np.asarray(w, np.float32).astype(np.float16)
    if not np.isfinite(h).all() and np.isfinite(w).all():
        raise WorkbenchError("values beyond float16's range (65504): use dtype=bf16 or f32",
                             tensor=name, params=("dtype",))
    return h


def user_paths(exc: WorkbenchError, folder: str, whole: str, inside) -> WorkbenchError:
    """`exc` with a path in `folder` (a temporary folder the user never saw) named `whole`
    (the folder itself) or inside(its relative path) (a file in it)."""
    path = exc.path or ""
    if path != folder and not path.startswith(folder + os.sep):
        return exc
    what = os.path.relpath(path, folder)
    new = WorkbenchError(exc.problem, path=whole if what == "." else inside(what),
                         tensor=exc.tensor, params=getattr(exc, "params", ()))
    new.__cause__ = exc.__cause__
    return new


def raise_write_failure(exc: BaseException, out: Path):
    """Re-raise `exc`: an OSError as the one-line "write failed" naming the output."""
    if isinstance(exc, OSError):
        why = "disk full" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
        raise WorkbenchError(f"write failed ({why}); nothing was written",
                             path=str(out)) from None
    raise exc


def _discard(fh, tmp: Path) -> None:
    if fh is not None:
        with contextlib.suppress(OSError):
            fh.close()
    with contextlib.suppress(OSError):
        shutil.rmtree(tmp)


def write_hf(view, out: Path, dtype: str = "bf16"):
    """Job: write the FloatView's model as a Hugging Face folder at `out` (absent or empty).
    Returns {"tensors", "bytes", "unused", "architectures"}."""
    from workbench.export.convert.carry import carry
    from workbench.export.convert.live import HFNames
    model = view.model
    arch = str(model.metadata.get("general.architecture", ""))
    tmp = make_temp_dir(out)
    fh = None
    try:
        cfg, tok = yield from waiting(lambda: read_config_and_tokenizer(model.path, arch, _header(model)),
                                      "reading the config and tokenizer (transformers)")
        cfg["dtype"] = TORCH_NAMES[dtype]
        llama_cpp_semantics(cfg, arch, model.metadata)
        legacy_rope(cfg)
        view.in_config = carry(cfg, view)
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        tok.save_pretrained(str(tmp))
        names = HFNames(view, tmp)     # reads tmp/config.json
        params, unused, shapes = names.params, names.unused, names.shapes
        st, item = ST_DTYPES[dtype], ITEMSIZE[dtype]
        # the header first (every shape and dtype is known), then each tensor's bytes in
        # order: one pass over the data (the temporary folder makes the whole write atomic)
        header, off = {"__metadata__": {"format": "pt"}}, 0
        for p in params:
            n = math.prod(shapes[p]) * item
            header[p] = {"dtype": st, "shape": list(shapes[p]), "data_offsets": [off, off + n]}
            off += n
        blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
        blob += b" " * (-len(blob) % 8)
        fh = open(tmp / "model.safetensors", "wb")
        fh.write(len(blob).to_bytes(8, "little") + blob)
        for i, p in enumerate(params):
            yield Progress(i, len(params), f"tensor {i + 1}/{len(params)} {p}")
            shape = shapes[p]
            if names.streamable(p) and math.prod(shape) > STREAM_ABOVE:
                parts = (cast(c, dtype, p) for _r0, c in names.iter_rows(p, CHUNK_ELEMENTS))
            else:
                parts = [cast(names.read(p), dtype, p)]
            n = 0
            for a in parts:
                fh.write(memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8)))
                n += a.nbytes
            if n != header[p]["data_offsets"][1] - header[p]["data_offsets"][0]:
                raise WorkbenchError(f"internal error: {n} bytes for {p} of shape {shape}",
                                     path=model.path)
        yield Progress(len(params), len(params), "finishing model.safetensors")
        fh.flush()
        os.fsync(fh.fileno())
        fh.close()
        fh = None
        size = sum(f.stat().st_size for f in tmp.iterdir() if f.is_file())
        os.chmod(tmp, 0o777 & ~(0o666 & ~default_file_mode()))   # mkdtemp makes 0700
        try:
            os.replace(tmp, out)     # onto an absent or empty folder
        except OSError as exc:
            raise WorkbenchError(f"cannot move the finished folder into place "
                                 f"({exc.strerror or exc}); nothing was written", path=str(out)) \
                from None
    except WorkbenchError as exc:
        _discard(fh, tmp)
        # the temporary folder is gone: the message names the user's output (and the GGUF)
        raise user_paths(exc, str(tmp), f"{model.path} (converting to {out})",
                         lambda what: f"{out / what} (built from the metadata of "
                                      f"{model.path})") from None
    except BaseException as exc:
        _discard(fh, tmp)
        raise_write_failure(exc, out)
    return {"tensors": len(params), "bytes": size, "unused": unused,
            "in_config": names.in_config, "architectures": cfg.get("architectures")}

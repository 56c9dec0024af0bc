"""A GGUF read as the float Hugging Face model `convert --to hf` would write, with no copy.

Model-level commands (check, calibrate, sensitivity, allocate, frontier, export, evaluate,
bench-onnx) open a GGUF that has no ``config.json`` beside it through :func:`open_live`
when its architecture is one of :data:`LIVE_ARCHES`:

* ``config.json`` and the tokenizer files come from transformers' GGUF support, as in
  ``convert`` (workbench.export.convert.hf: the header parsed once, llama.cpp's query scaling for
  Gemma 3), written into a private temporary folder (``quant-workbench-gguf-hf-PID-*`` in the
  system's temporary directory) that the model names as its companion folder
  (``Model.folder``) and that is removed when the model is closed, collected or the process
  exits (one left by a killed process is removed by the next open);
* the tensors carry the Hugging Face names of transformers' network (the safetensors keys
  ``convert --to hf`` writes) and are float32: each is dequantized from the GGUF when it is
  read, row chunk by row chunk where nothing has to be undone (the embeddings), else whole
  (q/k rows un-permuted, Gemma's norms with the 1 of ``1 + w`` taken off). Nothing is held
  between reads: no second copy of the weights, in memory or on disk.

The values are those of ``convert --to hf --dtype f32`` exactly. Docs: docs/real-models.md.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import tempfile
import weakref
from pathlib import Path

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.formats.model import Model, TensorInfo
from workbench.core.progress import Progress
from workbench.formats.gguf_runnable import gguf_metadata, live_problem, unsupported_message
from workbench.export.convert.source import LazyRows


FORMAT = "gguf-as-hf"
TEMP_PREFIX = "quant-workbench-gguf-hf-"
_STALE = re.compile(re.escape(TEMP_PREFIX) + r"(\d+)-")
_COMPANIONS: dict[str, str] = {}     # companion folder -> the GGUF (error messages)


def wants_live(path) -> bool:
    """Whether a model-level command reads `path` through open_live: a GGUF file with no
    config.json beside it (a GGUF with one runs as before: llama.cpp names, mapped by the
    runner) that live_problem accepts. Any other GGUF is opened as it is (its own tensors:
    weight-level work goes on; running it is refused, saying why)."""
    p = Path(path).expanduser()
    if not p.is_file() or (p.parent / "config.json").exists():
        return False
    md = gguf_metadata(p)
    return md is not None and live_problem(md) is None


class HFNames:
    """The GGUF tensors of a FloatView under the parameter names of transformers' network
    (built from the config.json in `folder`): which GGUF tensor(s) fill each parameter, with
    the runner's mapping (the gguf package's name map for the file's architecture, q/k rows
    un-permuted on Llama GGUFs) and Gemma's norms stored as 1 + w taken back to w."""

    def __init__(self, view, folder: Path):
        from workbench.export.gguf_arch import ARCH_SPECS
        from workbench.running.runner import Runner
        model = view.model
        self.view = view
        arch = str(model.metadata.get("general.architecture", ""))
        spec = ARCH_SPECS.get(arch.upper())
        self.plus_one = bool(spec is not None and spec.norm_plus_one)
        runner = self.runner = Runner(view.as_model(folder), "cpu")   # reads folder/config.json
        params = []
        for p in runner._meta:   # noqa: SLF001 - the network's parameters, tied copies included
            if p in runner.by_param:
                params.append(p)
            elif not runner._is_tied_copy(p):   # noqa: SLF001
                raise WorkbenchError(f"the GGUF has no tensor for the network's {p}",
                                     path=model.path)
        used = set(runner.slots) | set(runner.buffer_for)
        # every tensor is carried: into a parameter, a buffer or (carry.carry) the config
        self.in_config = dict(getattr(view, "in_config", {}))
        self.unused = [n for n in model.tensors if n not in used and n not in self.in_config]
        if self.unused:
            raise WorkbenchError(f"{len(self.unused)} tensors of the GGUF have no place in "
                                 f"transformers' {runner.cfg.get('architectures', ['?'])[0]} "
                                 "(llama.cpp reads them): not converted", path=model.path,
                                 tensor=self.unused[0])
        self.params = params
        self.shapes = {p: tuple(int(s) for s in runner._meta[p].shape)   # noqa: SLF001
                       for p in params}
        probe = _probe()
        self._streams = {}
        for p in params:
            srcs = runner.by_param[p]
            slot = runner.slots[srcs[0]]
            permuted = getattr(runner, "unpermute", False) and \
                runner._rope_unpermute(p, probe) is not probe   # noqa: SLF001
            shape = self.shapes[p]
            if (len(srcs) == 1 and slot.expert is None and slot.parts == 1 and not permuted
                    and len(shape) == 2 and model.info(srcs[0]).matrix_shape == shape):
                self._streams[p] = srcs[0]

    def _read_shaped(self, n: str) -> np.ndarray:
        """A GGUF tensor in its own shape (a bias as a vector: the rope un-permutation splits
        its first dimension)."""
        return self.view.read(n).reshape(self.view.info(n).shape)

    def shift(self, p: str):
        return np.float32(1.0) if self.plus_one and p.endswith("norm.weight") else None

    def streamable(self, p: str) -> bool:
        """Whether rows of `p` are rows of one GGUF tensor (nothing to undo across rows)."""
        return p in self._streams

    def rows(self, p: str, r0: int, r1: int) -> np.ndarray:
        """float32 rows r0:r1 of a streamable parameter."""
        w = self.view.rows(self._streams[p], r0, r1)
        s = self.shift(p)
        return w if s is None else w - s

    def iter_rows(self, p: str, max_elements: int):
        rows, cols = self.shapes[p]
        step = max(1, max_elements // max(cols, 1))
        for r0 in range(0, rows, step):
            yield r0, self.rows(p, r0, min(rows, r0 + step))

    def read(self, p: str) -> np.ndarray:
        """The whole parameter as float32 in the network's shape."""
        if self.streamable(p):
            return self.rows(p, 0, self.shapes[p][0])
        w = self.runner.param_tensor(p, override=self._read_shaped).numpy()
        s = self.shift(p)
        return w if s is None else w - s


def _probe():
    import torch
    return torch.zeros(0)


def _live_rows(names: HFNames, p: str, info: TensorInfo) -> LazyRows:
    """A live parameter as the loaders' raw storage: rows dequantized when sliced; rows that
    need the whole tensor (un-permuted q/k) read it once for this reader's slices."""
    shape = (info.rows, info.cols)
    return LazyRows(info.rows, info.cols, lambda r0, r1: names.rows(p, r0, r1),
                    lambda: np.ascontiguousarray(names.read(p), np.float32).reshape(shape),
                    sliceable=names.streamable(p))


def clean_stale_dirs(parent: str | None = None) -> None:
    """Remove companion folders of processes that are gone (killed before they cleaned up)."""
    parent = parent or tempfile.gettempdir()
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return
    for e in entries:
        m = _STALE.match(e.name)
        if not m or not e.is_dir(follow_symlinks=False):
            continue
        pid = int(m.group(1))
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
            continue            # alive (or not ours to signal): left alone
        except ProcessLookupError:
            shutil.rmtree(e.path, ignore_errors=True)
        except (PermissionError, OSError):
            continue


def open_live(path):
    """Job: the GGUF at `path` as a float32 Hugging Face model (see the module doc). Yields
    progress while transformers reads the header; returns the Model (close() removes its
    companion folder)."""
    from workbench.export.convert import open_source
    from workbench.export.convert.carry import carry
    from workbench.export.convert.hf import (_header, llama_cpp_semantics,
                                             read_config_and_tokenizer, user_paths, waiting)
    from workbench.export.convert.source import FloatView
    p = Path(path).expanduser()
    src = open_source(p)
    arch = src.metadata.get("general.architecture")
    if live_problem(src.metadata) is not None:
        md = dict(src.metadata)
        src.close()
        raise WorkbenchError(unsupported_message(md), path=str(p))
    clean_stale_dirs()
    tmp = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-"))
    try:
        cfg, tok = yield from waiting(lambda: read_config_and_tokenizer(str(p), arch, _header(src)),
                                      "reading the GGUF's config and tokenizer (transformers)")
        cfg["dtype"] = "float32"
        llama_cpp_semantics(cfg, arch, src.metadata)
        view = FloatView(src)
        view.in_config = carry(cfg, view)
        import json
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        tok.save_pretrained(str(tmp))
        # the companions carry the GGUF's modification time: caches keyed by file signatures
        # (the tokenized calibration text) hit again in the next run on the same file
        st = os.stat(p)
        for f in tmp.iterdir():
            os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
        yield Progress(0, 1, "mapping the GGUF's tensors to the network's parameters")
        names = HFNames(view, tmp)
    except BaseException as exc:
        src.close()
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, WorkbenchError):     # named for the GGUF, not the gone folder
            raise user_paths(exc, str(tmp), str(p), lambda what: _inside(p, what)) from None
        raise
    tensors = {}
    for q in names.params:
        shape = names.shapes[q]
        tensors[q] = TensorInfo(q, shape, "F32", 4 * math.prod(shape), str(p))
    model = Model(str(p), FORMAT, tensors, lambda q: _live_rows(names, q, tensors[q]),
                  {"quant_workbench.gguf_architecture": arch}, folder=str(tmp))
    _COMPANIONS[str(tmp)] = str(p)
    cleanup = weakref.finalize(model, _cleanup, src, str(tmp))
    model._closer = cleanup   # noqa: SLF001 - close(): the GGUF's maps and the companions
    model.unused = names.unused
    model.in_config = names.in_config
    return model


def public_error(exc: WorkbenchError) -> WorkbenchError:
    """`exc` naming the GGUF where it names a file of a live model's companion folder (a
    user never saw that folder: its files are built from the GGUF's metadata)."""
    from workbench.export.convert.hf import user_paths
    for folder, gguf in list(_COMPANIONS.items()):
        new = user_paths(exc, folder, gguf, lambda what, g=gguf: _inside(g, what))
        if new is not exc:
            return new
    return exc


def _inside(gguf, what: str) -> str:
    return f"{gguf} (its {what}, built from the GGUF's metadata)"


def _cleanup(src, tmp: str) -> None:
    _COMPANIONS.pop(tmp, None)
    try:
        src.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

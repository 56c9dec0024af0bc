"""An output never replaces an input: one check for every command's file arguments (and the
GUI's save dialogs), made before anything is written.

Files are compared by identity (st_dev, st_ino), so a symbolic link or a hard link to an input
is caught whatever its name. An input that is a folder (a Hugging Face model folder) or a file
read with companions (config.json, tokenizer.json beside a checkpoint; the shards beside an
index) contributes all of those files. An output folder (compressed-tensors writes one) may
not hold an input either: it can be replaced as a whole.

    refuse_inputs_as_outputs({"--output": "out.gguf"}, {"--plan": "p.json", "MODEL": "m/"})
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from workbench.core.errors import WorkbenchError

MODEL_LABELS = ("MODEL", "the model")
MAX_FOLDER_FILES = 100_000   # files of one input folder compared (a model folder holds a few)


def _stat(p: Path):
    try:
        return p.stat()            # follows symbolic links
    except (OSError, ValueError):  # missing, unreadable, a NUL in the name
        return None


def expand_input(path) -> list[Path]:
    """The files an input argument stands for: the file, its companions for a checkpoint (the
    files the loaders read beside it), or the regular files of a folder (one level)."""
    from workbench.core.atomic import SIDECARS
    p = Path(path).expanduser()
    st = _stat(p)
    if st is None:
        return []
    import stat as st_mod
    files = []
    if st_mod.S_ISDIR(st.st_mode):
        folder = p
    else:
        files.append(p)
        name = p.name.lower()
        is_model = name.endswith((".safetensors", ".gguf", ".bin", ".pt", ".pth", ".ckpt",
                                  ".index.json"))
        if not is_model:
            return files
        if name.endswith(".index.json"):
            folder = p.parent
        else:
            for s in SIDECARS:
                q = p.parent / s
                if _stat(q) is not None:
                    files.append(q)
            return files
    with contextlib.suppress(OSError):
        with os.scandir(folder) as it:
            for i, e in enumerate(it):
                if i >= MAX_FOLDER_FILES:
                    break
                with contextlib.suppress(OSError):
                    if e.is_file():
                        files.append(Path(e.path))
    return files


def refuse_inputs_as_outputs(outputs: dict, inputs: dict) -> None:
    """`outputs` and `inputs`: {label (e.g. '--output', 'MODEL'): path}. A WorkbenchError
    (naming the output and the input it would replace) when an output is the same file as an
    input (any link to it), or an existing folder holding one. Nothing is written."""
    in_files = []   # (label, path, stat)
    for label, value in inputs.items():
        if value is None:
            continue
        for f in expand_input(value):
            st = _stat(f)
            if st is not None:
                in_files.append((label, f, st))
    for olabel, out in outputs.items():
        if out is None:
            continue
        o = Path(out).expanduser()
        ost = _stat(o)
        if ost is None:
            continue            # nothing there yet: it cannot be an input
        for label, f, st in in_files:
            if (ost.st_dev, ost.st_ino) == (st.st_dev, st.st_ino):
                # the input named too where it is spelled otherwise (a link, a folder's file)
                what = label if str(f) == str(out) else f"{label} ({f})"
                if label in MODEL_LABELS:
                    what = f"{what}: an input of the open model"
                the = "" if label.startswith("the ") else "the input "
                raise WorkbenchError(f"{olabel} is the same file as {the}{what}; choose "
                                     "another output; nothing was written", path=str(out))
        if o.is_dir():
            try:
                real = o.resolve()
            except (OSError, RuntimeError):
                continue
            for label, f, _ in in_files:
                with contextlib.suppress(OSError, RuntimeError):
                    if real in f.resolve().parents:
                        model = (", an input of the open model" if label in MODEL_LABELS
                                 else "")
                        raise WorkbenchError(f"{olabel} is a folder holding the input {label} "
                                             f"({f.name}{model}) and could be replaced: choose "
                                             "another output; nothing was written",
                                             path=str(out))
    seen = {}
    for olabel, out in outputs.items():   # two outputs naming one file
        st = _stat(Path(out).expanduser()) if out is not None else None
        if st is None:
            continue
        key = (st.st_dev, st.st_ino)
        if key in seen:
            raise WorkbenchError(f"{olabel} and {seen[key]} name the same file: nothing was "
                                 "written", path=str(out))
        seen[key] = olabel

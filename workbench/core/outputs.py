"""The one door every output goes through: an output never replaces an input, never lands in
a folder that is not there or cannot be written, and never replaces a folder the user did not
ask to replace. Checked before any work starts, for the API, the CLI and the app alike
(:func:`check_output`; the CLI's `check_file_args` adds the command's other file arguments).

Files are compared by identity (st_dev, st_ino), so a symbolic link or a hard link to an input
is caught whatever its name. An input that is a folder (a Hugging Face model folder) or a file
read with companions (config.json, tokenizer.json beside a checkpoint; the shards beside an
index) contributes all of those files. An output folder (compressed-tensors writes one) may
not hold an input either: it can be replaced as a whole.

    refuse_inputs_as_outputs({"--output": "out.gguf"}, {"--plan": "p.json", "MODEL": "m/"})
    check_output("out-folder", kind="folder", model=model, inputs={"calib": "c.txt"})
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
                        why = (": it holds an input of the open model, and writing there "
                               "would overwrite the source" if label in MODEL_LABELS
                               else " and could be replaced")
                        raise WorkbenchError(f"{olabel} is a folder holding the input {label} "
                                             f"({f.name}){why}; choose another output; nothing "
                                             "was written", path=str(out))
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


def input_files(model) -> list[Path]:
    """The files a model was read from: its file (and the config/tokenizer files beside it), or
    for a folder or shard index every regular file of the folder (shards, index, config...),
    and the shards an index names elsewhere."""
    files = expand_input(model.path)
    for f in _shards_elsewhere(model, files):
        files.append(f)
    return files


def _shards_elsewhere(model, known) -> list[Path]:
    out, seen = [], set(map(str, known))
    for info in getattr(model, "tensors", {}).values():
        f = getattr(info, "file", "")
        if f and str(f) not in seen:
            seen.add(str(f))
            out.append(Path(f))
    return out


def refuse_overwriting_inputs(model, out_path, label: str = "the output") -> None:
    """A WorkbenchError when `out_path` is (or links to) a file the model was read from, or is
    a folder holding one (symbolic and hard links resolved: same st_dev/st_ino)."""
    inputs = {"the model": model.path}
    for i, f in enumerate(_shards_elsewhere(model, expand_input(model.path))):
        inputs[f"the model's shard {i}"] = f
    refuse_inputs_as_outputs({label: out_path}, inputs)


#: what an output path names: a file (replaced atomically when it exists and is not an input),
#: a folder (written whole; an existing non-empty one only replaced when asked)
KINDS = ("file", "folder")


def _path_arg(value, label: str) -> Path:
    if isinstance(value, bytes) or not isinstance(value, (str, os.PathLike)):
        raise WorkbenchError(f"{label}: expected a file path (str or os.PathLike), got "
                             f"{type(value).__name__}")
    text = os.fspath(value)
    if not text or "\x00" in text:
        raise WorkbenchError(f"{label}: expected a file path, got {text!r}")
    return Path(text).expanduser()


def _shown(p: Path, limit: int = 200) -> str:
    """The path as a message shows it: a hostile 100 KB name cut to its ends."""
    text = str(p)
    return text if len(text) <= limit else f"{text[:limit // 2]}…{text[-limit // 2:]}"


def _listing(folder: Path, limit: int = 3) -> tuple[int, list[str]]:
    """(entries of `folder` that are not this program's temporary files, the first few names
    in sorted order)."""
    from workbench.core.atomic import TEMP_TAG
    names = []
    with contextlib.suppress(OSError):
        with os.scandir(folder) as it:
            for e in it:
                if f".{TEMP_TAG}-" not in e.name:
                    names.append(e.name)
                if len(names) > MAX_FOLDER_FILES:
                    break
    return len(names), sorted(names)[:limit]


def check_output(path, *, kind: str = "file", model=None, inputs: dict | None = None,
                 overwrite: bool | None = False, replace_file: bool = True,
                 label: str = "output") -> Path:
    """Check an output before any work starts; returns it as a Path. A WorkbenchError (one
    line naming the output; nothing written) when it

    * is not a path (None, a number, an object: `label` names the parameter);
    * is, or links to, a file of `model` or of `inputs` ({label: path}), or is a folder
      holding one (never replaced, `overwrite` or not);
    * has no folder to be written into, or that folder cannot be written (a read-only or full
      file system, no permission: found by creating and removing a temporary file there);
    * ``kind="file"``: is an existing folder, or exists at all when `replace_file` is False;
    * ``kind="folder"``: is an existing file, or an existing folder that is not empty (a model
      folder, someone's files) unless `overwrite` (None: this output never replaces one, and
      the message offers no way to).
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    out = _path_arg(path, label)
    try:
        os.lstat(out)
    except (FileNotFoundError, NotADirectoryError):
        pass                                    # nothing there: the folder is checked below
    except (OSError, ValueError) as exc:       # a name too long, a link loop, not a folder
        raise WorkbenchError(f"cannot write here ({getattr(exc, 'strerror', None) or exc}); "
                             "nothing was written", path=_shown(out)) from None
    if model is not None:
        refuse_overwriting_inputs(model, out, label)
    if inputs:
        refuse_inputs_as_outputs({label: out}, inputs)
    st = _stat(out)
    import stat as st_mod
    if st is not None:
        is_dir = st_mod.S_ISDIR(st.st_mode)
        if kind == "file" and is_dir:
            raise WorkbenchError("is a folder: name a file to write; nothing was written",
                                 path=str(out))
        if kind == "file" and not replace_file:
            raise WorkbenchError("exists: choose a new file name (this never replaces a "
                                 "file); nothing was written", path=str(out))
        if kind == "folder" and not is_dir:
            raise WorkbenchError("is a file, not a folder: name a new or empty folder; "
                                 "nothing was written", path=str(out))
        if kind == "folder" and not overwrite:
            n, names = _listing(out)
            if n:
                what = ("a model" if any(x.endswith((".safetensors", ".gguf", ".bin", ".json"))
                                         for x in names) else "other files")
                raise WorkbenchError(
                    f"output folder exists and holds {what} ({', '.join(names)}"
                    f"{f' and {n - len(names)} more' if n > len(names) else ''}): "
                    "choose a new or empty folder" + ("" if overwrite is None else
                                                      ", or allow replacing it "
                                                      "(overwrite=True)")
                    + "; nothing was written", path=str(out), params=("overwrite",))
    elif out.is_symlink():
        raise WorkbenchError("is a symbolic link to nothing: name a real path; nothing was "
                             "written", path=str(out))
    parent = out.parent if str(out.parent) else Path(".")
    pst = _stat(parent)
    if pst is None or not st_mod.S_ISDIR(pst.st_mode):
        raise WorkbenchError(f"output folder does not exist ({parent}"
                             + (")" if pst is None else ": it is a file)")
                             + "; nothing was written", path=str(out))
    _probe(out)
    return out


def _probe(out: Path) -> None:
    """Create and remove a temporary file beside `out`: the folder can be written now."""
    from workbench.core.atomic import make_temp
    fd, tmp = make_temp(out, ".probe.tmp")   # a WorkbenchError naming `out` when it cannot
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(tmp)

"""What the fuzz worker does with an mlx-lm folder spec (tests/fuzz/cases_mlx.py): writes it,
opens it and reads every tensor whole and by rows (mlx, mlx-shards), takes it as a budget
(mlx-budget), or runs `export --format mlx` as the spec says (mlx-export). A clean refusal is
a one-line WorkbenchError naming the folder (or a file in it; an export option's refusal
names the option); anything else (a traceback, a refusal naming nothing, a shape that does
not match what reading gives, a budget other than the model's files, a changed input or user
file, a partial output) is a Finding."""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np

from workbench.core.errors import WorkbenchError

NP = {"U32": np.uint32, "I32": np.int32, "U8": np.uint8, "F16": np.float16, "F32": np.float32,
      "I8": np.int8, "BF16": np.uint16}


def _tensors(spec: dict) -> dict:
    """{name: (safetensors dtype, array)} of a module spec (cases_mlx.mlx)."""
    rng = np.random.default_rng(spec["seed"])
    mod = "model.layers.0.mlp.down_proj"
    tensors = {"model.norm.weight": ("F32", np.ones(8, np.float32))}
    for key, (dtype, shape) in spec["arrays"].items():
        n = int(np.prod(shape))
        if dtype in ("F16", "F32"):
            a = rng.standard_normal(n).astype(NP[dtype])
        else:
            a = rng.integers(0, 256 if dtype in ("U8", "I8") else 1 << 16, n).astype(NP[dtype])
        name = f"model.orphan.{'scales' if dtype == 'F16' else 'biases'}" if key == "orphan" \
            else f"{mod}.{key}"
        tensors[name] = (dtype, a.reshape(shape))
    return tensors


def _st_bytes(tensors: dict) -> bytes:
    header, data = {}, b""
    for name, (dtype, a) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(a.shape),
                        "data_offsets": [len(data), len(data) + a.nbytes]}
        data += a.tobytes()
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    return len(blob).to_bytes(8, "little") + blob + data


def _write(folder: Path, spec: dict) -> None:
    tensors = _tensors(spec)
    if spec.get("shards"):
        _write_shards(folder, tensors, spec["shards"])
    else:
        (folder / "model.safetensors").write_bytes(_st_bytes(tensors))
    budget = spec.get("budget") or {}
    if budget.get("no_config"):
        return
    cfg = {"model_type": "llama"}
    if spec["quantization"] is not None and not budget.get("tensors_only"):
        cfg["quantization"] = spec["quantization"]
    (folder / "config.json").write_text(json.dumps(cfg))


def _write_shards(folder: Path, tensors: dict, how: dict) -> None:
    """`tensors` in two shards behind model.safetensors.index.json, laid out as `how` says
    (cases_mlx.mlx_shards); an 'outside' shard is written beside the folder."""
    names = list(tensors)
    cut = min(how["split"], len(names))
    parts = {"model-00001-of-00002.safetensors": names[:cut],
             "model-00002-of-00002.safetensors": names[cut:]}
    layout = how["layout"]
    files = dict(parts)
    outside = folder.parent / f"{folder.name}-outside.safetensors"
    renamed = {"dotdot": f"../{outside.name}", "absolute": str(outside),
               "subfolder": "sub/model-00002-of-00002.safetensors", "nul": "a\u0000b",
               "empty-name": ""}
    second = "model-00002-of-00002.safetensors"
    if layout in renamed:
        files = {"model-00001-of-00002.safetensors": parts["model-00001-of-00002.safetensors"],
                 renamed[layout]: parts[second]}
    for fname, members in files.items():
        data = _st_bytes({n: tensors[n] for n in members})
        if layout in ("dotdot", "absolute") and fname == renamed[layout]:
            outside.write_bytes(data)
        elif layout == "subfolder" and fname.startswith("sub/"):
            (folder / "sub").mkdir(exist_ok=True)
            (folder / fname).write_bytes(data)
        elif layout == "symlink-out" and fname == second:
            outside.write_bytes(data)
            (folder / fname).symlink_to(outside)
        elif layout == "missing" and fname == second:
            continue
        elif fname and "\u0000" not in fname:
            (folder / fname).write_bytes(data)
    weight_map = {n: f for f, members in files.items() for n in members}
    if layout == "stray":
        (folder / "model-extra.safetensors").write_bytes(_st_bytes(
            {"model.extra.weight": ("F32", np.ones((4, 4), np.float32))}))
    elif layout == "wrong-shard" and names:
        weight_map[names[-1]] = "model-00001-of-00002.safetensors" if cut < len(names) \
            else second
    elif layout == "unlisted" and names:
        weight_map.pop(names[-1])
    elif layout == "extra-listed":
        weight_map["model.ghost.weight"] = second
    elif layout == "same-shard-twice":
        weight_map = {n: second for n in names}
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    if layout == "junk-map":
        index["weight_map"] = [1, 2]
    elif layout == "junk-index":
        index = ["weight_map"]
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def exercise_mlx(path: str) -> None:
    from workbench.formats.loaders import open_model
    from . import hostile
    spec = json.loads(Path(path).read_text())
    where = Path(tempfile.mkdtemp(prefix="qw-mlx-"))
    try:
        _write(where, spec)
        try:
            m = open_model(where)
        except WorkbenchError as exc:
            if str(where) not in str(exc):
                raise hostile.Finding(f"refusal names no file: {exc}") from None
            raise
        for name, info in m.tensors.items():
            got = m.read(name)
            if got.shape != tuple(info.shape) or got.dtype != np.float32:
                raise hostile.Finding(f"{name}: listed {info.shape}, read {got.shape} "
                                      f"{got.dtype}")
            rows = [c for _, c in m.iter_rows(name, max_elements=64)]
            if rows and not np.array_equal(np.concatenate(rows), m.read_matrix(name),
                                           equal_nan=True):
                raise hostile.Finding(f"{name}: rows read in chunks differ from the whole")
    finally:
        shutil.rmtree(where, ignore_errors=True)


def _named(exc: WorkbenchError, *where) -> None:
    """A refusal must name the folder (or a file in it, or the file beside it it refused)."""
    from . import hostile
    if not any(str(w) in str(exc) for w in where):
        raise hostile.Finding(f"refusal names no file: {exc}") from None


@contextlib.contextmanager
def _spec_folder(path: str, prefix: str):
    """(spec, the temporary top folder, the mlx-lm folder `m` written in it); removed after."""
    spec = json.loads(Path(path).read_text())
    top = Path(tempfile.mkdtemp(prefix=prefix))
    where = top / "m"
    where.mkdir()
    try:
        _write(where, spec)
        yield spec, top, where
    finally:
        shutil.rmtree(top, ignore_errors=True)


def exercise_mlx_shards(path: str) -> None:
    """A sharded mlx-lm folder: opened and read whole, or refused naming the folder or the
    index; a shard outside the folder is never read."""
    from workbench.formats.loaders import open_model
    from . import hostile
    with _spec_folder(path, "qw-mlxs-") as (spec, _, where):
        try:
            m = open_model(where)
            for name in m.tensors:
                m.read(name)
        except WorkbenchError as exc:
            _named(exc, where)
            raise
        layout = spec["shards"]["layout"]
        second = spec["shards"]["split"] < len(_tensors(spec))     # (the index lists it)
        if second and layout in ("dotdot", "absolute", "symlink-out"):
            raise hostile.Finding(f"{layout}: a shard outside the folder was opened")
        if layout in ("extra-listed", "junk-map", "junk-index") or (
                second and layout == "missing"):
            raise hostile.Finding(f"{layout}: a broken index was opened without a word")


def exercise_mlx_budget(path: str) -> None:
    """`--budget-of FOLDER`: the budget is the bytes of the .safetensors files the folder's
    model reads (every one of them, and nothing else), or a one-line refusal naming the folder
    (from the API's budget and from `allocate`, exit 2, before any work)."""
    from workbench.planning.budget import budget_of
    from workbench.formats.loaders import open_model
    from . import hostile
    with _spec_folder(path, "qw-mlxb-") as (spec, top, where):
        try:
            b = budget_of(str(where))
        except WorkbenchError as exc:
            _named(exc, where)
            out = top / "plan.json"
            try:
                hostile.cli_outcome(["allocate", hostile.DEMO, "--budget-of", where,
                                     "--target", "mlx", "--measure", "weight", "--methods",
                                     "rtn", "-o", out], names=(where,))
            except WorkbenchError:
                pass
            else:
                raise hostile.Finding(f"budget_of refused ({exc}) but allocate ran") from None
            if out.exists():
                raise hostile.Finding("a refused allocate wrote its plan")
            raise
        open_model(where)
        index = where / "model.safetensors.index.json"
        if index.is_file():
            read = {where / f for f in json.loads(index.read_text())["weight_map"].values()}
        else:
            read = set(where.glob("*.safetensors"))
        want = sum(f.stat().st_size for f in read)
        if b.value != want:
            raise hostile.Finding(f"budget {b.value:.0f} bytes, but the model's files hold "
                                  f"{want} ({sorted(f.name for f in read)}; on disk "
                                  f"{sorted(f.name for f in where.rglob('*.safetensors'))})")


def _tree_digest(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


def exercise_mlx_export(path: str) -> None:
    """`export --format mlx` with hostile options on a copy of the demo model: exit 0 with a
    folder that opens, or exit 2 with one line, before any write; never a changed input, a
    replaced user file or a partial output."""
    from workbench.formats.loaders import open_model
    from . import hostile
    spec = json.loads(Path(path).read_text())
    top = Path(tempfile.mkdtemp(prefix="qw-mlxe-"))
    try:
        model = top / "model"
        shutil.copytree(hostile.DEMO, model)
        argv = ["export", model, "--format", "mlx", *spec["opts"]]
        plan = top / "plan.json"
        p = spec["plan"]
        if "--scheme" not in spec["opts"]:
            if isinstance(p, dict) and isinstance(p.get("assign"), dict):
                p = {"format": "quant-workbench-plan", "version": 1, "default": p["default"],
                     "rules": [{"match": k, "scheme": v} for k, v in p["assign"].items()]}
            plan.write_text(json.dumps(p))
            argv += ["--plan", plan]
        out = {"new": top / "out", "new-nested": top / "a" / "b" / "out",
               "empty-dir": top / "empty", "full-dir": top / "full", "file": top / "file.txt",
               "model-dir": model, "inside-model": model / "mlx",
               "under-file": top / "file.txt" / "out", "the-plan": plan,
               "model-weights": model / "model.safetensors",
               "dotdot-model": top / "x" / ".." / "model"}[spec["output"]]
        (top / "empty").mkdir()
        (top / "full").mkdir()
        (top / "full" / "mine.txt").write_text("the user's file")
        (top / "file.txt").write_text("the user's other file")
        argv += ["-o", out]
        before = _tree_digest(top)
        existed = out.exists()
        try:
            if "--check" in spec["opts"]:    # exit 1: "the format cannot write this plan"
                rc, err = hostile.cli(argv)
                if rc not in (0, 1):
                    hostile.cli_outcome(argv)
            else:
                hostile.cli_outcome(argv)    # (an option's refusal names no file)
        except WorkbenchError:
            after = _tree_digest(top)
            if after != before:
                changed = sorted(k for k in set(before) | set(after)
                                 if before.get(k) != after.get(k))
                raise hostile.Finding(f"a refused export changed files: {changed[:5]}") \
                    from None
            if not existed and out.exists():
                raise hostile.Finding("a refused export left its output behind")
            raise
        after = _tree_digest(top)
        inputs = [k for k in before if k.startswith("model/") or k == "plan.json"
                  or k in ("full/mine.txt", "file.txt")]
        changed = [k for k in inputs if after.get(k) != before[k]]
        if changed and not ("--overwrite" in spec["opts"] and all(
                k.startswith("full/") for k in changed)):
            raise hostile.Finding(f"export exit 0 changed {changed[:5]}")
        if "--activations" in spec["opts"] and "--check" not in spec["opts"]:
            raise hostile.Finding("--activations accepted by a format that stores no ranges")
        if "--check" in spec["opts"]:
            if after != before:
                raise hostile.Finding("export --check wrote files")
            return
        m = open_model(out)
        if not m.tensors:
            raise hostile.Finding("export wrote a folder with no tensors")
    finally:
        shutil.rmtree(top, ignore_errors=True)


EXERCISES = {"mlx": exercise_mlx, "mlx-shards": exercise_mlx_shards,
             "mlx-budget": exercise_mlx_budget, "mlx-export": exercise_mlx_export}

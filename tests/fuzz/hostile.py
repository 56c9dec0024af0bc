"""What the fuzz worker does with each hardening input kind (tests/fuzz/cases_hostile.py).

Each `exercise_<kind>(path)` returns normally for a correct result, raises WorkbenchError for
a clean refusal (a one-line error naming the file), and raises anything else for a finding:
a command that ends in exit 3, an input file changed by a refused command, a refusal that
does not name the file, a partial output left behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import sys
import threading
from pathlib import Path

import numpy as np

from workbench.core.errors import WorkbenchError

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "resources" / "demo_model"


class Finding(Exception):
    """A defect the fuzz suite looks for (counted as a failure)."""


def cli(argv: list[str]) -> tuple[int, str]:
    """Run the command in-process: (exit status, stderr)."""
    from workbench.cli import main
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            rc = main([str(a) for a in argv])
        except SystemExit as exc:   # argparse
            rc = exc.code if isinstance(exc.code, int) else 2
    return rc, err.getvalue()


def cli_outcome(argv, names=()) -> None:
    """exit 0: return; exit 2: a WorkbenchError (its line must name one of `names`);
    anything else: a Finding."""
    rc, err = cli(argv)
    if rc == 0:
        return
    if rc == 2:
        line = err.strip().splitlines()[-1] if err.strip() else ""
        if "\n" in err.strip():
            raise Finding(f"exit 2 with more than one line: {err[-400:]!r}")
        if names and not any(str(n) in line for n in names):
            raise Finding(f"error does not name the file ({names}): {line[:300]}")
        raise WorkbenchError(line)
    raise Finding(f"exit {rc}: {err[-600:]}")


def _tiny_model(folder: Path, shapes=None, seed: int = 0) -> Path:
    from workbench.export.st_writer import StreamingSafetensorsWriter
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    w = StreamingSafetensorsWriter(str(folder / "model.safetensors"))
    for name, shape in (shapes or [("model.layers.0.self_attn.q_proj.weight", (32, 64)),
                                   ("model.layers.0.mlp.up_proj.weight", (64, 64)),
                                   ("model.layers.0.input_layernorm.weight", (64,))]):
        w.add(name, rng.standard_normal(shape).astype(np.float32))
    w.finish()
    # a config without the sizes: not runnable (a clean refusal), never transformers' 7B
    # defaults allocated under the worker's memory limit
    (folder / "config.json").write_text(json.dumps({"model_type": "not-a-runnable-type"}))
    return folder / "model.safetensors"


def _digest(p: Path) -> str | None:
    try:
        return hashlib.sha256(p.read_bytes()).hexdigest()
    except OSError:
        return None


# ---- 1 outputs ----------------------------------------------------------------------------
def output_path(d: Path, target: Path, link: str) -> Path:
    """The output path a case writes: a fresh file in `d`, or `target` itself spelled as is
    (same), relatively, through a symlink or through a hard link."""
    if link == "none":
        return d / "fresh.out"
    if link == "same":
        return target
    if link == "relative":
        return Path(os.path.relpath(target, os.getcwd()))
    out = d / ("link.out" if link == "symlink" else "hard.out")
    if link == "symlink":
        out.symlink_to(target)
    else:
        os.link(target, out)
    return out


def exercise_outputs(path: str) -> None:
    spec = json.loads(Path(path).read_text())
    d = Path(path).parent
    model = _tiny_model(d / "m")
    plan = d / "plan.json"
    plan.write_text(json.dumps({"format": "quant-workbench-plan", "version": 1,
                                "default": "q8_0", "rules": []}))
    imx = d / "m.imatrix.dat"
    from .cases_hostile import _dat
    imx.write_bytes(_dat([("blk.0.attn_q.weight", 1, np.ones(64, np.float32))]))
    calib = d / "calib.txt"
    calib.write_text("hello world\n")
    target = {"model": model, "plan": plan, "config": d / "m" / "config.json", "imatrix": imx,
              "calib": calib, "folder": d / "m"}[spec["target"]]
    link = spec["link"]
    out = output_path(d, target, link)
    cmd = spec["cmd"]
    base = {"export-plan": ["export", model, "--plan", plan, "--format", "plan"],
            "export-safetensors": ["export", model, "--plan", plan, "--format", "safetensors"],
            "export-gguf": ["export", model, "--plan", plan, "--format", "gguf"],
            "export-types": ["export", model, "--plan", plan, "--format", "llama-tensor-types"],
            "export-imatrix": ["export", model, "--scheme", "q4_0", "--format", "gguf",
                               "--method", "imatrix", "--imatrix", imx],
            "allocate": ["allocate", model, "--budget-bpw", "6", "--imatrix", imx,
                         "--schemes", "q4_0,q8_0"],
            "export-acts": ["export", model, "--scheme", "q8_0", "--format", "plan",
                            "--activations", "minmax", "--calib", calib]}[cmd]
    inputs = [model, d / "m" / "config.json"] + [x for x in (plan, imx, calib)
                                                   if x in base]
    before = {p: _digest(p) for p in inputs}
    rc, err = cli(base + ["-o", out])
    after = {p: _digest(p) for p in inputs}
    changed = [p.name for p in inputs if before[p] != after[p]]
    if changed:
        raise Finding(f"{cmd} -o {link} {spec['target']}: input changed {changed}, exit {rc}")
    names_an_input = link != "none" and (
        spec["target"] in ("model", "config", "folder")
        or (spec["target"] == "plan" and "--plan" in base)
        or (spec["target"] == "imatrix" and "--imatrix" in base)
        or (spec["target"] == "calib" and "--calib" in base))
    if names_an_input and rc != 2:
        raise Finding(f"{cmd} -o {link} to input {spec['target']}: exit {rc}, not refused")
    if rc not in (0, 2):
        raise Finding(f"{cmd}: exit {rc}: {err[-500:]}")
    if rc == 2:
        raise WorkbenchError(err.strip().splitlines()[-1])


# ---- 2 pt-cycles --------------------------------------------------------------------------
def exercise_model(path: str) -> None:
    from .worker import exercise
    exercise("pytorch", path)


# ---- 3 imatrix ----------------------------------------------------------------------------
def exercise_imatrix(path: str) -> None:
    from workbench.running.imatrix import check_imatrix_for, read_imatrix
    from workbench.formats.model import Model, TensorInfo
    name = Path(path).name
    try:
        im = read_imatrix(path)
        infos = {n: TensorInfo(n, (8, 32), "F32", 8 * 32 * 4, path) for n in im}
        m = Model("model.safetensors", "safetensors", infos, lambda n: None, {})
        for n, v in im.items():
            check_imatrix_for(m, path, n, v)
            if not np.isfinite(v).all() or (v < 0).any():
                raise Finding(f"imatrix values accepted but not finite/non-negative: {n}")
    except WorkbenchError as exc:
        if name not in str(exc):
            raise Finding(f"imatrix error does not name the imatrix file: {exc}") from None
        raise


# ---- 4 calibration ------------------------------------------------------------------------
_DEMO_MODEL = None


def exercise_calibration(path: str) -> None:
    global _DEMO_MODEL
    from workbench.running.calibration import calibration_samples
    from workbench.formats.loaders import open_model
    from workbench.core.progress import run
    if _DEMO_MODEL is None:
        _DEMO_MODEL = open_model(DEMO)
    name = Path(path).name
    try:
        out = run(calibration_samples(_DEMO_MODEL, path, None, 128))
    except WorkbenchError as exc:
        if name not in str(exc):
            raise Finding(f"calibration error does not name the file: {exc}") from None
        raise
    vocab = 512
    for s in out:
        if s.size and (s.min() < 0 or s.max() >= vocab):
            raise Finding(f"token id {int(s.max())} outside the vocabulary accepted")
        if len(s) > 128:
            raise Finding(f"a sample of {len(s)} tokens (max_len 128)")


# ---- 5 roundtrip --------------------------------------------------------------------------
def exercise_roundtrip(path: str) -> None:
    import torch

    from workbench.export import export
    from workbench.export.st_writer import StreamingSafetensorsWriter
    from workbench.formats.loaders import open_model
    from workbench.quant.plan import Plan
    from workbench.core.progress import run
    spec = json.loads(Path(path).read_text())
    d = Path(path).parent
    rng = np.random.default_rng(spec["seed"])
    src = d / "src.safetensors"
    w = StreamingSafetensorsWriter(str(src))
    for t in spec["tensors"]:
        a = rng.standard_normal(t["shape"]).astype(np.float32)
        name = t["name"].replace("\\udc80", "\udc80")   # a lone surrogate, as JSON allows
        if t["dtype"] == "bfloat16":
            bits = torch.from_numpy(a).to(torch.bfloat16).view(torch.int16).numpy()
            w.add(name, bits.view(np.uint16), dtype="BF16")
        else:
            w.add(name, a.astype(t["dtype"]))
    w.finish()
    m = open_model(src)
    out = d / ("out" + {"gguf": ".gguf", "safetensors": ".safetensors", "plan": ".json",
                        "llama-tensor-types": ".txt", "compressed-tensors": ""}[spec["format"]])
    run(export(m, Plan(default=spec["scheme"]), spec["format"], str(out)))
    if spec["format"] in ("gguf", "safetensors", "compressed-tensors"):
        from .worker import exercise
        exercise("model", str(out))              # every exporter's output opens again
    elif spec["format"] == "plan":
        Plan.load(out)


# ---- 6 gguf-align -------------------------------------------------------------------------
def exercise_gguf(path: str) -> None:
    import warnings
    from .worker import exercise
    with warnings.catch_warnings():
        warnings.simplefilter("error")         # a numpy warning (shifted data) is a finding
        try:
            exercise("gguf", path)
        except (RuntimeWarning, UserWarning) as exc:
            raise Finding(f"warning while reading: {exc}") from None


# ---- 7 truncation -------------------------------------------------------------------------
def exercise_truncation(path: str) -> None:
    import time

    from workbench.export import export
    from workbench.formats.loaders import open_model
    from workbench.quant.plan import Plan
    from workbench.core.progress import run
    _unpatch()   # a previous case's constants, should it have ended before restoring them
    spec = json.loads(Path(path).read_text())
    d = Path(path).parent
    shapes = [(f"model.layers.{i}.mlp.up_proj.weight", (64, 256)) for i in range(6)]
    src = _tiny_model(d / "m", shapes, spec["seed"])
    if spec["source"] == "gguf":
        run(export(open_model(src), Plan(default="fp16"), "gguf", str(d / "m.gguf")))
        src = d / "m.gguf"
    elif spec["source"] == "pytorch":
        import torch
        from workbench.formats.loaders import open_model as om
        sm = om(src)
        torch.save({n: torch.from_numpy(np.array(sm.read_matrix(n))) for n in sm.tensors},
                   d / "m.pt")
        src = d / "m.pt"
    if spec.get("large"):
        from workbench.export import gguf_tensor_data, quantized_safetensors
        from workbench.formats.loaders import region
        _patch(region, "PREAD_LIMIT", 4096)
        _patch(gguf_tensor_data, "KEPT_CHUNK_BYTES", 4096)
        _patch(quantized_safetensors, "KEPT_STREAM_BYTES", 4096)
        _patch(quantized_safetensors, "KEPT_CHUNK_BYTES", 4096)
    model = open_model(src)
    size = src.stat().st_size
    cut = int(size * spec["cut"])
    out = d / ("o" + {"gguf": ".gguf", "safetensors": ".safetensors",
                      "llama-tensor-types": ".txt"}[spec["format"]])
    job = export(model, Plan(default=spec.get("plan", "q8_0")), spec["format"], str(out))
    if spec["when"] == "before":
        os.truncate(src, cut)
        thread = None
    else:
        thread = threading.Thread(target=lambda: (time.sleep(0.002), os.truncate(src, cut)))
        thread.start()
    try:
        run(job)
    except WorkbenchError as exc:
        if src.name not in str(exc) and out.name not in str(exc):
            raise Finding(f"truncation error names neither file: {exc}") from None
        leftovers = [p.name for p in d.iterdir() if "quant-workbench" in p.name]
        if out.exists() or leftovers:
            raise Finding(f"partial output left: {out.exists()} {leftovers}") from None
        raise
    finally:
        if thread is not None:
            thread.join()
        _unpatch()


_PATCHED: list = []


def _patch(module, name: str, value) -> None:
    """Set a module constant for this case (the worker runs the next case with it restored)."""
    _PATCHED.append((module, name, getattr(module, name)))
    setattr(module, name, value)


def _unpatch() -> None:
    while _PATCHED:
        module, name, value = _PATCHED.pop()
        setattr(module, name, value)


# ---- 8 scale ------------------------------------------------------------------------------
def exercise_scale(path: str) -> None:
    p = Path(path)
    if p.suffix == ".json":
        from workbench.formats.loaders import open_model
        from workbench.quant.plan import Plan
        plan = Plan.load(p)
        global _DEMO_MODEL
        if _DEMO_MODEL is None:
            _DEMO_MODEL = open_model(DEMO)
        for n in _DEMO_MODEL.tensors:
            plan.rule_for(n)
        for i in range(0, 100_000, 997):
            plan.rule_for(f"model.layers.{i}.mlp.up_proj.weight")
        return
    from workbench.formats.loaders import open_model
    from workbench.core.progress import run
    from workbench.quant.stats import model_stats
    m = open_model(p)
    run(model_stats(m, [n for n, i in m.tensors.items() if i.numel][:16]))
    for info in m.tensors.values():
        info.to_dict()


# ---- 9 optional ---------------------------------------------------------------------------
def _forget_built_objects() -> None:
    """This worker's in-process caches of objects an earlier case built with the module a case
    now hides (the runner's transformers network, tokenized calibration text, Fisher
    diagonals): a process without the module never had them. Kept, a `check` served by the
    cached runner exited 0 with transformers hidden (seed 1202)."""
    from workbench.planning import fisher
    from workbench.running import calibration, runner_passes
    runner_passes._RUNNERS.clear()
    calibration._CACHE.clear()
    fisher._FISHER_CACHE.clear()


def exercise_optional(path: str) -> None:
    spec = json.loads(Path(path).read_text())
    d = Path(path).parent
    mod = spec["module"]
    saved = {k: v for k, v in sys.modules.items() if k == mod or k.startswith(mod + ".")}
    argv = {"export-ct": ["export", DEMO, "--scheme", "int4-g32", "--format",
                          "compressed-tensors", "-o", d / "ct"],
            "check": ["check", DEMO, "--scheme", "q8_0"],
            "sensitivity": ["sensitivity", DEMO, "--measure", "activation", "--schemes", "q8_0"],
            "calibrate": ["calibrate", DEMO, "-o", d / "im.gguf"]}[spec["cmd"]]
    needs = {"export-ct": {"compressed_tensors"},
             "check": {"transformers", "tokenizers"},
             "sensitivity": {"transformers", "tokenizers"},
             "calibrate": {"transformers", "tokenizers"}}[spec["cmd"]]
    _forget_built_objects()
    try:
        for k in saved:
            sys.modules[k] = None
        sys.modules[mod] = None
        rc, err = cli(argv)
    finally:
        for k in list(sys.modules):
            if k == mod or k.startswith(mod + "."):
                del sys.modules[k]
        sys.modules.update(saved)
    line = err.strip().splitlines()[-1] if err.strip() else ""
    if mod in needs:
        extra = "[vllm]" if mod == "compressed_tensors" else "[model]"
        if rc != 2 or extra not in line or "\n" in err.strip():
            raise Finding(f"missing {mod}: exit {rc}, {err[-400:]!r}")
        raise WorkbenchError(line)
    if rc not in (0, 2):
        raise Finding(f"exit {rc}: {err[-400:]}")
    if rc == 2:
        raise WorkbenchError(line)


EXERCISES = {"outputs": exercise_outputs, "pt-cycles": exercise_model,
             "imatrix": exercise_imatrix, "calibration": exercise_calibration,
             "roundtrip": exercise_roundtrip, "gguf-align": exercise_gguf,
             "truncation": exercise_truncation, "scale": exercise_scale,
             "optional": exercise_optional}


#: the exercise modules of the other kinds (tests/fuzz/cases.KIND_MODULES: hostile_<m>.py)
KIND_MODULES = ("config", "cli", "caches", "blocks", "inputs", "nested", "api", "mlx")


def _kinds() -> None:
    import importlib
    for m in KIND_MODULES:
        EXERCISES.update(importlib.import_module(f"{__package__}.hostile_{m}").EXERCISES)


_kinds()

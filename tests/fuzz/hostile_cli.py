"""What the fuzz worker does with issue 32's kinds r4-outputs ... r4-leftovers
(tests/fuzz/cases_cli.py). Each exercise returns for a correct exit 0, raises WorkbenchError
for a clean refusal (exit 2, one line) and Finding for a defect: exit 3, an input changed, a
refusal that does not name the file, an output or temporary file left behind, a file over its
size limit read (or treated as absent), a message that blames the wrong thing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from workbench.core.errors import WorkbenchError

ROOT = Path(__file__).resolve().parents[2]
_CACHE: dict[str, Path] = {}


def _h():
    from . import hostile
    return hostile


def _llama(where: Path) -> Path:
    """A copy of the tiny Llama folder (config.json, model.safetensors, tokenizer files)."""
    from .hostile_config import tiny
    folder = where / "m"
    shutil.copytree(tiny("llama"), folder)
    return folder


def _calib(where: Path) -> Path:
    c = where / "c.txt"
    c.write_text("the quick brown fox jumps over the lazy dog\nhello world again\n")
    return c


def _tiny_gguf() -> Path:
    """The tiny Llama as a q8_0 GGUF (made once per worker)."""
    if "gguf" not in _CACHE:
        import tempfile
        d = Path(tempfile.mkdtemp(prefix="qw-r4-"))
        from .hostile_config import tiny
        rc, err = _h().cli(["export", tiny("llama"), "--scheme", "q8_0", "--format", "gguf",
                            "-o", d / "t.gguf"])
        if rc != 0:
            raise RuntimeError(f"seed GGUF: {err[-300:]}")
        _CACHE["gguf"] = d / "t.gguf"
    return _CACHE["gguf"]


def _tiny_ct() -> Path:
    """The tiny Llama as a compressed-tensors folder (made once per worker)."""
    if "ct" not in _CACHE:
        import tempfile
        d = Path(tempfile.mkdtemp(prefix="qw-r4-"))
        from .hostile_config import tiny
        rc, err = _h().cli(["export", tiny("llama"), "--scheme", "int4-g32", "--format",
                            "compressed-tensors", "-o", d / "ct"])
        if rc != 0:
            raise RuntimeError(f"seed compressed-tensors: {err[-300:]}")
        _CACHE["ct"] = d / "ct"
    return _CACHE["ct"]


def _error_line(err: str) -> str:
    lines = [x for x in err.strip().splitlines() if x.startswith("quant-workbench: error:")]
    return lines[-1] if lines else (err.strip().splitlines() or [""])[-1]


def _outcome(rc: int, err: str, what: str) -> str:
    """exit 0: ''; exit 2: the error line; anything else a Finding."""
    if rc == 0:
        return ""
    if rc != 2:
        raise _h().Finding(f"{what}: exit {rc}: {err[-600:]}")
    errors = [x for x in err.strip().splitlines() if x.startswith("quant-workbench: error:")]
    if len(errors) > 1:
        raise _h().Finding(f"{what}: more than one error line: {err[-400:]!r}")
    return _error_line(err)


def _argv(cmd: str, folder: Path, where: Path, calib: Path) -> tuple[list, Path | None]:
    out = {"inspect": None, "check": None, "calibrate": where / "im.gguf",
           "allocate": where / "plan.json", "export-gguf": where / "o.gguf",
           "export-ct": where / "ct"}[cmd]
    argv = {"inspect": ["inspect", folder, "--no-stats"],
            "check": ["check", folder, "--scheme", "q8_0", "--calib", calib, "--samples", "2"],
            "calibrate": ["calibrate", folder, "--calib", calib, "--samples", "2", "-o", out],
            "allocate": ["allocate", folder, "--budget-bpw", "6", "--schemes", "q4_0,q8_0",
                         "--measure", "weight", "-o", out],
            "export-gguf": ["export", folder, "--scheme", "q8_0", "--format", "gguf", "-o", out],
            "export-ct": ["export", folder, "--scheme", "int4-g32", "--format",
                          "compressed-tensors", "-o", out]}[cmd]
    return argv, out


def _digests(paths) -> dict:
    return {p: _h()._digest(p) for p in paths}


# ---- 1 r4-outputs ---------------------------------------------------------------------------
def exercise_outputs(path: str) -> None:
    from .cases_hostile import _dat
    from .cases_cli import OUTPUT_CMDS
    spec = json.loads(Path(path).read_text())
    d = Path(path).parent
    folder = _llama(d)
    calib = _calib(d)
    held = d / "h.txt"
    held.write_text("held-out text of the tiny model\n")
    plan = d / "p.json"
    plan.write_text(json.dumps({"format": "quant-workbench-plan", "version": 1,
                                "default": "q8_0", "rules": []}))
    import numpy as np
    imx = d / "im.dat"
    imx.write_bytes(_dat([("model.layers.0.mlp.up_proj.weight", 1, np.ones(64, np.float32))]))
    budget = d / "b.gguf"
    shutil.copyfile(_tiny_gguf(), budget)
    targets = {"calib": calib, "held": held, "plan": plan, "imatrix": imx, "budget": budget,
               "weights": folder / "model.safetensors", "config": folder / "config.json",
               "tokenizer": folder / "tokenizer.json", "folder": folder}
    target = targets.get(spec["target"])
    link = spec["link"]
    out = _h().output_path(d, target, link)
    cmd = spec["cmd"]
    flag, argv = {
        "check-onnx": ("--save-onnx", ["check", folder, "--scheme", "q8_0", "--runtime",
                                       "onnxruntime", "--calib", calib, "--held-out", held,
                                       "--save-onnx", out]),
        "check-gguf": ("--save-gguf", ["check", folder, "--scheme", "q8_0", "--runtime",
                                       "llama.cpp", "--calib", calib, "--save-gguf", out]),
        "calibrate": ("--output", ["calibrate", folder, "--calib", calib, "-o", out]),
        "allocate-of": ("--output", ["allocate", folder, "--budget-of", budget, "--measure",
                                     "weight", "--schemes", "q4_0,q8_0", "-o", out]),
        "export-imatrix": ("--output", ["export", folder, "--plan", plan, "--method",
                                        "imatrix", "--imatrix", imx, "--format", "plan",
                                        "-o", out]),
        "bench-onnx-keep": ("--keep", ["bench-onnx", folder, "--scheme", "q8_0", "--keep",
                                       out]),
    }[cmd]
    inputs = [p for k, p in targets.items() if k != "folder"
              and (k in MODEL_FILES or k in OUTPUT_CMDS[cmd])]
    before = _digests(inputs)
    rc, err = _h().cli(argv)
    after = _digests(inputs)
    changed = [p.name for p in inputs if before[p] != after[p]]
    if changed:
        raise _h().Finding(f"{cmd} {flag} {link} {spec['target']}: input changed {changed}, "
                           f"exit {rc}")
    line = _outcome(rc, err, cmd)
    if link != "none":
        if rc != 2:
            raise _h().Finding(f"{cmd} {flag} {link} -> input {spec['target']}: exit {rc}, "
                               "not refused")
        if flag not in line or ("same file" not in line and "folder holding" not in line):
            raise _h().Finding(f"refusal does not name {flag} and the input: {line[:300]}")
    if rc == 2:
        raise WorkbenchError(line)


MODEL_FILES = ("weights", "config", "tokenizer")


# ---- 4 r4-sidecars --------------------------------------------------------------------------
def _pad_json(p: Path, size: int) -> None:
    """`p` (valid JSON) padded with spaces to exactly `size` bytes."""
    raw = p.read_bytes().rstrip()
    if len(raw) > size:
        raise RuntimeError("sidecar larger than the padding target")
    with open(p, "wb") as fh:
        fh.write(raw)
        fh.write(b" " * (size - len(raw)))


def _make_sidecar(folder: Path, name: str) -> None:
    p = folder / name
    if p.exists():
        return
    if name.endswith(".index.json"):
        from workbench.formats.loaders import open_model
        names = list(open_model(folder / "model.safetensors").tensors)
        p.write_text(json.dumps({"metadata": {}, "weight_map":
                                 {n: "model.safetensors" for n in names}}))
    else:
        p.write_text(json.dumps({"bos_token": "<s>"}))


def exercise_sidecars(path: str) -> None:
    from workbench.core.limits import sidecar_limit
    spec = json.loads(Path(path).read_text())
    d = Path(path).parent
    folder = _llama(d)
    calib = _calib(d)
    name = spec["file"]
    _make_sidecar(folder, name)
    side = folder / name
    limit = sidecar_limit(side)
    size = spec["size"]
    over = False
    if size == "sparse":
        os.truncate(side, spec["sparse"])
        over = spec["sparse"] > limit
    elif size == "over":
        _pad_json(side, limit + 1)
        over = True
    elif size == "at-limit":
        if limit > 16 << 20:          # (64 MiB of spaces per case: too slow for the budget)
            _pad_json(side, (16 << 20) - 1)
        else:
            _pad_json(side, limit)
    argv, out = _argv(spec["cmd"], folder, d, calib)
    cfg_before = json.loads((folder / "config.json").read_bytes()) \
        if name != "config.json" else None
    rc, err = _h().cli(argv)
    line = _outcome(rc, err, f"{spec['cmd']} {name} {size}")
    cmd = spec["cmd"]
    must = over and (name.endswith(".index.json")
                     or (name == "config.json" and cmd != "inspect")
                     or (name == "tokenizer.json" and cmd in ("export-gguf", "export-ct",
                                                            "calibrate", "check"))
                     or cmd == "export-ct")
    if must and rc != 2:
        raise _h().Finding(f"{cmd}: {name} over its limit ({side.stat().st_size:,} bytes) "
                           f"was not refused (exit {rc})")
    if rc == 2:
        if "limit" in line and name not in line:
            raise _h().Finding(f"a size refusal that does not name {name}: {line[:300]}")
        if must and not ("limit" in line and name in line):
            raise _h().Finding(f"{cmd}: {name} over its limit refused for another reason: "
                               f"{line[:300]}")
        if out is not None and out.exists():
            raise _h().Finding(f"{cmd}: exit 2 but the output {out.name} was left")
        raise WorkbenchError(line)
    if cmd == "export-ct" and cfg_before is not None:
        cfg = json.loads((out / "config.json").read_text())
        if cfg.get("model_type") != cfg_before.get("model_type"):
            raise _h().Finding("compressed-tensors export wrote a config without the source's "
                               "model_type")


# ---- 5 r4-nesting ---------------------------------------------------------------------------
def exercise_nesting(path: str) -> None:
    spec = json.loads(Path(path).read_text())
    d = Path(path).parent
    if spec["where"] == "ct-target":
        ct = d / "ct"
        shutil.copytree(_tiny_ct(), ct)
        cfg = json.loads((ct / "config.json").read_text())
        for g in cfg["quantization_config"]["config_groups"].values():
            g["targets"] = list(spec["targets"]) + list(g["targets"])
        (ct / "config.json").write_text(json.dumps(cfg))
        t0 = time.process_time()
        rc, err = _h().cli(["diff", ct, ct])
        line = _outcome(rc, err, f"diff targets {spec['targets']}")
        if time.process_time() - t0 > 5:
            raise _h().Finding(f"diff took {time.process_time() - t0:.1f} s of CPU on targets "
                               f"{spec['targets']}")
        if rc == 2:
            if "config.json" not in line:
                raise _h().Finding(f"a bad target refused without naming config.json: {line}")
            raise WorkbenchError(line)
        return
    folder = _llama(d)
    calib = _calib(d)
    depth, style = spec["depth"], spec["style"]
    close = {"[": "]", '{"a":': "}"}[style]
    deep = style * depth + "1" + close * depth
    where = spec["where"]
    argv, out = _argv(spec["cmd"], folder, d, calib)
    if where == "plan":
        target = d / "deep-plan.json"
        target.write_text(json.dumps({"format": "quant-workbench-plan", "version": 1,
                                      "default": "q8_0", "rules": []})[:-1]
                          + ', "x": ' + deep + "}")
        out = d / "o.json"
        argv = ["export", folder, "--plan", target, "--format", "plan", "-o", out]
    else:
        target = folder / where
        _make_sidecar(folder, where)
        if where == "tokenizer.json":
            target.write_text('{"version": "1.0", "x": ' + deep + "}")
        else:
            target.write_text('{"x": ' + deep + "}")
    rc, err = _h().cli(argv)
    line = _outcome(rc, err, f"{spec['cmd']} {where} {depth} deep")
    if rc == 2:
        if "nested" in line and target.name not in line:
            raise _h().Finding(f"nesting refused without naming {target.name}: {line[:300]}")
        if out is not None and out.exists():
            raise _h().Finding(f"exit 2 but the output {out.name} was left")
        raise WorkbenchError(line)
    if depth > 64 and where in ("config.json", "model.safetensors.index.json") and \
            not (where == "config.json" and spec["cmd"] == "inspect"):
        raise _h().Finding(f"{spec['cmd']}: a {depth}-deep {where} was read (exit 0)")


# ---- 7 r4-messages --------------------------------------------------------------------------
def exercise_messages(path: str) -> None:
    spec = json.loads(Path(path).read_text())
    d = Path(path).parent
    kind = spec["kind"]
    if kind in ("budget-cut", "budget-empty"):
        import random
        import struct
        r = random.Random(spec["seed"])
        b = d / "budget.gguf"
        if kind == "budget-empty":
            b.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 0))
        else:
            raw = bytearray(_tiny_gguf().read_bytes())
            raw = raw[:max(4, int(len(raw) * spec["cut"]))]
            for _ in range(spec["flips"]):
                raw[r.randrange(4, len(raw))] = r.randrange(256) if len(raw) > 4 else 0
            b.write_bytes(bytes(raw))
        from workbench.formats.loaders import open_model
        try:
            m = open_model(b)
            inspect_refuses = not m.tensors
        except WorkbenchError:
            inspect_refuses = True
        from .hostile_config import tiny
        out = d / "p.json"
        rc, err = _h().cli(["allocate", tiny("llama"), "--budget-of", b, "--measure", "weight",
                            "--schemes", "q4_0,q8_0", "-o", out])
        line = _outcome(rc, err, "allocate --budget-of")
        if inspect_refuses and rc != 2:
            raise _h().Finding(f"--budget-of took a GGUF inspect refuses (exit {rc})")
        if inspect_refuses and (f"{b}: --budget-of:" not in line):
            raise _h().Finding(f"--budget-of refusal does not name the budget file: {line}")
        if rc == 2:
            if out.exists():
                raise _h().Finding("exit 2 but the plan was written")
            raise WorkbenchError(line)
        return
    if kind == "format-folder":
        from .hostile_config import tiny
        fmt, scheme = spec["fmt"], spec["scheme"]
        ext = {"gguf": ".gguf", "plan": ".json", "safetensors": ".safetensors",
               "llama-tensor-types": ".txt"}[fmt]
        old = os.getcwd()
        os.chdir(d)
        try:
            for name in (fmt, scheme):
                Path(name).mkdir(exist_ok=True)
            for sub in (fmt, scheme):
                for _ in range(2):           # a re-export replaces its own earlier output
                    rc, err = _h().cli(["export", tiny("llama"), "--scheme", scheme,
                                        "--format", fmt, "-o", f"{sub}/out{ext}"])
                    if rc != 0:
                        raise _h().Finding(f"export --format {fmt} --scheme {scheme} -o "
                                           f"{sub}/out{ext} with ./{fmt} and ./{scheme} "
                                           f"present: exit {rc}: {err[-300:]}")
        finally:
            os.chdir(old)
        return
    if kind == "padding":
        pad = d / "pad.gguf"
        shutil.copyfile(_tiny_gguf(), pad)
        os.truncate(pad, spec["pad"])
        from workbench.formats.loaders import open_model
        try:
            m = open_model(pad)
        except WorkbenchError as exc:
            raise _h().Finding(f"a valid GGUF with {spec['pad']:,} bytes of padding refused: "
                               f"{exc}") from None
        ref = open_model(_tiny_gguf())
        if list(m.tensors) != list(ref.tensors):
            raise _h().Finding("padded GGUF: other tensors")
        import numpy as np
        for n in list(m.tensors)[:4]:
            if not np.array_equal(np.asarray(m.raw(n)), np.asarray(ref.raw(n))):
                raise _h().Finding(f"padded GGUF: tensor {n} differs")
        return
    # full-disk: the ONNX export's traced file on /dev/full (ENOSPC)
    import workbench.core.atomic as atomic
    from .hostile_config import tiny
    real = atomic.make_temp_dir

    def full(directory, label):
        t = real(directory, label)
        os.symlink("/dev/full", t / "traced.onnx")
        return t
    atomic.make_temp_dir = full
    out = d / "o.onnx"
    try:
        rc, err = _h().cli(["export", tiny("llama"), "--scheme", spec["scheme"], "--format",
                            "onnx", "-o", out])
    finally:
        atomic.make_temp_dir = real
    line = _outcome(rc, err, "export onnx to a full disk")
    left = [p.name for p in d.iterdir() if "quant-workbench" in p.name or p.name == out.name]
    if rc != 2 or "ENOSPC" not in line or "trace" in line.split("ENOSPC")[0][-40:]:
        raise _h().Finding(f"ONNX export to a full disk: exit {rc}: {line[:300]}")
    if left:
        raise _h().Finding(f"ONNX export to a full disk left {left}")
    raise WorkbenchError(line)


# ---- 8 r4-leftovers -------------------------------------------------------------------------
def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def exercise_leftovers(path: str) -> None:
    spec = json.loads(Path(path).read_text())
    d = Path(path).parent
    kind = spec["kind"]
    if kind == "cluster":
        from workbench.jobs import cluster
        try:
            k, n = cluster.parse_spec(spec["cluster"])
        except WorkbenchError:
            raise
        if k == cluster.LOCAL:
            w, note = cluster.local_workers(n)
            c = cluster.cores()
            if not 1 <= w <= c:
                raise _h().Finding(f"--cluster {spec['cluster'][:40]}: {w} workers on {c} cores")
            if (n is not None and n > c) != (note is not None):
                raise _h().Finding(f"--cluster {spec['cluster'][:40]}: capped without a note "
                                   f"(or a note without a cap): {note}")
        return
    from .hostile_config import tiny
    work = d / "out"
    work.mkdir()
    fmt = spec["fmt"]
    ext = {"gguf": ".gguf", "onnx": ".onnx", "safetensors": ".safetensors"}[fmt]
    out = work / f"o{ext}"
    argv = ["export", tiny("llama"), "--scheme", "q8_0" if fmt != "onnx" else "q4_0",
            "--format", fmt, "-o", out]
    if kind == "kill":
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        p = subprocess.Popen([sys.executable, str(ROOT / "main.py"), *map(str, argv)], cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        t_end = time.monotonic() + spec["delay"]
        while time.monotonic() < t_end and p.poll() is None:
            time.sleep(0.02)
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, 9)
        p.wait()
        if out.exists() and fmt != "onnx":
            from workbench.formats.loaders import open_model
            try:
                open_model(out)        # a complete output, or none: never a partial one
            except WorkbenchError as exc:
                raise _h().Finding(f"kill -9 left a broken {out.name}: {exc}") from None
        keep = set()
    else:
        keep = set()
        gone = set()
        for e in spec["entries"]:
            if e == "dead-file":
                q = work / f".o{ext}.quant-workbench-{_dead_pid()}-ab12cd.tmp"
                q.write_bytes(b"x")
                gone.add(q.name)
            elif e == "dead-data":
                q = work / f".o{ext}.quant-workbench-{_dead_pid()}-zz99.data"
                q.write_bytes(b"x")
                gone.add(q.name)
            elif e == "dead-dir":
                q = work / f".o{ext}.quant-workbench-{_dead_pid()}-q1w2e3r4.tmp"
                q.mkdir()
                (q / "traced.onnx").write_bytes(b"x")
                gone.add(q.name)
            elif e == "live-dir":
                q = work / f".other.quant-workbench-{os.getpid()}-live0001.tmp"
                q.mkdir()
                keep.add(q.name)
            elif e == "legacy-old":
                q = work / ".qwb-onnx-k3j4h5g6"
                q.mkdir()
                old = time.time() - 7200
                os.utime(q, (old, old))
                gone.add(q.name)
            elif e == "legacy-fresh":
                q = work / ".qwb-onnx-a1b2c3d4"
                q.mkdir()
                keep.add(q.name)
            else:
                for n in (".qwb-onnx-mine", "notes.quant-workbench.txt", ".qwb-onnx-ABCDEFGH"):
                    (work / n).write_text("user file")
                    keep.add(n)
    rc, err = _h().cli(argv)
    line = _outcome(rc, err, f"export {fmt} after the leftovers")
    names = {p.name for p in work.iterdir()}
    stale = sorted(n for n in names - keep - {out.name}
                   if "quant-workbench" in n or n.startswith(".qwb-onnx"))
    if stale:
        raise _h().Finding(f"temporary files of killed runs left after the next export: "
                           f"{stale[:4]}")
    lost = sorted(keep - names)
    if lost:
        raise _h().Finding(f"the cleanup removed files it does not own: {lost}")
    if rc == 2:
        raise WorkbenchError(line)


EXERCISES = {"r4-outputs": exercise_outputs, "r4-sidecars": exercise_sidecars,
             "r4-nesting": exercise_nesting, "r4-messages": exercise_messages,
             "r4-leftovers": exercise_leftovers}

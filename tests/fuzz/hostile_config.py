"""What the fuzz worker does with issue 32's config.json kinds (tests/fuzz/cases_config.py), and
the folder mutations the tests share (tests/workbench/test_config_check.py).

A case is a JSON spec: a tiny generated architecture (tests/tiny_archs.py, built once per
worker), mutations of its config.json, tensors or tokenizer.json, and a command run in-process
through the CLI. Outcomes:

* exit 0 is correct only when no mutation contradicts the weights (`expect` "ok-or-2"); a
  contradicting folder that a command works on anyway is a *finding* (silently wrong output);
* exit 2 must be one line; for a config contradiction it must name config.json (or the GGUF)
  and no output may be left behind;
* anything else (exit 3, a hang, a signal, memory) is a failure, as in every kind.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np

from workbench.core.errors import WorkbenchError

_BUILT: dict[str, Path] = {}
_ROOT: Path | None = None


def _few_arenas() -> None:
    """These cases run whole networks (torch, onnxruntime threads) in the long-lived worker,
    whose limit is on address space: glibc's default of 8 malloc arenas per core, 64 MiB of
    address space each, would eat that limit over a run without any memory in use."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").mallopt(-8, 2)     # M_ARENA_MAX
    except (OSError, AttributeError):
        pass


_few_arenas()


def tiny(arch: str) -> Path:
    """The tiny `arch` folder (built once per process, never mutated)."""
    global _ROOT
    if arch not in _BUILT:
        from tests.tiny_archs import make_tiny
        if _ROOT is None:
            _ROOT = Path(tempfile.mkdtemp(prefix="qw-tiny-"))
        import contextlib
        import io
        with contextlib.redirect_stderr(io.StringIO()):   # transformers' progress bars
            _BUILT[arch] = make_tiny(arch, _ROOT / arch)
    return _BUILT[arch]


def _rewrite_tensors(folder: Path, edit) -> None:
    """model.safetensors rewritten with `edit(dict name -> array) -> dict`."""
    from workbench.export.st_writer import StreamingSafetensorsWriter
    from workbench.formats.loaders import open_model
    m = open_model(folder / "model.safetensors")
    arrays = {n: np.array(m.read(n)) for n in m.tensors}
    m.close()
    arrays = edit(arrays)
    tmp = folder / "model.safetensors.new"
    w = StreamingSafetensorsWriter(str(tmp))
    for n, a in arrays.items():
        w.add(n, np.ascontiguousarray(a, np.float32))
    w.finish()
    tmp.replace(folder / "model.safetensors")


def _fuse(arrays: dict, keep_per_expert: bool, container: str) -> dict:
    """Layer 0's per-expert gate/up/down stacked into 3-D fused tensors (transformers 5's
    layout), named under `container` ("mlp" or "block_sparse_moe")."""
    import re
    pat = re.compile(r"^(.*\.0\.(?:mlp|block_sparse_moe))\.experts\.(\d+)\.(\w+)\.weight$")
    groups: dict[str, dict[int, np.ndarray]] = {}
    pre = None
    for n, a in list(arrays.items()):
        m = pat.match(n)
        if m:
            pre = m.group(1).rsplit(".", 1)[0] + "." + container
            w = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}.get(m.group(3), m.group(3))
            groups.setdefault(w, {})[int(m.group(2))] = a
            if not keep_per_expert:
                del arrays[n]
    if pre is None:
        return arrays
    stack = {w: np.stack([g[i] for i in sorted(g)]) for w, g in groups.items()}
    arrays[f"{pre}.experts.gate_up_proj"] = np.concatenate([stack["gate_proj"],
                                                           stack["up_proj"]], axis=1)
    arrays[f"{pre}.experts.down_proj"] = stack["down_proj"]
    return arrays


def mutate(folder: Path, ops: list) -> None:
    """Apply mutation ops (lists) to the copied folder: ["set", key, value], ["del", key],
    ["add", name, shape], ["drop", substring], ["fuse", keep_per_expert, container],
    ["tok", what, value] (tokenizer.json)."""
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    tensors = []
    for op in ops:
        if op[0] == "set":
            cfg[op[1]] = op[2]
        elif op[0] == "del":
            cfg.pop(op[1], None)
        elif op[0] == "tok":
            tok_path = folder / "tokenizer.json"
            tok = json.loads(tok_path.read_text())
            what, value = op[1], op[2]
            if what == "raw":
                tok_path.write_text(value)
                continue
            if what == "added_id":
                tok.setdefault("added_tokens", []).append(
                    {"id": value, "content": "<hostile>", "special": True, "single_word": False,
                     "lstrip": False, "rstrip": False, "normalized": False})
            elif what == "vocab_id":
                k = next(iter(tok["model"]["vocab"]))
                tok["model"]["vocab"][k] = value
            elif what == "model":
                tok["model"] = value
            elif what == "merges":
                tok["model"]["merges"] = value
            elif what == "added":
                tok["added_tokens"] = value
            tok_path.write_text(json.dumps(tok))
        else:
            tensors.append(op)
    cfg_path.write_text(json.dumps(cfg, allow_nan=True))
    if tensors:
        def edit(arrays):
            for op in tensors:
                if op[0] == "add":
                    arrays[op[1]] = np.zeros(op[2], np.float32)
                elif op[0] == "drop":
                    for n in [n for n in arrays if op[1] in n]:
                        del arrays[n]
                elif op[0] == "fuse":
                    arrays = _fuse(arrays, op[1], op[2])
            return arrays
        _rewrite_tensors(folder, edit)


def hostile_folder(arch: str, ops: list, where: Path, src: Path | None = None) -> Path:
    """A copy of the tiny `arch` (or of `src`) in `where`/m, mutated by `ops`."""
    folder = where / "m"
    shutil.copytree(src or tiny(arch), folder)
    mutate(folder, ops)
    return folder


# ---- a GGUF whose metadata may contradict its tensors ---------------------------------------
def moe_gguf(path: Path, *, block_count=2, expert_count=4, used=2, n_exp_tensor=4,
             embd=32, heads=4, kv=2, vocab=64, n_blk_tensors=2) -> Path:
    """A small qwen3moe GGUF (float tensors, 3-D expert tensors) with the given metadata."""
    import gguf
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    w.add_block_count(block_count)
    w.add_embedding_length(embd)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_expert_count(expert_count)
    w.add_expert_used_count(used)
    w.add_vocab_size(vocab)
    hd = 32 // 4

    def t(name, shape):
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    t("token_embd.weight", (64, 32))
    for i in range(n_blk_tensors):
        t(f"blk.{i}.attn_norm.weight", (32,))
        t(f"blk.{i}.attn_q.weight", (4 * hd, 32))
        t(f"blk.{i}.attn_k.weight", (2 * hd, 32))
        t(f"blk.{i}.attn_v.weight", (2 * hd, 32))
        t(f"blk.{i}.attn_output.weight", (32, 4 * hd))
        t(f"blk.{i}.ffn_gate_inp.weight", (n_exp_tensor, 32))
        t(f"blk.{i}.ffn_gate_exps.weight", (n_exp_tensor, 32, 32))
        t(f"blk.{i}.ffn_up_exps.weight", (n_exp_tensor, 32, 32))
        t(f"blk.{i}.ffn_down_exps.weight", (n_exp_tensor, 32, 32))
    t("output_norm.weight", (32,))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ---- the command run on the folder ----------------------------------------------------------
def command(cmd: str, folder: Path, out_dir: Path) -> tuple[list, Path | None]:
    """(argv, output path or None)."""
    calib = out_dir / "c.txt"
    if not calib.exists():
        calib.write_text("the quick brown fox jumps over the lazy dog\nhello world again\n")
    out = {"check": None, "calibrate": out_dir / "im.gguf", "allocate": out_dir / "plan.json",
           "export-gguf": out_dir / "o.gguf", "export-ct": out_dir / "ct",
           "export-onnx": out_dir / "o.onnx", "sensitivity": None,
           "gguf-gguf": out_dir / "o2.gguf"}[cmd]
    argv = {
        "check": ["check", folder, "--scheme", "q8_0", "--calib", calib, "--samples", "2"],
        "calibrate": ["calibrate", folder, "--calib", calib, "--samples", "2", "-o", out],
        "allocate": ["allocate", folder, "--budget-bpw", "6", "--schemes", "q4_0,q8_0",
                     "--measure", "weight", "-o", out],
        "sensitivity": ["sensitivity", folder, "--measure", "fisher", "--schemes", "q8_0",
                        "--calib", calib, "--samples", "2"],
        "export-gguf": ["export", folder, "--scheme", "q8_0", "--format", "gguf", "-o", out],
        "export-ct": ["export", folder, "--scheme", "int4-g32", "--format",
                      "compressed-tensors", "-o", out],
        "export-onnx": ["export", folder, "--scheme", "int4-g32", "--format", "onnx",
                        "-o", out],
        "gguf-gguf": ["export", folder, "--scheme", "q8_0", "--format", "gguf", "-o", out],
    }[cmd]
    return argv, out


def run_case(spec: dict, where: Path) -> None:
    """run_case with file descriptor 1 sent to /dev/null: a library writing to the real
    stdout (not sys.stdout) would break the worker's one-JSON-line-per-case protocol."""
    import os
    import sys
    sys.stdout.flush()
    saved = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        _run_case(spec, where)
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)


def _run_case(spec: dict, where: Path) -> None:
    """Carry out one spec; returns for exit 0, raises WorkbenchError for a clean exit 2 and
    Finding for anything else (see the module's doc)."""
    from .hostile import Finding, cli      # (hostile.py imports this module)
    if spec["cmd"] == "gguf-gguf":
        folder = moe_gguf(where / "src.gguf", **spec.get("gguf", {}))
        name = folder.name
    else:
        folder = hostile_folder(spec["arch"], spec["ops"], where)
        name = "config.json"
    argv, out = command(spec["cmd"], folder, where)
    extra = spec.get("argv") or []
    if extra and spec["cmd"] == "allocate":
        argv = [a for a in argv if a not in ("--budget-bpw", "6")] + extra
    rc, err = cli(argv)
    line = err.strip().splitlines()[-1] if err.strip() else ""
    if rc not in (0, 2):
        raise Finding(f"{spec['cmd']} {spec.get('ops', spec.get('gguf'))}: exit {rc}: "
                      f"{err[-700:]}")
    if rc == 2:
        # progress lines ("check: 0.0% tokenizing ...") may come first; the error is one line
        errors = [x for x in err.strip().splitlines() if not x.startswith(f"{argv[0]}: ")
                  and not x.lstrip().startswith(("[", "usage:")) and "%" not in x[:40]]
        if len(errors) > 1 and "usage:" not in err:
            raise Finding(f"exit 2 with more than one line: {err[-400:]!r}")
        if out is not None and out.exists():
            raise Finding(f"{spec['cmd']}: exit 2 but the output {out.name} was left")
        if spec.get("contradicts") and name not in line and "tokenizer.json" not in line \
                and "llama.cpp name" not in line:
            raise Finding(f"a contradiction refused without naming {name}: {line[:300]}")
        raise WorkbenchError(line)
    if spec.get("contradicts"):
        raise Finding(f"{spec['cmd']} worked on a folder its config contradicts "
                      f"({spec.get('ops', spec.get('gguf'))}): exit 0")


def _exercise(path: str) -> None:
    spec = json.loads(Path(path).read_text())
    run_case(spec, Path(path).parent)


EXERCISES = {"config-tensors": _exercise, "config-counts": _exercise,
             "config-values": _exercise}

"""Issue 20 (hardening round 3): one test group per class of defect. The fuzz suite
(tests/fuzz, kinds outputs ... optional) repeats each with generated inputs."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from workbench.core.errors import WorkbenchError

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "resources" / "demo_model"


def _cli(*argv, cwd=None):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, str(ROOT / "main.py"), *map(str, argv)], env=env,
                       capture_output=True, text=True, cwd=cwd, timeout=600)
    return r.returncode, r.stderr


def _plan(path: Path) -> Path:
    path.write_text(json.dumps({"format": "quant-workbench-plan", "version": 1,
                                "default": "q8_0", "rules": []}))
    return path


def _model(folder: Path, tensors=None) -> Path:
    from workbench.export.st_writer import StreamingSafetensorsWriter
    folder.mkdir(parents=True, exist_ok=True)
    w = StreamingSafetensorsWriter(str(folder / "model.safetensors"))
    rng = np.random.default_rng(0)
    for name, shape in (tensors or [("blk.0.attn_q.weight", (8, 64)),
                                    ("blk.0.ffn_up.weight", (16, 64))]):
        w.add(name, rng.standard_normal(shape).astype(np.float32))
    w.finish()
    return folder / "model.safetensors"


# ---- 1: an output never names an input ---------------------------------------------------
@pytest.mark.parametrize("how", ["same", "symlink", "hardlink"])
def test_output_naming_the_plan_is_refused_before_writing(tmp_path, how):
    from workbench.cli import main
    model = _model(tmp_path / "m")
    plan = _plan(tmp_path / "plan.json")
    before = plan.read_bytes()
    out = {"same": plan, "symlink": tmp_path / "l.json", "hardlink": tmp_path / "h.json"}[how]
    if how == "symlink":
        out.symlink_to(plan)
    elif how == "hardlink":
        os.link(plan, out)
    rc = main(["export", str(model), "--plan", str(plan), "--format", "gguf", "-o", str(out)])
    assert rc == 2
    assert plan.read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if "quant-workbench" in p.name]


def test_every_file_argument_is_checked(tmp_path, capsys):
    """imatrix, calibration file, a model's companion file, a folder holding an input."""
    from workbench.cli import main
    model = _model(tmp_path / "m")
    (tmp_path / "m" / "config.json").write_text("{}")
    imx = tmp_path / "x.dat"
    imx.write_bytes(struct.pack("<i", 0))
    calib = tmp_path / "c.txt"
    calib.write_text("hello\n")
    cases = [
        ["export", model, "--scheme", "q4_0", "--format", "gguf", "--method", "imatrix",
         "--imatrix", imx, "-o", imx],
        ["calibrate", model, "--calib", calib, "-o", calib],
        ["export", model, "--scheme", "q8_0", "--format", "plan", "-o",
         tmp_path / "m" / "config.json"],
        ["export", model, "--scheme", "q8_0", "--format", "compressed-tensors", "-o",
         tmp_path / "m"],
        ["allocate", model, "--budget-bpw", "6", "-o", model],
    ]
    for argv in cases:
        snapshot = {p: p.read_bytes() for p in (imx, calib, model, tmp_path / "m" / "config.json")}
        assert main([str(a) for a in argv]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "nothing was written" in err, err
        assert all(p.read_bytes() == b for p, b in snapshot.items())


def test_a_fresh_output_still_works(tmp_path):
    from workbench.cli import main
    model = _model(tmp_path / "m")
    plan = _plan(tmp_path / "plan.json")
    assert main(["export", str(model), "--plan", str(plan), "--format", "plan",
                 "-o", str(tmp_path / "out.json")]) == 0


def test_refuse_inputs_as_outputs_names_both(tmp_path):
    from workbench.core.outputs import refuse_inputs_as_outputs
    a = tmp_path / "a.json"
    a.write_text("{}")
    (tmp_path / "b.json").symlink_to(a)
    with pytest.raises(WorkbenchError, match=r"--output is the same file as the input --plan"):
        refuse_inputs_as_outputs({"--output": str(tmp_path / "b.json")}, {"--plan": str(a)})
    refuse_inputs_as_outputs({"--output": str(tmp_path / "new.json")}, {"--plan": str(a)})


# ---- 2: self-referencing containers in a PyTorch checkpoint ------------------------------
@pytest.mark.parametrize("kind", ["self", "wrapper", "mutual", "fanout"])
def test_self_referencing_pickles_are_refused_quickly(tmp_path, kind):
    import torch

    from workbench.formats.loaders import open_model
    t = torch.ones(2, 2)
    if kind == "self":
        d = {"w": t}
        d["x"] = d
    elif kind == "wrapper":
        d = {"w": t}
        d["state_dict"] = d
    elif kind == "mutual":
        a, b = {"w": t}, {"v": t}
        a["b"], b["a"] = b, a
        d = {"model": a}
    else:
        d = {"t": t}
        for _ in range(40):
            d = {"a": d, "b": d}
    p = tmp_path / "m.pt"
    torch.save(d, p)
    t0 = time.process_time()
    with pytest.raises(WorkbenchError, match="itself|cycle|shared"):
        open_model(p)
    assert time.process_time() - t0 < 5.0


# ---- 3: imatrix files read with bounds, errors naming the imatrix ------------------------
def _dat(entries) -> bytes:
    out = struct.pack("<i", len(entries))
    for name, ncall, vals in entries:
        nb = name.encode()
        out += struct.pack("<i", len(nb)) + nb + struct.pack("<ii", ncall, len(vals))
        out += np.asarray(vals, "<f4").tobytes()
    return out


def test_imatrix_dat_roundtrip_and_corruptions(tmp_path):
    from workbench.running.imatrix import read_imatrix
    good = _dat([("blk.0.attn_q.weight", 4, np.full(64, 8.0))])
    p = tmp_path / "x.dat"
    p.write_bytes(good)
    np.testing.assert_allclose(read_imatrix(p)["blk.0.attn_q.weight"], np.full(64, 2.0))
    bad = {
        "count": struct.pack("<i", 2**31 - 1) + good[4:],
        "name": good[:4] + struct.pack("<i", 2**30) + good[8:],
        "nval": good[:4 + 4 + 19 + 4] + struct.pack("<i", 2**30) + good[4 + 4 + 19 + 8:],
        "truncated": good[:-9],
        "nan": _dat([("a", 1, [1.0, float("nan")])]),
        "negative": _dat([("a", 1, [1.0, -2.0])]),
    }
    for why, raw in bad.items():
        p.write_bytes(raw)
        with pytest.raises(WorkbenchError) as e:
            read_imatrix(p)
        assert str(p) in str(e.value), (why, str(e.value))


def test_imatrix_gguf_must_be_an_imatrix_of_f32_sums(tmp_path):
    import gguf

    from workbench.running.imatrix import check_imatrix_for, read_imatrix
    from workbench.formats.model import Model, TensorInfo

    def write(kind, dtype=np.float32):
        p = tmp_path / f"{kind}-{np.dtype(dtype).name}.gguf"
        w = gguf.GGUFWriter(str(p), arch="")
        w.add_type(kind)
        w.add_tensor("blk.0.attn_q.weight.in_sum2", np.full((1, 64), 6.0, dtype))
        w.add_tensor("blk.0.attn_q.weight.counts", np.full((1, 1), 3.0, np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return p

    im = read_imatrix(write("imatrix"))
    np.testing.assert_allclose(im["blk.0.attn_q.weight"], np.full(64, 2.0))
    for p, match in ((write("model"), "not an imatrix"), (write("imatrix", np.float16),
                                                          "expected F32")):
        with pytest.raises(WorkbenchError, match=match) as e:
            read_imatrix(p)
        assert str(p) in str(e.value)
    info = TensorInfo("blk.0.attn_q.weight", (8, 32), "F32", 1024, "model.safetensors")
    m = Model("model.safetensors", "safetensors", {info.name: info}, lambda n: None, {})
    with pytest.raises(WorkbenchError, match="64 values for a tensor of 32") as e:
        check_imatrix_for(m, "x.gguf", info.name, im[info.name])
    assert "x.gguf" in str(e.value)


# ---- 4: calibration inputs -------------------------------------------------------------
def _calib(path):
    from workbench.running.calibration import calibration_samples
    from workbench.formats.loaders import open_model
    from workbench.core.progress import run
    return run(calibration_samples(open_model(DEMO), path, None, 128))


def test_calibration_inputs_are_bounded_and_named(tmp_path):
    huge = tmp_path / "huge.npy"
    h = "{'descr': '<i8', 'fortran_order': False, 'shape': (100000000000,), }"
    h += " " * ((64 - (10 + len(h) + 1) % 64) % 64) + "\n"
    huge.write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode() + b"\0" * 64)
    oov = tmp_path / "oov.npy"
    np.save(oov, np.array([[1, 2, 512]], np.int64))   # the demo model's vocabulary is 512
    neg = tmp_path / "neg.npy"
    np.save(neg, np.array([1, -3], np.int64))
    longline = tmp_path / "long.txt"
    longline.write_text("a" * (3 << 20) + "\nhello\n")
    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 100000 + "]" * 100000 + "\n")
    for p, match in ((huge, "claims 100,000,000,000"), (oov, "outside the model's vocabulary"),
                     (neg, "negative token id|outside"), (longline, "characters long"),
                     (deep, "not JSON")):
        with pytest.raises(WorkbenchError, match=match) as e:
            _calib(p)
        assert str(p) in str(e.value) and "\n" not in str(e.value)
    ok = tmp_path / "ok.npy"
    np.save(ok, np.arange(300, dtype=np.int64) % 512)
    assert sum(len(s) for s in _calib(ok)) == 300


# ---- 5: the tool's own outputs at their edges ------------------------------------------
def test_zero_row_tensor_exported_to_gguf_evaluates(tmp_path):
    from workbench.cli import main
    src = _model(tmp_path / "m", [("blk.0.attn_q.weight", (0, 32)),
                                  ("blk.0.ffn_up.weight", (4, 32))])
    out = tmp_path / "z.gguf"
    assert main(["export", str(src), "--scheme", "q8_0", "--format", "gguf", "-o", str(out)]) == 0
    from workbench.quant.evaluate import evaluate
    from workbench.formats.loaders import open_model
    from workbench.quant.plan import Plan
    from workbench.core.progress import run
    m = open_model(out)
    assert m.read_matrix("blk.0.attn_q.weight").shape == (0, 32)
    ev = run(evaluate(m, Plan(default="q4_0")))
    assert set(ev.tensors) == {"blk.0.attn_q.weight", "blk.0.ffn_up.weight"}


def test_lone_surrogate_name_is_a_clean_gguf_refusal(tmp_path):
    src = _model(tmp_path / "m", [("blk.0.attn_q.weight\udc80", (4, 32))])
    rc, err = _cli("export", src, "--scheme", "q8_0", "--format", "gguf", "-o", tmp_path / "o.gguf")
    assert rc == 2 and "lone surrogate" in err and err.count("\n") == 1
    rc, _ = _cli("export", src, "--scheme", "q8_0", "--format", "safetensors",
                 "-o", tmp_path / "o.safetensors")
    assert rc == 0
    rc, _ = _cli("inspect", tmp_path / "o.safetensors")
    assert rc == 0


# ---- 6: GGUF offsets that break the alignment --------------------------------------------
def test_misaligned_gguf_offset_is_refused_with_the_tensor(tmp_path):
    from workbench.formats.loaders import open_model

    def gstr(b):
        return struct.pack("<Q", len(b)) + b

    def write(shift):
        data = np.arange(64, dtype=np.float32).tobytes()
        head = b"GGUF" + struct.pack("<IQQ", 3, 1, 1)
        head += gstr(b"general.architecture") + struct.pack("<I", 8) + gstr(b"llama")
        head += gstr(b"blk.0.attn_q.weight") + struct.pack("<I", 2) + struct.pack("<2Q", 32, 2)
        head += struct.pack("<IQ", 0, shift)
        head += b"\0" * ((-len(head)) % 32)
        body = bytearray(96 + shift)
        body[shift:shift + len(data)] = data
        p = tmp_path / f"s{shift}.gguf"
        p.write_bytes(head + bytes(body))
        return p

    m = open_model(write(0))
    np.testing.assert_array_equal(m.read_matrix("blk.0.attn_q.weight").reshape(-1),
                                  np.arange(64, dtype=np.float32))
    for shift in (4, 16):
        with pytest.raises(WorkbenchError, match="breaks the file's 32-byte alignment") as e:
            open_model(write(shift))
        assert "blk.0.attn_q.weight" in str(e.value)


# ---- 7: the input truncated under a running export ---------------------------------------
TRUNCATE = """
import os, sys, numpy as np, torch
from workbench.core.errors import WorkbenchError
from workbench.export import export
from workbench.export.st_writer import StreamingSafetensorsWriter
from workbench.formats.loaders import open_model
from workbench.quant.plan import Plan
from workbench.core.progress import run
d, kind = sys.argv[1], sys.argv[2]
src = os.path.join(d, "src.safetensors")
w = StreamingSafetensorsWriter(src)
for i in range(4):
    w.add(f"blk.{i}.ffn_up.weight", np.ones((64, 256), np.float32))
w.finish()
if kind == "gguf":
    run(export(open_model(src), Plan(default="fp16"), "gguf", os.path.join(d, "src.gguf")))
    src = os.path.join(d, "src.gguf")
elif kind == "pytorch":
    torch.save({f"blk.{i}.ffn_up.weight": torch.ones(64, 256) for i in range(4)},
               os.path.join(d, "src.pt"))
    src = os.path.join(d, "src.pt")
m = open_model(src)
os.truncate(src, os.path.getsize(src) // 2)
try:
    run(export(m, Plan(default="q8_0"), "gguf", os.path.join(d, "out.gguf")))
    print("EXPORTED")
except WorkbenchError as exc:
    print("ERROR", exc)
"""


@pytest.mark.parametrize("kind", ["safetensors", "gguf", "pytorch"])
def test_input_truncated_under_export_is_an_error_not_sigbus(tmp_path, kind):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", TRUNCATE, str(tmp_path), kind], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]          # a SIGBUS would be -7
    assert r.stdout.startswith("ERROR") and "truncated or replaced" in r.stdout
    assert f"src.{'pt' if kind == 'pytorch' else kind}" in r.stdout
    assert not (tmp_path / "out.gguf").exists()
    assert not [p for p in tmp_path.iterdir() if "quant-workbench" in p.name]


# ---- 8: linear cost on large headers and plans ---------------------------------------
def _header(n: int) -> bytes:
    h = {f"t{i}": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]} for i in range(n)}
    b = json.dumps(h).encode()
    return len(b).to_bytes(8, "little") + b


def _cpu(fn, repeat=3) -> float:
    """Best CPU time of `repeat` runs, with the cyclic garbage collector off: its full
    collections cost in proportion to everything the test session holds, not to `fn`'s work
    (in a full pytest run they made a linear parse look 12x slower at 4x the size)."""
    import gc
    best = float("inf")
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeat):
            t0 = time.process_time()
            fn()
            best = min(best, time.process_time() - t0)
    finally:
        gc.enable()
    return best


def test_header_parse_is_linear():
    """4x the tensors costs about 4x (quadratic would be 16x): generous bound 8x."""
    from workbench.formats.loaders.safetensors_format import parse_header
    small, big = _header(10_000), _header(40_000)
    t1 = _cpu(lambda: parse_header(small, len(small), "s"))
    t4 = _cpu(lambda: parse_header(big, len(big), "b"))
    assert t4 < 8 * t1 + 0.05, (t1, t4)


def test_plan_rules_resolve_in_one_pass():
    """Resolving names costs one RE2 set match each whatever the number of rules."""
    from workbench.quant.plan import Plan

    def plan(n):
        return Plan.from_dict({"format": "quant-workbench-plan", "version": 1, "default": "q8_0",
                               "rules": [{"match": f"re:layers\\.{i}\\.mlp", "scheme": "q4_0"}
                                         for i in range(n)]})
    names = [f"model.layers.{i}.mlp.up_proj.weight" for i in range(0, 2000, 7)]
    p1, p4 = plan(2_000), plan(8_000)
    assert p4.rule_for("model.layers.7999.mlp.x").match == "re:layers\\.7999\\.mlp"
    assert p4.rule_for("model.layers.1.mlp.x").match == "re:layers\\.1\\.mlp"   # first wins
    assert p4.rule_for("nothing") is None
    t1 = _cpu(lambda: [p1.rule_for(n) for n in names])
    t4 = _cpu(lambda: [p4.rule_for(n) for n in names])
    assert t4 < 3 * t1 + 0.05, (t1, t4)


def test_bad_pattern_among_many_names_its_rule(tmp_path):
    rules = [{"match": f"re:a{i}", "scheme": "q4_0"} for i in range(50)]
    rules.insert(20, {"match": "re:(x", "scheme": "q4_0"})
    p = tmp_path / "p.json"
    p.write_text(json.dumps({"format": "quant-workbench-plan", "version": 1, "default": "q8_0",
                             "rules": rules}))
    from workbench.quant.plan import Plan
    with pytest.raises(WorkbenchError, match=r"rule 're:\(x'") as e:
        Plan.load(p)
    assert str(p) in str(e.value)


# ---- 9: a missing optional dependency ------------------------------------------------
MISSING = """
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None
from workbench.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("modules,argv,extra", [
    ("compressed_tensors,compressed_tensors.quantization",
     ["export", str(DEMO), "--scheme", "int4-g32", "--format", "compressed-tensors", "-o",
      "{tmp}/ct"], "[vllm]"),
    ("transformers", ["check", str(DEMO), "--scheme", "q8_0"], "[model]"),
    ("tokenizers", ["calibrate", str(DEMO), "-o", "{tmp}/im.gguf"], "[model]"),
])
def test_missing_optional_dependency_is_one_line_exit_2(tmp_path, modules, argv, extra):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", MISSING, modules,
                        *[a.format(tmp=tmp_path) for a in argv]], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 2, r.stderr[-1500:]
    assert r.stderr.count("\n") == 1 and extra in r.stderr and "not installed" in r.stderr


def test_require_and_missing_from():
    from workbench.core.optional import missing_from, require
    assert require("json").dumps([1]) == "[1]"
    with pytest.raises(WorkbenchError, match=r"quant-workbench\[onnx\]"):
        require("onnx_not_here_for_test", "onnx")
    try:
        try:
            raise ModuleNotFoundError("No module named 'tokenizers'", name="tokenizers")
        except ImportError as inner:
            raise ModuleNotFoundError("Could not import module 'X'") from inner
    except ImportError as exc:
        assert "[model]" in missing_from(exc)
    assert missing_from(ImportError("other", name="zzz")) is None

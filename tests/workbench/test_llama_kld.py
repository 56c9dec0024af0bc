"""workbench.export.llama_kld without llama.cpp: the parser on captured llama-perplexity output, the
child-process runner (timeout, closing the job kills the child's process group), and the
bench's argument checks. The runs themselves are tested in tests/runtime/test_llama_kld_runtime.py."""

from __future__ import annotations

import math
import os
import sys
import time

import pytest

from workbench.export import llama_kld as lk
from workbench.bench.race import prepare_out_dir, split_args
from workbench.bench.vs_llama import parse_types
from workbench.core.errors import WorkbenchError
from workbench.core.progress import run

# `llama-perplexity -m demo-q4_0.gguf -c 64 -t 2 --kl-divergence-base base.kld --kl-divergence`
# on the demo model (resources/demo_model, our F16 / Q4_0 exports), the first 6000 bytes of
# resources/calibration.txt as the text; llama.cpp of llama-cpp-python 0.3.36, 2026-11-27
KLD_RUN = """0.00.019.080 W llama_context: n_ctx is not divisible by n_seq_max - rounding down to 8192
0.00.042.993 I cmn          init: llama threadpool init, n_threads = 2
0.00.053.180 W llama_perplexity: model was trained on only 512 context tokens (2048 specified)
0.00.053.200 I 
0.00.053.320 I system_info: n_threads = 2 (n_threads_batch = 2) / 2 | CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | 
0.00.053.477 I kl_divergence: computing over 37 chunks, n_ctx=64, batch_size=2048, n_seq=32
0.00.547.297 I kl_divergence: 0.49 seconds per pass - ETA 0.00 minutes

chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p
   1      68.9772 ±   53.2135      -0.04629 ±    0.16378       0.13146 ±    0.03840     5.615 ±  1.739 %    67.742 ±  8.535 %
   2      90.6358 ±   50.8563       0.09352 ±    0.12377       0.13040 ±    0.02388     6.672 ±  1.260 %    80.645 ±  5.058 %
   3     185.6279 ±   90.3120       0.16161 ±    0.09948       0.18640 ±    0.03304    10.572 ±  3.667 %    78.495 ±  4.284 %
   4     105.1667 ±   46.6578       0.14468 ±    0.09482       0.16487 ±    0.02701    11.039 ±  2.921 %    82.258 ±  3.445 %
   5      73.6813 ±   28.6754       0.16162 ±    0.07986       0.16029 ±    0.02513    12.170 ±  2.630 %    83.226 ±  3.011 %
   6      92.8460 ±   32.9282       0.13712 ±    0.07057       0.15353 ±    0.02144    12.006 ±  2.270 %    81.720 ±  2.842 %
   7     111.2805 ±   37.3164       0.12990 ±    0.06928       0.15406 ±    0.01947    11.658 ±  2.027 %    82.488 ±  2.586 %
   8     100.5875 ±   31.6171       0.12614 ±    0.06208       0.14506 ±    0.01735    11.198 ±  1.860 %    84.274 ±  2.316 %
   9      80.1311 ±   23.2897       0.13297 ±    0.05582       0.14280 ±    0.01577    11.335 ±  1.664 %    83.871 ±  2.206 %
  10      70.0141 ±   19.1216       0.12538 ±    0.05193       0.14205 ±    0.01491    11.014 ±  1.549 %    84.194 ±  2.075 %
  11      59.1796 ±   15.3841       0.11092 ±    0.04826       0.13943 ±    0.01416    10.971 ±  1.463 %    84.751 ±  1.950 %
  12      62.3930 ±   15.4826       0.11673 ±    0.04626       0.14253 ±    0.01393    10.732 ±  1.375 %    84.409 ±  1.883 %
  13      59.1754 ±   14.2073       0.11401 ±    0.04311       0.13649 ±    0.01306    10.391 ±  1.314 %    85.112 ±  1.775 %
  14      56.9747 ±   13.2180       0.10995 ±    0.04088       0.13679 ±    0.01296    10.417 ±  1.250 %    85.253 ±  1.704 %
  15      57.4683 ±   12.9195       0.09682 ±    0.03928       0.13530 ±    0.01231    10.244 ±  1.191 %    85.376 ±  1.640 %
  16      59.5369 ±   13.1691       0.09772 ±    0.03766       0.13261 ±    0.01172    10.117 ±  1.138 %    85.484 ±  1.583 %
  17      67.2328 ±   14.5835       0.09782 ±    0.03596       0.13335 ±    0.01143     9.880 ±  1.098 %    85.009 ±  1.556 %
  18      61.2227 ±   12.8506       0.10120 ±    0.03441       0.12941 ±    0.01088     9.749 ±  1.057 %    85.663 ±  1.485 %
  19      64.4655 ±   13.2608       0.11033 ±    0.03483       0.13086 ±    0.01086     9.715 ±  1.014 %    86.078 ±  1.428 %
  20      74.9608 ±   15.2350       0.10833 ±    0.03380       0.12926 ±    0.01042     9.639 ±  0.983 %    85.645 ±  1.409 %
  21      68.7778 ±   13.6224       0.10176 ±    0.03233       0.12515 ±    0.00998     9.498 ±  0.953 %    86.022 ±  1.360 %
  22      70.9721 ±   13.7944       0.10241 ±    0.03150       0.12587 ±    0.00990     9.459 ±  0.927 %    86.217 ±  1.321 %
  23      68.1805 ±   12.9265       0.10163 ±    0.03042       0.12434 ±    0.00954     9.304 ±  0.902 %    86.396 ±  1.285 %
  24      68.7348 ±   12.7533       0.10608 ±    0.02997       0.12574 ±    0.00993     9.614 ±  0.940 %    86.559 ±  1.251 %
  25      67.8298 ±   12.3979       0.11210 ±    0.03030       0.12482 ±    0.00962     9.557 ±  0.911 %    86.839 ±  1.215 %
  26      72.5823 ±   13.0029       0.11237 ±    0.02957       0.12469 ±    0.00930     9.511 ±  0.884 %    86.600 ±  1.201 %
  27      71.0490 ±   12.4910       0.11488 ±    0.02885       0.12555 ±    0.00942    10.033 ±  0.946 %    86.858 ±  1.169 %
  28      70.4157 ±   12.1312       0.11869 ±    0.02815       0.12480 ±    0.00916    10.152 ±  0.924 %    86.982 ±  1.143 %
  29      69.7529 ±   11.8501       0.11094 ±    0.02742       0.12230 ±    0.00888     9.995 ±  0.907 %    87.208 ±  1.115 %
  30      73.0781 ±   12.2212       0.10192 ±    0.02764       0.12474 ±    0.00880     9.919 ±  0.885 %    87.204 ±  1.096 %
  31      79.5358 ±   13.1427       0.09436 ±    0.02717       0.12396 ±    0.00855     9.903 ±  0.866 %    87.201 ±  1.078 %
  32      81.4125 ±   13.2446       0.09452 ±    0.02762       0.12817 ±    0.00862     9.855 ±  0.845 %    86.895 ±  1.072 %
  33      81.3002 ±   13.0330       0.08890 ±    0.02690       0.12611 ±    0.00838     9.747 ±  0.829 %    87.195 ±  1.045 %
  34      83.8540 ±   13.2479       0.08503 ±    0.02648       0.12926 ±    0.00898     9.604 ±  0.817 %    87.002 ±  1.036 %
  35      80.4748 ±   12.4941       0.08471 ±    0.02582       0.12743 ±    0.00875     9.527 ±  0.801 %    87.189 ±  1.015 %
  36      79.3800 ±   12.1643       0.08505 ±    0.02589       0.12632 ±    0.00854     9.527 ±  0.782 %    87.366 ±  0.995 %
  37      82.4815 ±   12.5347       0.08957 ±    0.02571       0.12509 ±    0.00836     9.452 ±  0.768 %    87.533 ±  0.976 %

====== Perplexity statistics ======
Mean PPL(Q)                   :  82.481468 ±  12.534676
Mean PPL(base)                :  75.414619 ±  11.251622
Cor(ln(PPL(Q)), ln(PPL(base))):  98.56%
Mean ln(PPL(Q)/PPL(base))     :   0.089572 ±   0.025714
Mean PPL(Q)/PPL(base)         :   1.093707 ±   0.028124
Mean PPL(Q)-PPL(base)         :   7.066849 ±   2.389838

====== KL divergence statistics ======
Mean    KLD:   0.125087 ±   0.008359
Maximum KLD:   3.956771
99.9%   KLD:   2.842485
99.0%   KLD:   1.358255
95.0%   KLD:   0.548841
90.0%   KLD:   0.329492
Median  KLD:   0.028402
10.0%   KLD:   0.000039
 5.0%   KLD:   0.000013
 1.0%   KLD:   0.000001
 0.1%   KLD:  -0.000000
Minimum KLD:  -0.000001

====== Token probability statistics ======
Mean    Δp: -0.883 ± 0.278 %
Maximum Δp: 59.337%
99.9%   Δp: 52.762%
99.0%   Δp: 29.000%
95.0%   Δp:  6.985%
90.0%   Δp:  1.190%
75.0%   Δp:  0.012%
Median  Δp: -0.000%
25.0%   Δp: -0.174%
10.0%   Δp: -4.847%
 5.0%   Δp: -13.547%
 1.0%   Δp: -36.159%
 0.1%   Δp: -83.777%
Minimum Δp: -89.205%
RMS Δp    :  9.452 ± 0.768 %
Same top p: 87.533 ± 0.976 %

"""

# the base run (`-f TEXT --kl-divergence-base base.kld`): its last lines
BASE_RUN = """0.00.071.476 I perplexity: calculating perplexity over 37 chunks, n_ctx=64, batch_size=2048, n_seq=32
0.00.537.916 I perplexity: 0.47 seconds per pass - ETA 0.00 minutes
[1]72.2445,[2]82.5433,[3]157.9267,[4]95.1223,[5]64.9470,[6]83.5393,[7]100.8016,[8]91.1057,[9]71.8664,[10]63.1186,[11]54.0219,[12]56.5324,[13]53.7712,[14]52.2525,[15]53.4621,[16]55.4382,[17]62.6414,[18]56.7641,[19]59.4120,[20]69.2453,[21]63.8639,[22]65.9578,[23]63.6261,[24]63.8687,[25]63.1177,[26]67.4175,[27]65.8044,[28]64.8810,[29]64.6885,[30]68.3951,[31]74.9762,[32]76.8389,[33]77.1367,[34]79.7835,[35]76.5157,[36]75.7597,[37]78.4838,
0.00.595.802 I Final estimate: PPL = 78.4838 +/- 11.95027
"""

# the base run on a text shorter than two contexts (it exits 0)
SHORT_RUN = """0.01.142.256 I perplexity: tokenization took 0.236 ms
0.01.142.281 E perplexity: you need at least 1024 tokens to evaluate perplexity with a context of 512
0.01.142.282 E perplexity: the data file you provided tokenizes to only 141 tokens
"""


def test_parse_kld_final_statistics():
    k = lk.parse_kld(KLD_RUN)
    assert k["complete"] is True
    assert (k["chunks"], k["ctx"]) == (37, 64)
    assert k["tokens"] == 37 * 31              # each chunk scores tokens 32..62 of 64
    assert k["ppl_ratio"] == 1.093707
    assert k["mean"] == 0.125087
    assert k["median"] == 0.028402
    assert k["p99"] == 1.358255
    assert k["p999"] == 2.842485
    assert k["max"] == 3.956771
    assert k["same_top1"] == 87.533             # percent, as printed
    assert (k["ppl_base"], k["ppl_quant"]) == (75.414619, 82.481468)


def test_parse_kld_without_the_final_block_takes_the_last_chunk_row():
    """A log cut before the statistics (the tool's asynchronous logger lost its end): the last
    chunk row's running figures, percentiles unknown, marked incomplete."""
    cut = KLD_RUN[:KLD_RUN.index("====== Perplexity statistics")]
    k = lk.parse_kld(cut)
    assert k["complete"] is False
    assert k["mean"] == 0.12509
    assert k["ppl_ratio"] == pytest.approx(math.exp(0.08957))
    assert k["ppl_quant"] == 82.4815
    assert k["same_top1"] == 87.533
    assert k["median"] is None and k["p999"] is None
    assert k["tokens"] == 37 * 31
    # cut after chunk 10: the figures of 10 chunks
    rows = KLD_RUN[:KLD_RUN.index("\n  11 ")]
    k = lk.parse_kld(rows)
    assert k["tokens"] == 10 * 31 and k["mean"] == 0.14205 and k["same_top1"] == 84.194


def test_parse_kld_refuses_output_without_figures():
    with pytest.raises(WorkbenchError, match="no KL-divergence figures"):
        lk.parse_kld(BASE_RUN)
    with pytest.raises(WorkbenchError):
        lk.parse_kld("")


def test_final_ppl_and_too_short_text():
    assert lk.parse_final_ppl(BASE_RUN) == 78.4838
    assert lk.parse_final_ppl(KLD_RUN) is None
    assert lk._too_short(BASE_RUN) is None
    msg = lk._too_short(SHORT_RUN)
    assert "141 tokens" in msg and "at least 1024" in msg


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent) counts as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _grandchild_script(tmp_path):
    """A child that starts a grandchild (sleep) and writes its pid, then waits."""
    pidfile = tmp_path / "pid"
    code = ("import subprocess, sys, time; p = subprocess.Popen(['sleep', '600']); "
            f"open({str(pidfile)!r}, 'w').write(str(p.pid)); time.sleep(600)")
    return [sys.executable, "-c", code], pidfile


def test_run_child_closed_kills_the_process_group(tmp_path):
    """Closing the job (what Ctrl-C in the CLI driver does) ends the child and its children."""
    cmd, pidfile = _grandchild_script(tmp_path)
    job = lk.run_child(cmd, tmp_path / "log", "sleeper", timeout=60, tick=0.2)
    ev = next(job)
    t0 = time.monotonic()
    while not pidfile.exists() or not pidfile.read_text():
        ev = next(job)
        assert time.monotonic() - t0 < 300           # a hang guard (a busy machine starts slowly)
    assert ev.message.startswith("sleeper, ")
    grandchild = int(pidfile.read_text())
    assert _alive(grandchild)
    job.close()
    t0 = time.monotonic()
    while _alive(grandchild) and time.monotonic() - t0 < 120:
        time.sleep(0.1)
    assert not _alive(grandchild)


def test_run_child_timeout_and_exit_status(tmp_path):
    cmd, _ = _grandchild_script(tmp_path)
    t0 = time.monotonic()
    with pytest.raises(WorkbenchError, match="stopped after 1 s"):
        run(lk.run_child(cmd, tmp_path / "log", "sleeper", timeout=1, tick=0.2))
    assert time.monotonic() - t0 < 300      # the 1 s timeout, not the child's 600 s sleep
    rc, dt = run(lk.run_child([sys.executable, "-c", "print('hi'); raise SystemExit(3)"],
                              tmp_path / "log2", "three"))
    assert rc == 3 and dt > 0 and (tmp_path / "log2").read_text().strip() == "hi"


def test_bench_arguments(tmp_path):
    assert parse_types("q4_k_m, IQ4_NL,Q4_K_M") == ["Q4_K_M", "IQ4_NL"]
    with pytest.raises(WorkbenchError, match="--types"):
        parse_types("Q4;rm")
    assert split_args('--methods rtn --pin "a b=q8_0"') == ["--methods", "rtn", "--pin",
                                                              "a b=q8_0"]
    with pytest.raises(WorkbenchError, match="--workbench-args"):
        split_args('"open')
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine.txt").write_text("keep")
    with pytest.raises(WorkbenchError, match="not empty"):
        prepare_out_dir(tmp_path / "full")
    assert (tmp_path / "full" / "mine.txt").read_text() == "keep"
    out = prepare_out_dir(tmp_path / "new" / "dir")
    assert (out / "logs").is_dir()
    (tmp_path / "empty").mkdir()
    assert prepare_out_dir(tmp_path / "empty") == tmp_path / "empty"

"""An imatrix written by `calibrate` is read by llama.cpp's own llama-quantize."""

from __future__ import annotations

import re
import subprocess
import sys

from .conftest import ROOT, THREADS, run_tool


def test_llama_quantize_loads_our_imatrix(llama_bin, tmp_path):
    f16, imat, out = tmp_path / "demo-f16.gguf", tmp_path / "imatrix.gguf", tmp_path / "q.gguf"
    for args in (["export", "--scheme", "fp16", "--format", "gguf", "-o", str(f16)],
                 ["calibrate", "--samples", "16", "-o", str(imat)]):
        r = subprocess.run([sys.executable, str(ROOT / "main.py"), *args], capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, r.stderr
    r = run_tool(llama_bin, "llama-quantize", "--imatrix", imat, f16, out, "Q4_K_M", THREADS)
    log = r.stdout + r.stderr
    m = re.search(r"loaded (\d+) importance matrix entries .* computed on (\d+) chunks", log)
    assert m, log[-2000:]
    assert int(m.group(1)) == 22 and int(m.group(2)) == 16     # 3 layers x 7 linears + lm_head
    assert out.stat().st_size > 0

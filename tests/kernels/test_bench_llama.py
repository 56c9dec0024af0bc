"""bench --vs-llama-quantize: argument errors are one-line errors; the table formats every row."""

from __future__ import annotations

import os
import subprocess
import sys

from workbench.bench_llama import format_table


def test_missing_file_is_a_one_line_error(tmp_path):
    p = subprocess.run([sys.executable, "main.py", "bench", "--vs-llama-quantize",
                        str(tmp_path / "nope.gguf")], capture_output=True, text=True,
                       cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert p.returncode == 2
    assert "nope.gguf" in p.stderr and "Traceback" not in p.stderr


def test_format_table_rows_and_ratios():
    rep = {"source": "m.gguf", "threads": 2, "repeats": 3, "rows": [
        {"type": "q8_0", "tensors": 37, "ggml_types": ["Q8_0"], "mbytes_f32": 89.3,
         "llama_quantize_s": 0.8, "ours_quantize_s": 0.2, "ours_read_quantize_s": 0.4,
         "ours_mbps": 446.5, "ratio_quantize": 4.0, "ratio_read_quantize": 2.0,
         "export_s": 1.6, "ratio_export": 0.5, "export_in_process_s": 0.4,
         "ratio_export_in_process": 2.0}]}
    text = format_table(rep)
    line = [ln for ln in text.splitlines() if ln.startswith("q8_0")][0]
    cells = line.split()
    assert cells[1:3] == ["37", "89.3"] and cells[7:9] == ["4.00", "2.00"]
    assert cells[9:13] == ["1.600", "0.50", "0.400", "2.00"] and cells[-1] == "Q8_0"

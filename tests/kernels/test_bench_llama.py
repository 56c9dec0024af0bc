"""bench --vs-llama-quantize: argument errors are one-line errors; the table formats every row."""

from __future__ import annotations

import os
import subprocess
import sys

from workbench.bench.llama import format_table


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
         "ratio_export_in_process": 2.0, "llama_quantize_cpu_s": 0.7, "export_cpu_s": 1.4,
         "ratio_export_cpu": 0.5}]}
    text = format_table(rep)
    line = [ln for ln in text.splitlines() if ln.startswith("q8_0")][0]
    cells = line.split()
    assert cells[1:3] == ["37", "89.3"] and cells[7:9] == ["4.00", "2.00"]
    assert cells[9:13] == ["1.600", "0.50", "0.400", "2.00"] and cells[-1] == "Q8_0"
    assert cells[13:16] == ["0.700", "1.400", "0.50"]


def test_make_llama_f16_gguf_writes_a_llama_gguf(tmp_path):
    import gguf
    import numpy as np

    from workbench.bench.llama import llama_bin_dir, make_llama_f16_gguf
    out = str(tmp_path / "llama.gguf")
    info = make_llama_f16_gguf(out, hidden=256, mlp=512, layers=2, vocab=600)
    r = gguf.GGUFReader(out)
    assert r.fields["general.architecture"].contents() == "llama"
    assert len(r.fields["tokenizer.ggml.tokens"].contents()) == 600
    shapes = {t.name: (t.tensor_type.name, [int(x) for x in t.shape]) for t in r.tensors}
    assert len(shapes) == 2 + 2 * 9 + 1
    assert shapes["token_embd.weight"] == ("F16", [256, 600])
    assert shapes["blk.1.ffn_down.weight"] == ("F16", [512, 256])
    assert shapes["output_norm.weight"][0] == "F32"          # llama.cpp's converter writes F32
    assert info["params"] == sum(int(np.prod(s)) for _, s in shapes.values())
    w = np.asarray([t for t in r.tensors if t.name == "blk.0.ffn_up.weight"][0].data)
    assert 0.015 < float(w.astype(np.float32).std()) < 0.025
    from workbench.export.llama_tools import tool_env
    bindir = llama_bin_dir()
    if bindir is not None:                                      # llama.cpp loads and re-types it
        p = subprocess.run([os.path.join(bindir, "llama-quantize"), out,
                            str(tmp_path / "q8.gguf"), "Q8_0", "1"], capture_output=True,
                           text=True, env=tool_env(bindir))
        assert p.returncode == 0, p.stderr[-500:]

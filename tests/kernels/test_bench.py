"""The bench command runs end to end on a tiny matrix (no timing assertions)."""

from __future__ import annotations

import json

from workbench.bench.throughput import format_table, run_bench


def test_run_bench_small():
    rep = run_bench(["int4-g128", "fp16", "q4_0"], size=(8, 256), repeats=1)
    assert rep["baselines"]["copy_gbps"] > 0
    by = {r["scheme"]: r for r in rep["results"]}
    assert by["int4-g128"]["dequant_kernel"] and by["int4-g128"]["quant_gbps"] > 0
    assert "quant_vs_numpy" in by["int4-g128"]["targets"]
    if "q4_0" in by and "skipped" not in by["q4_0"]:
        assert by["q4_0"]["gguf_dequant_gbps"] > 0 and by["q4_0"]["quant_vs_gguf"] > 0
    assert "int4-g128" in format_table(rep)
    # the evaluation of the tensor: one pass for int4-g128, two (quantize + error) for q4_0
    assert by["int4-g128"]["evaluate_one_pass"] is True
    assert by["int4-g128"]["evaluate_gbps"] > 0 and by["int4-g128"]["evaluate_two_pass_gbps"] > 0
    assert by["fp16"]["evaluate_one_pass"] is False
    assert "eval one-pass" in format_table(rep)


def test_bench_cli_json(capsys):
    from workbench.cli import main
    assert main(["bench", "--size", "4x64", "--repeats", "1", "--scheme", "nf4-g64",
                 "--backend", "cpu", "numpy", "--json"]) == 0
    got = capsys.readouterr()
    rep = json.loads(got.out)                         # stdout: the JSON alone
    assert [r["backend"] for r in rep["results"]] == ["cpu", "numpy"]
    assert "nf4-g64 numpy: dequantize" in got.err     # progress on stderr with --json too
    assert rep["results"][1]["dequant_kernel"] is False


def test_bench_cli_text_and_errors(capsys):
    from workbench.cli import main
    assert main(["bench", "--size", "2x64", "--repeats", "1", "--scheme", "int8-channel",
                 "--no-baselines"]) == 0
    got = capsys.readouterr()
    assert "int8-channel" in got.out
    # each scheme's figures on stderr as soon as its row is done (a run cut short keeps them)
    line = next(ln for ln in got.err.splitlines() if ln.strip().startswith("int8-channel cpu:"))
    assert "dequantize" in line and "GB/s" in line and "x copy" in line
    assert main(["bench", "--scheme", "no-such-scheme", "--size", "2x64"]) == 2

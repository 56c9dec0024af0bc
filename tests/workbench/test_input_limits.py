"""Limits on what an input may make the workbench do: repetition counts RE2 would read as
literal text, a folder holding only a PyTorch index, the wording of JSON header errors; sidecar
files (config.json, tokenizer files, shard indexes), plans and sessions size-limited before they
are read; untrusted regular expressions run on RE2; JSON nested too deep is one line naming it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from workbench.core.errors import WorkbenchError
from workbench.formats.loaders import open_model
from workbench.core.patterns import compile_pattern
from workbench.quant.plan import Plan

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "resources" / "demo_model"


@pytest.mark.parametrize("pattern", ["a{4294967296}", "a{2,99999999999999999999}", "a{1001}",
                                     "(x|y){5000}"])
def test_huge_repetition_counts_are_refused(pattern):
    with pytest.raises(WorkbenchError, match="repetition count"):
        compile_pattern(pattern)


def test_repetition_limit_keeps_re_search_semantics():
    assert compile_pattern("a{1000}").search("b" + "a" * 1000)
    assert not compile_pattern("a{1000}").search("a" * 999)
    # braces that are literal text (escaped, inside a class) are not counts
    assert compile_pattern(r"\{99999}").search("x{99999}")
    assert compile_pattern("[{]{2}").search("{{")


def test_plan_rule_with_overflowing_count_is_a_clear_error(tmp_path):
    p = tmp_path / "plan.json"
    p.write_text(json.dumps({"format": "quant-workbench-plan", "version": 1,
                             "default": "int8-channel",
                             "rules": [{"match": "re:a{4294967296}", "scheme": "fp16"}]}))
    with pytest.raises(WorkbenchError) as ei:
        Plan.load(p)
    assert str(p) in str(ei.value) and "4294967296" in str(ei.value)


def test_folder_with_only_a_pytorch_index_pointing_outside(tmp_path):
    (tmp_path / "pytorch_model.bin.index.json").write_text(
        json.dumps({"weight_map": {"a": "/etc/passwd"}}))
    with pytest.raises(WorkbenchError) as ei:
        open_model(tmp_path)
    msg = str(ei.value)
    assert "outside its folder" in msg and "root:" not in msg


def test_duplicate_key_header_error_reads_once(tmp_path):
    hb = (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},'
          b' "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}')
    p = tmp_path / "d.safetensors"
    p.write_bytes(len(hb).to_bytes(8, "little") + hb + b"\0" * 4)
    with pytest.raises(WorkbenchError) as ei:
        open_model(p)
    msg = str(ei.value)
    assert msg == f"{p}: corrupt safetensors header (duplicate key 'a')"


def test_pytorch_record_cut_short_is_refused(tmp_path):
    """mmap=True would map the bytes after a short record as weights: refused instead."""
    import io
    import zipfile

    import torch

    from workbench.core.errors import WorkbenchError
    from workbench.formats.loaders import open_model
    buf = io.BytesIO()
    torch.save({"a": torch.arange(64, dtype=torch.float32).reshape(8, 8), "b": torch.ones(8, 8)},
               buf)
    src = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename.endswith("/data/0"):
                data = data[:100]
            z.writestr(info, data)
    p = tmp_path / "short.pt"
    p.write_bytes(out.getvalue())
    import pytest
    with pytest.raises(WorkbenchError, match="cut short"):
        open_model(p)
    ok = tmp_path / "ok.pt"
    torch.save({"a": torch.ones(4, 4), "view": torch.ones(4, 4)[1:]}, ok)
    assert open_model(ok).info("view").shape == (3, 4)


def _demo_copy(tmp_path) -> Path:
    import shutil
    folder = tmp_path / "m"
    shutil.copytree(DEMO, folder)
    return folder


@pytest.mark.parametrize("name,limit", [("config.json", "16 MiB"),
                                        ("tokenizer.json", "64 MiB"),
                                        ("tokenizer_config.json", "64 MiB")])
@pytest.mark.parametrize("cmd", ["export-ct", "export-gguf", "calibrate"])
def test_sparse_sidecar_over_its_limit_is_refused_by_name(tmp_path, name, limit, cmd, cli_main):
    folder = _demo_copy(tmp_path)
    side = folder / name
    os.truncate(side, 8 << 30)            # 8 GB, sparse: read whole it would blow memory
    argv = {"export-ct": ["export", folder, "--scheme", "int4-g32", "--format",
                          "compressed-tensors", "-o", tmp_path / "ct"],
            "export-gguf": ["export", folder, "--scheme", "q8_0", "--format", "gguf",
                            "-o", tmp_path / "o.gguf"],
            "calibrate": ["calibrate", folder, "-o", tmp_path / "im.gguf"]}[cmd]
    if name == "tokenizer_config.json" and cmd != "export-ct":
        # only read by check's BOS lookup and copied by the compressed-tensors export
        argv = ["check", folder, "--scheme", "q8_0", "--chunks", "1", "--ctx", "16"]
    rc, err = cli_main(*argv)
    assert rc == 2, err
    assert f"{name}: {name} is 8,589,934,592 bytes, over the {limit} limit for this file" in err
    assert not (tmp_path / "ct").exists() and not (tmp_path / "o.gguf").exists()


def test_config_over_the_limit_is_not_treated_as_absent(tmp_path, cli_main):
    """Before: a config.json over 4 MiB read as "no config", and the compressed-tensors export
    wrote a new config.json without model_type."""
    from workbench.core.limits import MAX_SIDECAR
    folder = _demo_copy(tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["padding"] = "x" * (MAX_SIDECAR + 1)
    (folder / "config.json").write_text(json.dumps(cfg))
    rc, err = cli_main("export", folder, "--scheme", "int4-g32", "--format", "compressed-tensors",
                    "-o", tmp_path / "ct")
    assert rc == 2 and "over the 16 MiB limit" in err and "config.json" in err
    assert not (tmp_path / "ct").exists()
    from workbench.formats.llama_names import read_config
    from workbench.formats.loaders import open_model
    with pytest.raises(WorkbenchError, match="over the 16 MiB limit"):
        read_config(open_model(folder))


def test_sparse_index_is_refused_without_reading(tmp_path, cli_main, small_model):
    import time
    model = small_model(tmp_path / "m")
    idx = tmp_path / "m" / "model.safetensors.index.json"
    idx.write_text(json.dumps({"weight_map": {"blk.0.attn_q.weight": model.name}}))
    os.truncate(idx, 8 << 30)
    t0 = time.process_time()
    rc, err = cli_main("inspect", tmp_path / "m")
    assert rc == 2 and "over the 64 MiB limit" in err and "index.json" in err
    assert time.process_time() - t0 < 5      # CPU time (8 GB parsed would take minutes)


def test_sidecar_limits_table():
    from workbench.core.limits import check_sidecar, sidecar_limit
    assert sidecar_limit("a/config.json") == 16 << 20
    assert sidecar_limit("a/model.safetensors.index.json") == 64 << 20
    assert sidecar_limit("a/tokenizer.json") == 64 << 20
    with pytest.raises(WorkbenchError, match="not a regular file"):
        check_sidecar("/dev/null", "config.json")


@pytest.mark.parametrize("kind", ["plan", "session"])
def test_plan_and_session_sizes_are_checked_before_reading(tmp_path, kind):
    big = tmp_path / f"big.{kind}.json"
    big.write_text("{}")
    os.truncate(big, 8 << 30)
    fifo = tmp_path / f"fifo.{kind}.json"
    os.mkfifo(fifo)
    if kind == "plan":
        from workbench.quant.plan import Plan as load_from
    else:
        from app.session import Session as load_from
    with pytest.raises(WorkbenchError, match=r"is 8,589,934,592 bytes, over the 64 MiB limit"):
        load_from.load(big)
    with pytest.raises(WorkbenchError, match="not a regular file"):   # (it would block)
        load_from.load(fifo)
    with pytest.raises(WorkbenchError, match="file not found"):
        load_from.load(tmp_path / "none.json")


def test_a_small_sidecar_is_read_without_allocating_its_limit(tmp_path):
    """read_sidecar sizes its read by the file: under an address-space limit a 20-byte file
    with a 1 GiB limit reads (read(limit + 1) allocated the whole limit: MemoryError)."""
    import subprocess
    import sys
    small = tmp_path / "config.json"
    small.write_text('{"model_type": "x"}')
    code = (
        "import resource, sys\n"
        "from workbench.core.limits import read_sidecar\n"
        "import numpy, json\n"
        "with open('/proc/self/statm') as f: vm = int(f.read().split()[0]) * 4096\n"
        "resource.setrlimit(resource.RLIMIT_AS, (vm + (256 << 20), resource.RLIM_INFINITY))\n"
        f"print(len(read_sidecar({str(small)!r}, limit=1 << 30)))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "19", r.stderr


def test_compressed_tensors_target_regex_runs_on_re2():
    import time

    from workbench.formats.loaders.compressed_tensors_format import _args_for
    groups = [(["re:(.*.*)*X"], {"num_bits": 4}), (["re:.*mlp.*"], {"num_bits": 8})]
    name = "model.layers.0." + "a" * 5000 + ".mlp.up_proj"
    t0 = time.process_time()
    assert _args_for(name, groups) == {"num_bits": 8}       # Python's re: minutes (backtracking)
    assert time.process_time() - t0 < 10.0                  # re2: milliseconds of CPU
    assert _args_for("yX", groups) == {"num_bits": 4}       # re.match semantics kept
    with pytest.raises(WorkbenchError, match=r"config.json.*target re:\(a\)\\1"):
        _args_for("aa", [(["re:(a)\\1"], {})], path="m/config.json")


def test_diff_of_a_hostile_compressed_tensors_target_ends(tmp_path, cli_main):
    import time
    folder = _demo_copy(tmp_path)
    rc, err = cli_main("export", folder, "--scheme", "int4-g32", "--format", "compressed-tensors",
                    "-o", tmp_path / "ct")
    assert rc == 0, err
    cfg = json.loads((tmp_path / "ct" / "config.json").read_text())
    for g in cfg["quantization_config"]["config_groups"].values():
        g["targets"] = ["re:(.*.*)*X"] + g["targets"]
    (tmp_path / "ct" / "config.json").write_text(json.dumps(cfg))
    t0 = time.process_time()
    rc, err = cli_main("diff", tmp_path / "ct", tmp_path / "ct")
    assert rc == 0, err
    assert time.process_time() - t0 < 60     # CPU time: backtracking would take hours


@pytest.mark.parametrize("what", ["config", "ct-config", "index", "tokenizer_config",
                                  "tokenizer_config-gguf"])
def test_deep_json_sidecar_is_exit_2_naming_it(tmp_path, what, cli_main):
    folder = _demo_copy(tmp_path)
    deep = '{"a": ' + "[" * 200_000 + "]" * 200_000 + "}"
    if what == "config":
        (folder / "config.json").write_text(deep)
        argv = ["allocate", folder, "--budget-bpw", "6", "-o", tmp_path / "p.json"]
        name = "config.json"
    elif what == "ct-config":
        (folder / "config.json").write_text(deep)
        argv = ["diff", folder / "model.safetensors", folder / "model.safetensors"]
        name = "config.json"
    elif what == "index":
        (folder / "model.safetensors.index.json").write_text(deep)
        argv = ["inspect", folder]
        name = "model.safetensors.index.json"
    elif what == "tokenizer_config":
        (folder / "tokenizer_config.json").write_text(deep)
        argv = ["check", folder, "--scheme", "q8_0", "--chunks", "1", "--ctx", "16"]
        name = "tokenizer_config.json"
    else:   # read by the gguf package's SpecialVocab (plain json.load: was exit 3)
        (folder / "tokenizer_config.json").write_text('{"a":' * 1000 + "1" + "}" * 1000)
        argv = ["export", folder, "--scheme", "q8_0", "--format", "gguf", "-o", tmp_path / "o.gguf"]
        name = "tokenizer_config.json"
    rc, err = cli_main(*argv)
    assert rc == 2, err
    line = err.strip().splitlines()[-1]          # (a progress line may come before it)
    assert line.startswith("quant-workbench: error:") and name in line and "nested" in line

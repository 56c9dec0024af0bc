"""The caches' one rule (workbench.core.cache): keys hold the content of every file a result
depends on (not its path, size or mtime), entries hold their key and a checksum verified on
read, and a bad entry is a miss that is removed, never served. On the in-process KLD cache of
`check` (workbench.running.kld) and the output measure's (workbench.planning.output_measure);
llama.cpp's base logits are tested in tests/workbench/test_llama_tools.py."""

from __future__ import annotations

import json
import os
import shutil
import struct
import time

import numpy as np
import pytest

from workbench.core import cache as C
from workbench.core.progress import run

from tests.tiny_archs import DEMO

CTX = 64


@pytest.fixture(autouse=True)
def caches(tmp_path, monkeypatch):
    """Every cache (and the remembered hashes) in a fresh folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("QUANT_WORKBENCH_KLD_CACHE", str(tmp_path / "kld"))
    C._MEMO.clear()
    return tmp_path


def _edit_middle_keeping_size_and_mtime(path):
    """Negate the values of the tensor that holds the file's middle byte (its sign bits
    flipped: same size), then put the file's mtime back."""
    st = os.stat(path)
    with open(path, "r+b") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        header = json.loads(fh.read(n))
        mid = st.st_size // 2 - 8 - n
        name, e = next((k, v) for k, v in header.items() if k != "__metadata__"
                       and v["data_offsets"][0] <= mid < v["data_offsets"][1])
        width = {"F32": 4, "BF16": 2, "F16": 2}[e["dtype"]]
        a, b = e["data_offsets"]
        fh.seek(8 + n + a)
        w = np.frombuffer(fh.read(b - a), np.uint8).copy()
        w[width - 1::width] ^= 0x80                      # little-endian: the sign bit
        fh.seek(8 + n + a)
        fh.write(w.tobytes())
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    return name


def _edit_config_keeping_size_and_mtime(folder, eps: str):
    """config.json's rms_norm_eps (1e-06) set to `eps` (five characters: the same size), its
    mtime put back."""
    cfg = folder / "config.json"
    st = os.stat(cfg)
    text = cfg.read_text()
    new = text.replace('"rms_norm_eps": 1e-06', f'"rms_norm_eps": {eps}')
    assert len(new) == len(text) and new != text and json.loads(new)["rms_norm_eps"] == float(eps)
    cfg.write_text(new)
    os.utime(cfg, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (os.stat(cfg).st_size, os.stat(cfg).st_mtime_ns) == (st.st_size, st.st_mtime_ns)


# ---- the rule itself ------------------------------------------------------------------------
def test_content_hash_sees_every_byte_whatever_size_and_mtime_say(tmp_path):
    f = tmp_path / "w.bin"
    f.write_bytes(bytes(5 << 20))
    before = C.content_hash(f)
    st = os.stat(f)
    with open(f, "r+b") as fh:          # one byte in the middle, size and mtime kept
        fh.seek(5 << 19)
        fh.write(b"\x01")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert C.content_hash(f) != before
    assert C.file_key(f) != [5 << 20, before]
    # the same bytes elsewhere are the same input
    g = tmp_path / "elsewhere" / "copy.bin"
    g.parent.mkdir()
    shutil.copy(f, g)
    assert C.file_key(g) == C.file_key(f)


def test_entries_hold_their_key_and_checksum(tmp_path):
    c = C.Cache("t", ".bin", 8, folder=tmp_path / "c")
    k1, k2 = C.make_key(["a", 1]), C.make_key(["b", 2])
    assert c.put_bytes(k1, b"first payload") and c.put_bytes(k2, b"other payload")
    assert c.get_bytes(k1) == b"first payload"
    # another key's entry (payload and record) copied under k1: refused and removed
    shutil.copy(c.path(k2), c.path(k1))
    shutil.copy(c.record(k2), c.record(k1))
    assert c.get_bytes(k1) is None and not c.path(k1).exists() and not c.record(k1).exists()
    # a payload with a byte changed, or cut, or without a record
    for damage in ("flip", "cut", "no-record"):
        assert c.put_bytes(k1, b"first payload")
        p = c.path(k1)
        if damage == "flip":
            p.write_bytes(b"first paylaod")
        elif damage == "cut":
            p.write_bytes(b"first")
        else:
            c.record(k1).unlink()
        assert c.get_bytes(k1) is None, damage
        assert not p.exists(), damage
    assert c.get_bytes(k2) == b"other payload"


def test_only_verified_files_take_a_final_name(tmp_path):
    c = C.Cache("t", ".bin", 8, folder=tmp_path / "c")
    k = C.make_key(["x"])
    tmp = c.temp(k)
    tmp.write_bytes(b"truncated")
    assert c.put_file(k, tmp, verify=lambda p: p.stat().st_size == 100) is None
    assert not c.path(k).exists() and not tmp.exists() and c.get(k) is None
    tmp = c.temp(k)
    tmp.write_bytes(b"x" * 100)
    assert c.put_file(k, tmp, verify=lambda p: p.stat().st_size == 100) == c.path(k)
    assert c.get(k) == c.path(k) and not tmp.exists()


def test_the_most_recently_used_entries_are_kept(tmp_path):
    c = C.Cache("t", ".bin", 3, folder=tmp_path / "c")
    keys = [C.make_key([i]) for i in range(5)]
    for i, k in enumerate(keys):
        assert c.put_bytes(k, bytes([i]) * 10)
        t = time.time() - 100 + i
        os.utime(c.record(k), (t, t))
    c.prune()
    assert [c.get(k) is not None for k in keys] == [False, False, True, True, True]


# ---- the KLD cache of `check` ---------------------------------------------------------------
def _kld(model, **kw):
    from workbench.quant.plan import Plan
    from workbench.running.kld import kld_check
    return run(kld_check(model, Plan(default="q4_0"), ctx=CTX, chunks=3, **kw))["kld"]


def _fresh(folder):
    """The model at `folder` opened as a new process would (no in-process runner kept)."""
    from workbench.formats.loaders import open_model
    from workbench.running import runner_passes
    runner_passes._RUNNERS.clear()
    return open_model(str(folder))


def test_kld_cache_misses_after_an_edit_that_keeps_size_and_mtime(tmp_path):
    pytest.importorskip("transformers")
    folder = tmp_path / "demo"
    shutil.copytree(DEMO, folder)
    first = _kld(_fresh(folder))
    assert first["cache"] == "written"
    assert _kld(_fresh(folder))["cache"] == "hit"
    _edit_middle_keeping_size_and_mtime(folder / "model.safetensors")
    served = _kld(_fresh(folder))
    true = _kld(_fresh(folder), use_cache=False)
    assert served["cache"] == "written"
    assert served["mean"] == true["mean"] and served["ppl_base"] == true["ppl_base"]
    assert abs(served["ppl_base"] - first["ppl_base"]) > 1e-3 * first["ppl_base"]


def test_kld_cache_misses_after_a_config_edit_and_hits_a_copy_elsewhere(tmp_path):
    pytest.importorskip("transformers")
    folder = tmp_path / "demo"
    shutil.copytree(DEMO, folder)
    assert _kld(_fresh(folder))["cache"] == "written"
    copy = tmp_path / "elsewhere" / "demo"
    shutil.copytree(folder, copy)
    _edit_config_keeping_size_and_mtime(folder, "1e-04")
    assert _kld(_fresh(folder))["cache"] == "written"
    assert _kld(_fresh(copy))["cache"] == "hit"          # the same content: the same entry


def test_kld_entry_altered_or_from_another_model_is_not_served(tmp_path, caches):
    pytest.importorskip("transformers")
    from safetensors.numpy import load, save
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(DEMO, a)
    shutil.copytree(DEMO, b)
    _edit_middle_keeping_size_and_mtime(b / "model.safetensors")
    true_a = _kld(_fresh(a))
    true_b = _kld(_fresh(b))
    kdir = caches / "kld"
    entries = sorted(kdir.glob("*.safetensors"), key=os.path.getmtime)
    assert len(entries) == 2
    ea, eb = entries
    # altered log-probabilities (a valid file, other values)
    d = load(ea.read_bytes())
    d["logp"] = (d["logp"] - np.float32(0.5)).astype(np.float32)
    ea.write_bytes(save(d))
    got = _kld(_fresh(a))
    assert got["cache"] == "written" and got["mean"] == true_a["mean"]
    # model b's entry copied under a's name (payload alone, then with its record)
    for with_record in (False, True):
        shutil.copy(eb, ea)
        if with_record:
            shutil.copy(eb.with_name(eb.name + ".json"), ea.with_name(ea.name + ".json"))
        got = _kld(_fresh(a))
        assert got["cache"] == "written" and got["mean"] == true_a["mean"], with_record
        assert got["mean"] != true_b["mean"]


def test_kld_cache_of_a_gguf_read_as_a_hugging_face_model_hits(tmp_path):
    """A GGUF without config.json opens through a fresh companion folder each time: the key
    holds the content, not that folder's path."""
    pytest.importorskip("transformers")
    from workbench.export import export
    from workbench.export.convert.live import open_live, wants_live
    from workbench.formats.loaders import open_model
    from workbench.quant.plan import Plan
    gguf = tmp_path / "g" / "demo-f32.gguf"
    gguf.parent.mkdir()
    run(export(open_model(str(DEMO)), Plan(default="fp32"), "gguf", gguf))
    assert wants_live(gguf)
    states = []
    for _ in range(2):
        from workbench.running import runner_passes
        runner_passes._RUNNERS.clear()
        live = run(open_live(gguf))
        try:
            states.append(_kld(live)["cache"])
        finally:
            live.close()
    assert states == ["written", "hit"]
    assert len(list((tmp_path / "kld").glob("*.safetensors"))) == 1


# ---- the output measure's cache -------------------------------------------------------------
def test_output_measure_cache_sees_config_json(tmp_path, caches):
    pytest.importorskip("transformers")
    from workbench.planning.output_measure import output_errors_job
    folder = tmp_path / "demo"
    shutil.copytree(DEMO, folder)
    names = ["model.layers.0.mlp.down_proj.weight"]

    def measure(**kw):
        return run(output_errors_job(_fresh(folder), ["q4_0"], samples=4, names=names, **kw))

    first = measure()
    assert list((caches / "xdg" / "quant-workbench" / "output-sensitivity").glob("*.json"))
    _edit_config_keeping_size_and_mtime(folder, "0.010")
    served = measure()
    true = measure(use_cache=False)
    assert served == true and served != first


# ---- --no-cache -----------------------------------------------------------------------------
@pytest.mark.parametrize("argv, api_name", [
    (["sensitivity", "--measure", "output"], "measure_sensitivity"),
    (["allocate", "--budget-bpw", "5", "-o", "plan.json"], "allocate_plan"),
    (["frontier"], "compute_frontier"),
    (["check", "--scheme", "q4_0"], "check_plan")])
def test_no_cache_reaches_the_api(monkeypatch, tmp_path, argv, api_name):
    """Every command that reads a cache takes --no-cache and passes use_cache=False."""
    monkeypatch.chdir(tmp_path)
    from workbench import api
    from workbench.cli import main
    from workbench.core.errors import WorkbenchError
    seen = []

    def fake(*a, **kw):
        seen.append(kw.get("use_cache"))
        raise WorkbenchError("stopped here")

    monkeypatch.setattr(api, api_name, fake)
    for extra in ([], ["--no-cache"]):
        assert main([argv[0], str(DEMO), *argv[1:], *extra]) == 2
    assert seen == [True, False]


def test_in_process_caches_see_an_edit_that_keeps_size_and_mtime(tmp_path):
    """The in-process caches (statistics, evaluations, calibration samples, runners) key files
    by workbench.quant.stats.file_signature: an edit with the mtime put back moves its ctime.
    (Each edit waits 50 ms first: file systems stamp ctimes with a clock of a few ms.)"""
    from workbench.formats.loaders import open_model
    from workbench.quant.stats import StatsCache, file_signature, tensor_stats
    folder = tmp_path / "demo"
    shutil.copytree(DEMO, folder)
    model = open_model(str(folder))
    sig = file_signature(folder / "model.safetensors")
    time.sleep(0.05)
    name = _edit_middle_keeping_size_and_mtime(folder / "model.safetensors")
    assert file_signature(folder / "model.safetensors")[:2] == sig[:2]      # what cluster reads
    assert file_signature(folder / "model.safetensors") != sig
    model = open_model(str(folder))
    cache = StatsCache()
    cache.put(model, run(tensor_stats(model, name)))
    assert cache.get(model, name) is not None
    time.sleep(0.05)
    _edit_middle_keeping_size_and_mtime(folder / "model.safetensors")
    assert cache.get(model, name) is None

"""llama.cpp's tools as the project runs them (workbench.export.llama_tools), and the base logits
cache (workbench.export.llama_kld), with fake tools: Python scripts named llama-perplexity /
llama-simple in a folder given as $QW_LLAMA_BIN that record their arguments and environment,
write a base logits file (whole, or cut as a full disk cuts it) and print captured output (or
a 1.5 GB log first). The real tools run in tests/runtime."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap

import pytest

from workbench.core import cache as C
from workbench.core.errors import WorkbenchError
from workbench.core.progress import run
from workbench.export import llama_kld as lk
from workbench.export import llama_tools as lt

from tests.tiny_archs import DEMO
from tests.workbench.test_llama_kld import KLD_RUN

CTX = 64
FAKE = r'''#!{python}
import json, os, struct, sys
args = sys.argv[1:]
rec = os.environ.get("FAKE_RECORD")
if rec:
    with open(rec, "a") as f:
        f.write(json.dumps({{"argv": sys.argv, "repack": os.environ.get("LLAMA_ARG_REPACK"),
                            "preload": os.environ.get("LD_PRELOAD", "")}}) + "\n")
mode = os.environ.get("FAKE_MODE", "")


def opt(name):
    return args[args.index(name) + 1] if name in args else None


if os.path.basename(sys.argv[0]) != "llama-perplexity":
    print("decoded 16 tokens")
elif "--kl-divergence" in args:
    if mode == "huge":
        sys.stdout.flush()
        os.lseek(1, 640 << 20, os.SEEK_CUR)         # 640 MB of NUL bytes: one long line
        line = "0.00.053.200 I llama_perplexity: a line of noise " + "x" * 40 + "\n"
        sys.stdout.write(line * 400000)                # and 36 MB of short lines
    sys.stdout.write(open(os.environ["FAKE_OUTPUT"]).read())
else:
    ctx, n_vocab, n_chunk = int(opt("-c")), 100, 2
    nv = 2 * ((n_vocab + 1) // 2) + 4
    seed = open(opt("-m"), "rb").read(32).ljust(32, b"-")    # the model's own "logits"
    body = (b"_logits_" + struct.pack("<iii", ctx, n_vocab, n_chunk) + bytes(4 * n_chunk * ctx)
            + (seed * n_chunk * (ctx - 1 - ctx // 2) * nv)[:n_chunk * (ctx - 1 - ctx // 2) * nv * 2])
    if mode == "truncate":
        body = body[:4096]                             # what a full disk leaves
    with open(opt("--kl-divergence-base"), "wb") as f:
        f.write(body)
    print("perplexity: calculating perplexity over 2 chunks, n_ctx=%d, batch_size=2048" % ctx)
    print("[1]10.0000,[2]12.5000,")
    print("Final estimate: PPL = 12.5000 +/- 1.00000")
'''


@pytest.fixture
def tools(tmp_path, monkeypatch):
    """A folder of fake tools as $QW_LLAMA_BIN, caches in a fresh folder; returns
    (bin folder, record file)."""
    b = tmp_path / "bin"
    b.mkdir()
    for name in ("llama-perplexity", "llama-simple", "llama-imatrix", "llama-quantize"):
        p = b / name
        p.write_text(FAKE.format(python=sys.executable))
        p.chmod(0o755)
    rec = tmp_path / "record.jsonl"
    out = tmp_path / "kld-output.txt"
    out.write_text(KLD_RUN)
    monkeypatch.setenv("QW_LLAMA_BIN", str(b))
    monkeypatch.setenv("FAKE_RECORD", str(rec))
    monkeypatch.setenv("FAKE_OUTPUT", str(out))
    monkeypatch.delenv("LLAMA_ARG_REPACK", raising=False)
    monkeypatch.delenv("FAKE_MODE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    C._MEMO.clear()
    return b, rec


def _records(rec):
    return [json.loads(x) for x in rec.read_text().splitlines()]


def _text(tmp_path):
    t = tmp_path / "text.txt"
    t.write_text("some text to score\n" * 50)
    return t


def _f16(tmp_path, name="f.gguf", data=b"GGUF fake float model"):
    f = tmp_path / name
    f.write_bytes(data)
    return f


# ---- the environment and the flags ----------------------------------------------------------
def test_every_tool_runs_with_repacking_off(tools, tmp_path):
    """LLAMA_ARG_REPACK=false reaches llama-perplexity (base and score runs), the runtime
    tier's run_tool and the MiniLM bench's tools; no tool gets a flag it may not know."""
    b, rec = tools
    base = run(lk.base_logits(_f16(tmp_path), _text(tmp_path), CTX))
    run(lk.score(_f16(tmp_path, "q.gguf"), base["path"], CTX))
    from tests.runtime.conftest import run_tool
    run_tool(b, "llama-simple", "-m", "x.gguf", "-n", "16", "hello")
    from workbench.bench.minilm_llama import _tool
    _tool(b, "llama-quantize", "in.gguf", "out.gguf", "Q4_0", "2")
    got = _records(rec)
    assert [os.path.basename(r["argv"][0]) for r in got] == [
        "llama-perplexity", "llama-perplexity", "llama-simple", "llama-quantize"]
    assert all(r["repack"] == "false" for r in got)
    assert all("--no-repack" not in r["argv"] for r in got)
    shim = lt.log_flush_shim()
    if shim is not None:
        assert all(str(shim) in r["preload"] for r in got)
    # an explicit setting of the caller's is theirs
    assert lt.tool_env(b)["LLAMA_ARG_REPACK"] == "false"
    os.environ["LLAMA_ARG_REPACK"] = "true"
    try:
        assert lt.tool_env(b)["LLAMA_ARG_REPACK"] == "true"
    finally:
        del os.environ["LLAMA_ARG_REPACK"]


def test_the_tools_threads_follow_omp_num_threads(tools, tmp_path, monkeypatch):
    """llama-perplexity's -t: an explicit `threads` first, else $OMP_NUM_THREADS (the share of
    the cores the caller gave this process), else 2; a variable that is no whole number of at
    least 1 is not a count."""
    b, rec = tools
    f16, text = _f16(tmp_path), _text(tmp_path)

    def t_flag(**kw):
        rec.unlink(missing_ok=True)
        run(lk.base_logits(f16, text, CTX, use_cache=False, **kw))
        argv = _records(rec)[-1]["argv"]
        return argv[argv.index("-t") + 1]
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert t_flag() == "1" and t_flag(threads=3) == "3"
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert t_flag() == "5" and lt.tool_threads() == 5
    for bad in ("0", "-1", "two", ""):
        monkeypatch.setenv("OMP_NUM_THREADS", bad)
        assert t_flag() == "2", bad
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert t_flag() == "2" and lt.tool_threads(4) == 4


def test_the_shim_hides_the_extra_buffer_types_while_repacking_is_off(tmp_path):
    """The preloaded shim answers NULL for ggml_backend_dev_get_extra_bufts (every other name
    forwarded) while LLAMA_ARG_REPACK is false: a stand-in for libggml-base shows it."""
    cc = shutil.which("cc") or shutil.which("gcc")
    shim = lt.log_flush_shim()
    if cc is None or shim is None:
        pytest.skip("no C compiler")
    lib = tmp_path / "libfakeggml.so"
    src = tmp_path / "fake.c"
    src.write_text(textwrap.dedent("""
        #include <stdio.h>
        void *ggml_backend_reg_get_proc_address(void *reg, const char *name) {
            (void) reg; (void) name; return (void *) 1;
        }
        """))
    subprocess.run([cc, "-shared", "-fPIC", "-o", lib, src], check=True)
    main = tmp_path / "main.c"
    main.write_text(textwrap.dedent("""
        #include <stdio.h>
        void *ggml_backend_reg_get_proc_address(void *reg, const char *name);
        int main(void) {
            printf("%p %p\\n", ggml_backend_reg_get_proc_address(0, "ggml_backend_dev_get_extra_bufts"),
                   ggml_backend_reg_get_proc_address(0, "other"));
            return 0;
        }
        """))
    exe = tmp_path / "main"
    subprocess.run([cc, "-o", exe, main, f"-L{tmp_path}", "-lfakeggml"], check=True)
    env = dict(os.environ, LD_LIBRARY_PATH=str(tmp_path), LD_PRELOAD=str(shim))
    for value, want in (("false", ["(nil)", "0x1"]), ("true", ["0x1", "0x1"]),
                        (None, ["0x1", "0x1"])):
        e = dict(env)
        e.pop("LLAMA_ARG_REPACK", None)
        if value is not None:
            e["LLAMA_ARG_REPACK"] = value
        out = subprocess.run([exe], env=e, capture_output=True, text=True, check=True).stdout
        assert out.split() == want, value


def test_a_tool_without_its_execute_bit_is_one_line(tools, tmp_path):
    b, _ = tools
    tool = b / "llama-perplexity"
    tool.chmod(0o644)
    with pytest.raises(WorkbenchError, match=r"llama-perplexity is not executable: run "
                                             r"`chmod \+x .*llama-perplexity`") as e:
        run(lk.base_logits(_f16(tmp_path), _text(tmp_path), CTX))
    assert "\n" not in str(e.value)
    with pytest.raises(WorkbenchError, match="not executable"):
        run(lt.run_child([tool, "-h"], tmp_path / "log", "x"))
    tool.chmod(0o755 | stat.S_IXUSR)
    assert run(lk.base_logits(_f16(tmp_path), _text(tmp_path), CTX))["cached"] is False


# ---- the base logits cache ------------------------------------------------------------------
def test_a_truncated_base_file_never_takes_its_final_name(tools, tmp_path, monkeypatch):
    f16, text = _f16(tmp_path), _text(tmp_path)
    folder = tmp_path / "xdg" / "quant-workbench" / "kld"
    monkeypatch.setenv("FAKE_MODE", "truncate")
    with pytest.raises(WorkbenchError, match=r"incomplete base logits file \(4,096 of the "
                                             r"13,428 bytes its header promises"):
        run(lk.base_logits(f16, text, CTX))
    assert list(folder.glob("*")) == []                 # nothing left under any name
    monkeypatch.delenv("FAKE_MODE")
    first = run(lk.base_logits(f16, text, CTX))
    assert first["cached"] is False and first["path"].stat().st_size == 13428
    assert first["path"].parent == folder
    again = run(lk.base_logits(f16, text, CTX))
    assert again["cached"] is True and again["path"] == first["path"]


def test_a_damaged_or_foreign_base_entry_is_not_served(tools, tmp_path):
    text = _text(tmp_path)
    a, b = _f16(tmp_path, "a.gguf", b"model a"), _f16(tmp_path, "b.gguf", b"model b")
    pa = run(lk.base_logits(a, text, CTX))["path"]
    pb = run(lk.base_logits(b, text, CTX))["path"]
    assert pa != pb
    data = bytearray(pa.read_bytes())
    data[5000] ^= 0xFF                                  # an altered log-probability
    pa.write_bytes(bytes(data))
    assert run(lk.base_logits(a, text, CTX))["cached"] is False
    for with_record in (False, True):                   # b's entry under a's name
        shutil.copy(pb, pa)
        if with_record:
            shutil.copy(pb.with_name(pb.name + ".json"), pa.with_name(pa.name + ".json"))
        assert run(lk.base_logits(a, text, CTX))["cached"] is False, with_record
    assert run(lk.base_logits(a, text, CTX))["cached"] is True
    # another text, or the text edited keeping its size and mtime: another entry
    st = os.stat(text)
    text.write_text(text.read_text().replace("some", "more", 1))
    os.utime(text, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert run(lk.base_logits(a, text, CTX))["cached"] is False


def test_check_llama_base_cache_sees_a_config_edit_and_no_cache(tools, tmp_path):
    pytest.importorskip("transformers")
    from workbench.formats.loaders import open_model
    from workbench.quant.plan import Plan
    from tests.workbench.test_caches import _edit_config_keeping_size_and_mtime
    folder = tmp_path / "demo"
    shutil.copytree(DEMO, folder)
    text = _text(tmp_path)

    def check(**kw):
        return run(lk.check_llama(open_model(str(folder)), Plan(default="q8_0"), text, CTX,
                                  **kw))["seconds"]["base"]

    assert check() != "cached"
    assert check() == "cached"
    _edit_config_keeping_size_and_mtime(folder, "1e-04")
    assert check(use_cache=False) != "cached"
    kld = tmp_path / "xdg" / "quant-workbench" / "kld"
    assert len(list(kld.glob("*.kld"))) == 1            # --no-cache wrote nothing
    assert check() != "cached"
    assert check() == "cached"
    assert len(list(kld.glob("*.kld"))) == 2


# ---- bounded logs ---------------------------------------------------------------------------
def test_log_scanner_is_bounded(tmp_path):
    log = tmp_path / "log"
    with open(log, "wb") as f:
        f.write(b"start\r progress 1\r progress 2\n")
        f.write(b"y" * (3 << 20) + b" KLD tail of a long line\n")
        for i in range(10000):
            f.write(b"row %d KLD\n" % i)
        f.write(b"last line without an end")
    s = lt.LogScanner(log, rb"KLD", max_kept=100, tail=5).finish()
    assert len(s.kept) == 100 and s.kept[-1] == b"row 9999 KLD"
    assert max(len(x) for x in s.kept) <= lt.LINE_LIMIT
    assert s.last(2) == "row 9999 KLD / last line without an end"
    assert lt.log_tail(log, 1) == "last line without an end"


def test_a_huge_tool_log_is_read_in_bounded_memory(tools, tmp_path):
    """llama-perplexity printing 676 MB (a NUL run from a seek, then 36 MB of short lines)
    before its figures: scored under a 300 MB address-space limit."""
    code = textwrap.dedent("""
        import json, resource, sys
        import psutil
        from workbench.core.progress import run
        from workbench.export import llama_kld as lk
        base = psutil.Process().memory_info().vms
        resource.setrlimit(resource.RLIMIT_AS, (base + (300 << 20), base + (300 << 20)))
        k = run(lk.score(sys.argv[1], sys.argv[2], 64))
        print(json.dumps({"mean": k["mean"], "chunks": k["chunks"], "complete": k["complete"]}))
        """)
    q, b = _f16(tmp_path, "q.gguf"), _f16(tmp_path, "base.kld")
    env = dict(os.environ, FAKE_MODE="huge", PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", code, str(q), str(b)], capture_output=True,
                       text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"mean": 0.125087, "chunks": 37,
                                                             "complete": True}


def test_bench_allocate_names_a_tool_without_its_execute_bit(tools, tmp_path):
    from workbench.bench.vs_llama import vs_llama
    b, _ = tools
    (b / "llama-quantize").chmod(0o644)
    calib, held = tmp_path / "c.txt", tmp_path / "h.txt"
    calib.write_text("calibration\n")
    held.write_text("held out\n")
    with pytest.raises(WorkbenchError, match=r"llama-quantize is not executable: run `chmod"):
        run(vs_llama(DEMO, calib, held, tmp_path / "out", ["Q4_K_M"]))


def test_a_damaged_compiled_shim_is_compiled_again(tmp_path, monkeypatch):
    """The compiled shim is a cache entry too: a truncated one is never preloaded."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    C._MEMO.clear()
    first = lt.log_flush_shim()
    if first is None:
        pytest.skip("no C compiler")
    whole = first.read_bytes()
    first.write_bytes(whole[:100])
    again = lt.log_flush_shim()
    assert again == first and again.read_bytes() == whole

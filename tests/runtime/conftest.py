"""The real-runtime tier: exports loaded and run by llama.cpp's own tools.

llama.cpp is built once from the llama-cpp-python sdist's vendored source by `.ci/llama-cpp`
(cached outside the repository; docs/development.md gives the measured build time). `.ci/run`
builds it before the tests and passes $QW_LLAMA_BIN; under CI (CI=true) a missing build fails
these tests; elsewhere it is built once, visibly, or the tier is skipped with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _threads() -> str:
    from workbench.export.llama_tools import tool_threads
    return str(tool_threads())


#: the tools' threads (-t, llama-quantize's nthread): this worker's share of the cores
#: (tests/conftest.py sets OMP_NUM_THREADS under xdist), as the workbench runs them: ggml's
#: threads spin at each barrier, and two threads a worker on two cores made llama-perplexity
#: on the demo model 2.5x slower while the other worker ran (16.8 s against 6.8 s for
#: test_llama_quantize_bytes_equal_and_export_runs beside one busy core)
THREADS = _threads()


@pytest.fixture(scope="session")
def llama_bin(request) -> Path:
    """The llama.cpp tools' bin directory. $QW_LLAMA_BIN (what .ci/run built before the tests)
    wins. Under CI (CI=true) nothing is built here: missing tools fail the tier. Elsewhere a
    missing build is made now, once, with its progress on the terminal (not silently)."""
    env = os.environ.get("QW_LLAMA_BIN")
    ci = os.environ.get("CI") == "true"
    if env:
        path = Path(env)
        if (path / "llama-embedding").is_file():
            return path
        err = f"QW_LLAMA_BIN={env} holds no llama-embedding"
    else:
        out, err = _llama_cpp(["--check"])
        if out is None and not ci:
            capman = request.config.pluginmanager.getplugin("capturemanager")
            tr = request.config.pluginmanager.getplugin("terminalreporter")
            with capman.global_and_fixture_disabled():
                if tr is not None:
                    tr.write_line("\nbuilding llama.cpp's tools for the runtime tier, once "
                                  "(`bash .ci/llama-cpp`; progress below)")
                out, err = _llama_cpp([], stream=True)
        if out is not None:
            path = Path(out)
            if (path / "llama-embedding").is_file():
                return path
            err = f"no llama-embedding in {path}"
    if ci:
        pytest.fail(f"llama.cpp tools missing under CI (.ci/run builds them first): {err}")
    pytest.skip(f"llama.cpp tools not available (run `bash .ci/llama-cpp`): {err}")


def _llama_cpp(args, stream: bool = False):
    """(bin directory or None, error text) from `.ci/llama-cpp ARGS`; `stream`: its build log
    goes to the terminal as it runs."""
    try:
        out = subprocess.run(["bash", str(ROOT / ".ci" / "llama-cpp"), *args],
                             stdout=subprocess.PIPE, stderr=None if stream else subprocess.PIPE,
                             text=True, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    if out.returncode == 0 and out.stdout.strip():
        return out.stdout.strip().splitlines()[-1], ""
    return None, (out.stderr or "")[-2000:] or f"exit status {out.returncode}"


def log_flush_shim() -> Path:
    """workbench/llama_log_flush.c compiled (once, cached): preloaded into every tool so that
    its asynchronous log is printed entirely before it exits (see the file's comment)."""
    from workbench.export.llama_tools import SHIM_SOURCE, log_flush_shim as shim
    path = shim()
    if path is None:
        raise AssertionError(f"cannot compile {SHIM_SOURCE} (no C compiler?)")
    return path


def run_tool(llama_bin: Path, tool: str, *args, timeout=120) -> subprocess.CompletedProcess:
    """Run one of llama.cpp's tools; its whole output (the logger drained before exit by the
    preloaded shim) in stdout/stderr. Fails the test on a non-zero exit. The environment is
    the project's (workbench.export.llama_tools.tool_env: repacking off, so a host that traps
    AMX runs the tools too)."""
    from workbench.export.llama_tools import tool_env
    log_flush_shim()
    env = tool_env(llama_bin)
    cmd = [str(llama_bin / tool), *map(str, args)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, errors="replace",
                           timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        # a tool that did its work and then never exited (seen once in a full run: a tiny
        # model's llama-embedding, its JSON printed, hung 300 s; not reproduced in 12 runs
        # of the same command; again on 3 Dec 2026, Gemma 2's llama-embedding: 300 s of a
        # 696 s run, when the limit was 300 s; every tool here takes seconds): run it once
        # more, as a user would
        r = subprocess.run(cmd, capture_output=True, text=True, errors="replace",
                           timeout=timeout, env=env)
    assert r.returncode == 0, f"{tool} failed ({r.returncode}):\n{r.stderr[-3000:]}"
    return r


def llama_embeddings(llama_bin: Path, gguf_path: Path, lines_file: Path) -> np.ndarray:
    r = run_tool(llama_bin, "llama-embedding", "-m", gguf_path, "-f", lines_file, "--pooling",
                 "mean", "--embd-normalize", "2", "--embd-output-format", "json", "-t", THREADS)
    data = json.loads(r.stdout[r.stdout.index("{"):])
    return np.array([d["embedding"] for d in data["data"]], dtype=np.float64)


@pytest.fixture(scope="session")
def minilm_folder(tmp_path_factory, minilm_path) -> Path:
    """A copy of the real MiniLM Hugging Face folder (weights, config, tokenizer)."""
    dst = tmp_path_factory.mktemp("minilm") / "all-MiniLM-L6-v2"
    shutil.copytree(minilm_path.parent, dst)
    return dst


@pytest.fixture(scope="session")
def sentences(tmp_path_factory) -> tuple[list[str], Path]:
    lines = (ROOT / "resources" / "calibration.txt").read_text(encoding="utf-8").splitlines()
    lines = [s for s in lines if s.strip()][:24]
    path = tmp_path_factory.mktemp("text") / "lines.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return lines, path


@pytest.fixture(scope="session")
def minilm_reference(minilm_folder, sentences) -> np.ndarray:
    """Float32 sentence embeddings by transformers: attention-masked mean pooling, L2-normalized."""
    import torch
    from transformers import AutoModel, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(minilm_folder)
    model = AutoModel.from_pretrained(minilm_folder).eval()
    batch = tok(sentences[0], padding=True, return_tensors="pt")
    with torch.no_grad():
        h = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    e = (h * mask).sum(1) / mask.sum(1)
    return torch.nn.functional.normalize(e, dim=-1).double().numpy()


def perplexity(llama_bin: Path, gguf_path: Path, text: Path, ctx: int = 128) -> float:
    """llama-perplexity's final estimate ("Final estimate: PPL = ..."), printed through its
    asynchronous log: complete since run_tool drains the log before the tool exits."""
    from workbench.export.llama_kld import parse_final_ppl
    r = run_tool(llama_bin, "llama-perplexity", "-m", gguf_path, "-f", text, "-c", ctx, "-b",
                 ctx, "-t", THREADS)
    out = r.stdout + r.stderr
    ppl = parse_final_ppl(out)
    assert ppl is not None, f"llama-perplexity printed no final estimate:\n{out[-1500:]}"
    return ppl


@pytest.fixture(scope="session")
def demo_f32(tmp_path_factory) -> Path:
    """The bundled demo model exported as an F32 GGUF (the source the GGML-type tests quantize
    with llama-quantize and with the workbench's export); made once per session."""
    from workbench.core.progress import run
    from workbench.export import export
    from workbench.formats.loaders import open_model
    from workbench.quant.plan import Plan
    path = tmp_path_factory.mktemp("demo-f32") / "demo-f32.gguf"
    run(export(open_model(ROOT / "resources" / "demo_model"), Plan(default="fp32"), "gguf",
               path))
    return path


def generates_with_finite_perplexity(llama_bin: Path, gguf_path: Path) -> float:
    """llama-simple decodes 16 tokens from the file, and llama-perplexity on the calibration
    text gives a finite value above 1; that perplexity."""
    import re
    r = run_tool(llama_bin, "llama-simple", "-m", gguf_path, "-n", "16", "The engineer measured")
    m = re.search(r"decoded (\d+) tokens", r.stdout + r.stderr)
    assert m and int(m.group(1)) == 16, (r.stdout + r.stderr)[-1500:]
    ppl = perplexity(llama_bin, gguf_path, ROOT / "resources" / "calibration.txt")
    assert np.isfinite(ppl) and ppl > 1
    return ppl


def export_runs_and_reads_back(llama_bin: Path, demo_f32: Path, tmp_path: Path, name: str):
    """The demo's F32 GGUF exported with every weight at GGML type `name`: llama.cpp can run
    it, each tensor of that type holds the workbench's quantize bytes of its source, the first
    reads back as the scheme's dequantization, and it generates with a finite perplexity.
    Returns (number of tensors of that type, perplexity)."""
    import gguf
    from workbench.core.progress import run
    from workbench.export import export
    from workbench.formats.loaders import open_model
    from workbench.quant.evaluate import quantize
    from workbench.quant.plan import Plan
    from workbench.schemes import get_scheme
    ours = tmp_path / f"wb-{name}.gguf"
    info = run(export(open_model(demo_f32), Plan(default=name), "gguf", ours))
    assert info["runnable_by_llama_cpp"]
    src = {t.name: t for t in gguf.GGUFReader(str(demo_f32)).tensors}
    gtype = gguf.GGMLQuantizationType[name.upper()]
    typed = [t for t in gguf.GGUFReader(str(ours)).tensors if t.tensor_type == gtype]
    assert typed
    for t in typed:
        w = np.ascontiguousarray(src[t.name].data, np.float32)
        want = quantize(w, name).arrays["blocks"]
        assert np.array_equal(np.asarray(t.data).view(np.uint8).reshape(want.shape), want)
    t0 = typed[0]
    got = np.asarray(open_model(ours).read_matrix(t0.name), np.float32)
    ref = quantize(np.ascontiguousarray(src[t0.name].data, np.float32), name)
    assert np.array_equal(got.reshape(-1), get_scheme(name).dequantize(ref).reshape(-1))
    return len(typed), generates_with_finite_perplexity(llama_bin, ours)

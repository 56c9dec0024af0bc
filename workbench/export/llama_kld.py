"""KL divergence the way the field quotes it: llama.cpp's ``llama-perplexity --kl-divergence``.

Given a float GGUF (F16), a text file and a context size (512 by default, llama.cpp's):

1. ``llama-perplexity -m F16.gguf -f TEXT -c N --kl-divergence-base BASE`` once. The tool
   tokenizes the text, cuts it into contiguous chunks of N tokens, scores the second half of
   each chunk (the first half is context) and stores those tokens' full log-probabilities.
   BASE is cached (:func:`base_logits`), keyed by the identity of the F16 file, or of the files
   it was exported from (then the F16 export itself is skipped), the text's bytes and N.
2. For each quantized GGUF, ``llama-perplexity -m Q.gguf -c N --kl-divergence-base BASE
   --kl-divergence`` (the tokens come from BASE) and :func:`parse_kld` of what it prints:
   ``Mean PPL(Q)/PPL(base)``, ``Mean KLD``, ``Median KLD``, ``99.0%`` / ``99.9% KLD`` and
   ``Same top p``.

The tools run as child processes in their own session (Ctrl-C, a timeout or closing the job
kills them), on a fixed thread count (2 by default), with their whole output in a log file.
llama.cpp's tools print through an asynchronous logger that nothing drains at exit; the
preloaded ``llama_log_flush.c`` (compiled once, where a C compiler exists) drains it, so the
final statistics are never lost. Without it the parser still takes the per-chunk rows' last
running figures (mean KLD, PPL ratio, same top-1) and marks the result ``"complete": false``.

The figures (JSON keys, the same as the in-process ``check``'s ``"kld"``): ``ppl_ratio``,
``mean``, ``median``, ``p99``, ``p999``, ``max``, ``same_top1`` (a percentage, as printed),
``ppl_base``, ``ppl_quant``, ``tokens`` (scored tokens), ``chunks``, ``ctx``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from workbench.core.errors import WorkbenchError
from workbench.core.progress import Progress

ROOT = Path(__file__).resolve().parents[2]
SHIM_SOURCE = Path(__file__).with_name("llama_log_flush.c")
DEFAULT_CTX = 512
DEFAULT_THREADS = 2
DEFAULT_TIMEOUT = 3600.0
#: base logits files kept in the cache (the newest; each is chunks x ctx/2 x vocab x 2 bytes)
CACHE_KEEP = 6

_NUM = r"([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|-?inf))"


# ----------------------------------------------------------------------------- the tools

def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "quant-workbench"


def llama_bin(tool: str = "llama-perplexity") -> Path:
    """The folder holding llama.cpp's tools: $QW_LLAMA_BIN, else what ``.ci/llama-cpp --check``
    prints (the cached build), else the folder of `tool` on PATH. A WorkbenchError says how to
    get them when none holds `tool`."""
    tried = []
    env = os.environ.get("QW_LLAMA_BIN")
    if env:
        if (Path(env) / tool).is_file():
            return Path(env)
        tried.append(f"QW_LLAMA_BIN={env}")
    script = ROOT / ".ci" / "llama-cpp"
    if script.is_file():
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            r = subprocess.run(["bash", str(script), "--check"], capture_output=True, text=True,
                               timeout=30)
            lines = r.stdout.strip().splitlines()
            if r.returncode == 0 and lines and (Path(lines[-1]) / tool).is_file():
                return Path(lines[-1])
        tried.append(".ci/llama-cpp --check")
    found = shutil.which(tool)
    if found:
        return Path(found).parent
    raise WorkbenchError(f"llama.cpp's {tool} was not found ({', '.join(tried + ['PATH'])}): "
                         "build it with `bash .ci/llama-cpp` or set QW_LLAMA_BIN to its folder")


def log_flush_shim() -> Path | None:
    """llama_log_flush.c compiled once into the cache (named by the source's hash); None where
    no C compiler is found or it does not compile (the parser then takes the chunk rows)."""
    src = SHIM_SOURCE.read_bytes()
    out = cache_root() / "shim" / f"libqw_log_flush-{hashlib.sha256(src).hexdigest()[:12]}.so"
    if out.is_file():
        return out
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        r = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(tmp), str(SHIM_SOURCE),
                            "-ldl"], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            return None
        os.replace(tmp, out)
    except (OSError, subprocess.SubprocessError):
        return None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return out


def tool_env(bin_dir: Path | str | None = None) -> dict:
    """The environment llama.cpp's tools run in: the log-draining shim preloaded."""
    env = dict(os.environ)
    shim = log_flush_shim()
    if shim is not None:
        env["LD_PRELOAD"] = f"{shim} {env['LD_PRELOAD']}" if env.get("LD_PRELOAD") else str(shim)
    return env


def kill_group(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """End a child started with start_new_session=True and everything it started: SIGTERM to
    its process group, SIGKILL after `grace` seconds."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def last_line(path: Path, limit: int = 4096) -> str:
    """The last non-empty line of a log file (progress bars' carriage returns split lines)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [s.strip() for s in re.split(r"[\r\n]", tail) if s.strip()]
    return lines[-1] if lines else ""


def _children_cpu() -> float:
    import resource
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_child(cmd: list, log: Path, label: str, timeout: float = DEFAULT_TIMEOUT,
              env: dict | None = None, tick: float = 2.0, status=None,
              usage: dict | None = None):
    """Run `cmd` (its stdout and stderr into `log`), yielding Progress(0, 1, message) every
    `tick` seconds: `label`, the seconds elapsed and what `status(log)` says (default: the
    log's last line). Returns (exit status, wall seconds); `usage`, when given, gets "cpu_s"
    (the child's user + system CPU seconds, its waited-for children included: a figure the
    machine's load barely changes). On timeout, Ctrl-C or the job being closed the child's
    whole process group is killed; a timeout raises WorkbenchError."""
    log = Path(log)
    status = status or last_line
    c0 = _children_cpu()
    t0 = time.perf_counter()
    with open(log, "wb") as fh:
        proc = subprocess.Popen([str(c) for c in cmd], stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        try:
            while True:
                try:
                    proc.wait(tick)
                    break
                except subprocess.TimeoutExpired:
                    pass
                dt = time.perf_counter() - t0
                if dt > timeout:
                    kill_group(proc)
                    raise WorkbenchError(f"{label}: stopped after {timeout:.0f} s (timeout); "
                                         f"its output is in {log}")
                said = status(log)
                yield Progress(0, 1, f"{label}, {dt:.0f} s" + (f": {said[:120]}" if said else ""))
        finally:
            kill_group(proc)
    dt = time.perf_counter() - t0
    if usage is not None:
        usage["cpu_s"] = _children_cpu() - c0
    return proc.returncode, dt


def _chunk_status(log: Path) -> str:
    """llama-perplexity's progress: 'chunk i/N' from its 'computing over N chunks' line and its
    last chunk row."""
    text = _read(log)
    m = re.search(r"(?:computing|calculating perplexity) over (\d+) chunks", text)
    if not m:
        return last_line(log)
    n = int(m.group(1))
    rows = re.findall(r"^\s*(\d+)\s+\S+\s+±", text, re.M)
    done = int(rows[-1]) if rows else len(re.findall(r"\[(\d+)\]", text))
    return f"chunk {done}/{n}"


def _read(path: Path) -> str:
    try:
        return Path(path).read_bytes().decode("utf-8", "replace")
    except OSError:
        return ""


# ----------------------------------------------------------------------------- parsing

def parse_final_ppl(text: str) -> float | None:
    """llama-perplexity's (and llama-imatrix's) ``Final estimate: PPL = X``; None if absent."""
    m = re.search(r"Final estimate: PPL = " + _NUM, text)
    return float(m.group(1)) if m else None


def _chunk_rows(text: str) -> list[list[float]]:
    """The KLD run's per-chunk rows: chunk, PPL(Q) ± u, ln(PPL(Q)/PPL(base)) ± u, KLD ± u,
    Δp RMS ± u %, same top ± u % (11 numbers; running figures over the chunks so far)."""
    rows = []
    for line in text.splitlines():
        if "±" not in line:
            continue
        parts = line.replace("±", " ").replace("%", " ").split()
        if len(parts) != 11 or not parts[0].isdigit():
            continue
        try:
            rows.append([float(p) for p in parts])
        except ValueError:
            continue
    return rows


def parse_kld(text: str) -> dict:
    """The figures of a ``llama-perplexity --kl-divergence`` run (see the module docstring for
    the keys). The final statistics block wins; where it is missing (the tool prints it only
    past 100 scored tokens, and a log cut short loses it) the last chunk row gives ``mean``,
    ``ppl_ratio``, ``ppl_quant`` and ``same_top1``, the percentiles are None and
    ``complete`` is False. A WorkbenchError when there is neither."""
    def num(pattern):
        m = re.search(pattern + r"\s*:\s*" + _NUM, text)
        return float(m.group(1)) if m else None

    out: dict = {}
    m = re.search(r"computing over (\d+) chunks, n_ctx=(\d+)", text)
    if m:
        out["chunks"], out["ctx"] = int(m.group(1)), int(m.group(2))
    rows = _chunk_rows(text)
    final = {
        "ppl_ratio": num(r"Mean PPL\(Q\)/PPL\(base\)"),
        "mean": num(r"Mean\s+KLD"),
        "median": num(r"Median\s+KLD"),
        "p99": num(r"99\.0%\s+KLD"),
        "p999": num(r"99\.9%\s+KLD"),
        "max": num(r"Maximum\s+KLD"),
        "ppl_base": num(r"Mean PPL\(base\)"),
        "ppl_quant": num(r"Mean PPL\(Q\)"),
    }
    top = re.search(r"Same top p\s*:\s*" + _NUM + r"\s*±", text)
    final["same_top1"] = float(top.group(1)) if top else None
    complete = all(v is not None for v in final.values())
    if not complete:
        if not rows:
            raise WorkbenchError("llama-perplexity printed no KL-divergence figures")
        last = rows[-1]
        import math
        fill = {"ppl_quant": last[1], "ppl_ratio": math.exp(last[3]), "mean": last[5],
                "same_top1": last[9]}
        for k, v in fill.items():
            if final[k] is None:
                final[k] = v
    out.update(final)
    out["complete"] = complete
    if "ctx" in out:
        per_chunk = out["ctx"] - 1 - out["ctx"] // 2
        n = out["chunks"] if complete or not rows else int(rows[-1][0])
        out["tokens"] = n * per_chunk
    return out


def _too_short(text: str) -> str | None:
    m = re.search(r"you need at least (\d+) tokens.*?tokenizes to only (\d+) tokens", text,
                  re.S)
    if m:
        return (f"tokenizes to {m.group(2)} tokens; llama-perplexity needs at least "
                f"{m.group(1)} (2 x the context): use a longer text or a smaller context")
    return None


# ----------------------------------------------------------------------------- the runs

def file_identity(paths) -> list:
    """(resolved path, size, mtime_ns) of each file: what the base cache keys on."""
    out = []
    for p in sorted(Path(x).resolve() for x in paths):
        st = p.stat()
        out.append([str(p), st.st_size, st.st_mtime_ns])
    return out


def base_key(identity, text_path, ctx: int, chunks: int | None = None) -> str:
    """The cache key of a base logits file: the float model's identity (file_identity of the
    F16 GGUF or of the files it is exported from), the text's bytes, the context, the chunk
    limit and the tools' folder."""
    import json
    h = hashlib.sha256()
    h.update(json.dumps([identity, ctx, chunks, str(llama_bin())]).encode())
    h.update(Path(text_path).read_bytes())
    return h.hexdigest()[:24]


def cached_base(key: str, cache_dir=None) -> Path | None:
    p = Path(cache_dir or cache_root() / "kld") / f"{key}.kld"
    if p.is_file():
        with contextlib.suppress(OSError):
            os.utime(p)            # the newest are kept
        return p
    return None


def _evict(folder: Path, keep: int = CACHE_KEEP) -> None:
    files = sorted(folder.glob("*.kld"), key=lambda p: p.stat().st_mtime, reverse=True)
    for p in files[keep:]:
        with contextlib.suppress(OSError):
            p.unlink()


def base_logits(f16, text, ctx: int = DEFAULT_CTX, *, chunks: int | None = None,
                threads: int = DEFAULT_THREADS, key: str | None = None, cache_dir=None,
                out_path=None, log=None, timeout: float = DEFAULT_TIMEOUT,
                label: str = "llama-perplexity (float model, base logits)"):
    """Job: the float model's base logits for `text` (``--kl-divergence-base``). With
    `out_path` the file is written there (nothing cached); else it is cached under `key`
    (default: base_key of the F16 file's identity) and reused. Returns {"path", "ppl_base",
    "seconds", "cached"}."""
    text = Path(text)
    if not text.is_file():
        raise WorkbenchError("no such text file", path=str(text))
    if out_path is None:
        key = key or base_key(file_identity([f16]), text, ctx, chunks)
        hit = cached_base(key, cache_dir)
        if hit is not None:
            return {"path": hit, "ppl_base": None, "seconds": 0.0, "cached": True}
        folder = Path(cache_dir or cache_root() / "kld")
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"{key}.kld"
    else:
        target = Path(out_path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    own_log = log is None
    log = Path(log) if log else target.with_name(f".{target.name}.{os.getpid()}.log")
    bin_dir = llama_bin()
    cmd = [bin_dir / "llama-perplexity", "-m", f16, "-f", text, "-c", ctx, "-t", threads,
           "--kl-divergence-base", tmp]
    if chunks:
        cmd += ["--chunks", chunks]
    try:
        rc, dt = yield from run_child(cmd, log, label, timeout, tool_env(bin_dir),
                                      status=_chunk_status)
        out = _read(log)
        short = _too_short(out)
        if short:
            raise WorkbenchError(short, path=str(text))
        if rc != 0 or not tmp.is_file() or tmp.stat().st_size == 0:
            raise WorkbenchError(f"llama-perplexity failed on the float model (exit status {rc})"
                                 f": {_tail(out)}", path=str(f16))
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if own_log:
            with contextlib.suppress(OSError):
                log.unlink()
    if out_path is None:
        _evict(target.parent)
    return {"path": target, "ppl_base": parse_final_ppl(out), "seconds": dt, "cached": False}


def _tail(text: str, n: int = 300) -> str:
    lines = [s for s in text.strip().splitlines() if s.strip()]
    return " / ".join(lines[-3:])[-n:] if lines else "no output"


def score(quant, base, ctx: int = DEFAULT_CTX, *, threads: int = DEFAULT_THREADS, log=None,
          timeout: float = DEFAULT_TIMEOUT, label: str | None = None):
    """Job: ``llama-perplexity --kl-divergence`` of the GGUF `quant` against the base logits
    `base`. Returns parse_kld's figures plus "seconds" (the tool's wall time) and "bytes"."""
    quant = Path(quant)
    bin_dir = llama_bin()
    own_log = log is None
    log = Path(log) if log else Path(tempfile.mkstemp(prefix="qw-kld-", suffix=".log")[1])
    cmd = [bin_dir / "llama-perplexity", "-m", quant, "-c", ctx, "-t", threads,
           "--kl-divergence-base", base, "--kl-divergence"]
    try:
        rc, dt = yield from run_child(cmd, log, label or f"llama-perplexity KLD {quant.name}",
                                      timeout, tool_env(bin_dir), status=_chunk_status)
        out = _read(log)
    finally:
        if own_log:
            with contextlib.suppress(OSError):
                log.unlink()
    if rc != 0:
        raise WorkbenchError(f"llama-perplexity --kl-divergence failed (exit status {rc}): "
                             f"{_tail(out)}", path=str(quant))
    try:
        res = parse_kld(out)
    except WorkbenchError as exc:
        raise WorkbenchError(f"{exc.problem}: {_tail(out)}", path=str(quant)) from None
    res["seconds"] = dt
    res["bytes"] = quant.stat().st_size
    return res


# ----------------------------------------------------------------------------- check

def check_llama(model, plan, text, ctx: int = DEFAULT_CTX, *, chunks: int | None = None,
                threads: int = DEFAULT_THREADS, keep_path=None, cache_dir=None,
                timeout: float = DEFAULT_TIMEOUT, quant_model=None):
    """Job for ``check --runtime llama.cpp``: the plan exported to GGUF (the project's
    exporter; from `quant_model` when given: the model with the plan's methods applied) and an
    F16 GGUF of the float `model`, both in a temporary folder (the F16 export
    is skipped when the base logits for this model, text and context are cached); then
    llama-perplexity's KLD of the plan's file. Returns {"model_kind", "runtime", "tokens",
    "chunks", "ctx", "bytes", "kld": {...}, "seconds": {...}}."""
    from workbench.core.outputs import input_files
    from workbench.export import export
    from workbench.quant.plan import Plan
    text = Path(text)
    if not text.is_file():
        raise WorkbenchError("no such text file", path=str(text))
    llama_bin()                                  # missing tools: said before any export
    key = base_key(["exported F16", file_identity(input_files(model))], text, ctx, chunks)
    seconds = {}
    with tempfile.TemporaryDirectory(prefix="qw-check-llama-") as tmp:
        tmp = Path(tmp)
        base = cached_base(key, cache_dir)
        ppl_base = None
        if base is None:
            f16 = tmp / "float-f16.gguf"
            t0 = time.perf_counter()
            yield Progress(0, 1, "exporting the float model to an F16 GGUF")
            yield from export(model, Plan(default="fp16"), "gguf", f16)
            seconds["export_f16"] = time.perf_counter() - t0
            b = yield from base_logits(f16, text, ctx, chunks=chunks, threads=threads, key=key,
                                       cache_dir=cache_dir, timeout=timeout)
            base, ppl_base = b["path"], b["ppl_base"]
            seconds["base"] = b["seconds"]
            f16.unlink()
        else:
            seconds["base"] = "cached"
        q = Path(keep_path) if keep_path else tmp / "plan.gguf"
        t0 = time.perf_counter()
        yield Progress(0, 1, "exporting the plan to GGUF")
        info = yield from export(quant_model or model, plan, "gguf", q)
        seconds["export"] = time.perf_counter() - t0
        res = yield from score(q, base, ctx, threads=threads, timeout=timeout)
    seconds["kld"] = res.pop("seconds")
    if res.get("ppl_base") is None:
        res["ppl_base"] = ppl_base
    out = {"model_kind": "causal-lm", "runtime": "llama.cpp", "text": str(text),
           "tokens": res.get("tokens"), "chunks": res.get("chunks"), "ctx": res.get("ctx"),
           "bytes": res.pop("bytes"), "kld": res, "seconds": seconds}
    if info and info.get("fallbacks"):
        out["fallbacks"] = info["fallbacks"].get("line")
    return out

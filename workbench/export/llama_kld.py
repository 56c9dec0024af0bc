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
import os
import re
import shutil
import struct
import tempfile
import time
from pathlib import Path

from workbench.core.cache import Cache, cache_root, file_key, make_key, model_key
from workbench.core.errors import WorkbenchError
from workbench.core.progress import Progress
from workbench.export.llama_tools import (DEFAULT_TIMEOUT, REPACK_ENV, LogScanner, llama_bin,
                                          run_child, tool_env, tool_threads)

DEFAULT_CTX = 512
#: base logits files kept in the cache (the newest; each is chunks x ctx/2 x vocab x 2 bytes)
CACHE_KEEP = 6

_NUM = r"([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|-?inf))"


# ----------------------------------------------------------------------------- the tools

#: what the parsers read of a llama-perplexity log (LogScanner keeps these lines only)
PERPLEXITY_LINES = (rb"\xc2\xb1|KLD|PPL|Same top p|over \d+ chunks|Final estimate|"
                    rb"you need at least|tokenizes to only|\[\d+\]\d")


def read_log(log) -> LogScanner:
    """The lines of a llama-perplexity log that the parsers read, and its tail (bounded)."""
    return LogScanner(log, PERPLEXITY_LINES).finish()


def chunk_status():
    """A status function for run_child: llama-perplexity's (and llama-imatrix's) progress,
    'chunk i/N', from its 'computing over N chunks' line and its last chunk row, reading only
    what the log gained since the last call."""
    scanner = None
    total = None

    def status(log: Path) -> str:
        nonlocal scanner, total
        if scanner is None or scanner.path != Path(log):
            scanner, total = LogScanner(log, PERPLEXITY_LINES), None
        text = scanner.update().text()
        m = re.search(r"(?:computing|calculating perplexity) over (\d+) chunks", text)
        total = int(m.group(1)) if m else total
        if total is None:
            return scanner.last(1, 200) if scanner.tail else ""
        n = total
        rows = re.findall(r"^\s*(\d+)\s+\S+\s+±", text, re.M)
        marks = re.findall(r"\[(\d+)\]", text)
        done = int(rows[-1]) if rows else (int(marks[-1]) if marks else 0)
        return f"chunk {done}/{n}"
    return status


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

def tool_key(bin_dir: Path) -> list:
    """The content of llama-perplexity and the libraries beside it, for a key (another build
    of the tools can compute other base logits)."""
    files = [bin_dir / "llama-perplexity", *sorted(bin_dir.glob("lib*.so*"))]
    return [[f.name, file_key(f)] for f in files if f.is_file()]


def base_key(inputs, text_path, ctx: int, chunks: int | None = None) -> str:
    """The cache key of a base logits file (workbench.core.cache): `inputs` (what the float
    model is: the content of the F16 GGUF, or of the files it is exported from), the text's
    content, the context, the chunk limit, the tools' content and their repack setting."""
    bin_dir = llama_bin()
    return make_key(["llama-base-logits", 2, inputs, file_key(text_path), ctx, chunks,
                     tool_key(bin_dir), os.environ.get(*REPACK_ENV)])


def _cache(cache_dir=None) -> Cache:
    return Cache("kld", ".kld", CACHE_KEEP, folder=cache_dir or cache_root() / "kld")


def base_file_problem(path) -> str | None:
    """What is wrong with a base logits file (``--kl-divergence-base``), None when it is whole:
    the "_logits_" magic, n_ctx, n_vocab, n_chunk (int32), n_chunk x n_ctx token ids (int32),
    then per chunk n_ctx - 1 - n_ctx/2 rows of 2·ceil(n_vocab/2) + 4 uint16 (llama.cpp's
    tools/perplexity: the file's size follows from its header exactly)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            head = fh.read(20)
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    if len(head) < 20 or head[:8] != b"_logits_":
        return f"{size} bytes, no base logits header"
    n_ctx, n_vocab, n_chunk = struct.unpack("<iii", head[8:20])
    if n_ctx < 4 or n_vocab < 1 or n_chunk < 1:
        return f"a header of n_ctx {n_ctx}, n_vocab {n_vocab}, {n_chunk} chunks"
    nv = 2 * ((n_vocab + 1) // 2) + 4
    want = 20 + 4 * n_chunk * n_ctx + n_chunk * (n_ctx - 1 - n_ctx // 2) * nv * 2
    if size != want:
        return f"{size:,} of the {want:,} bytes its header promises"
    return None


def cached_base(key: str, cache_dir=None) -> Path | None:
    """The cached base logits file of `key`, verified (its record's key and checksum, its
    header and size); None on a miss (a bad entry is removed)."""
    return _cache(cache_dir).get(key, verify=lambda p: base_file_problem(p) is None)


def base_logits(f16, text, ctx: int = DEFAULT_CTX, *, chunks: int | None = None,
                threads: int | None = None, key: str | None = None, cache_dir=None,
                out_path=None, log=None, timeout: float = DEFAULT_TIMEOUT,
                label: str = "llama-perplexity (float model, base logits)",
                use_cache: bool = True, scratch=None):
    """Job: the float model's base logits for `text` (``--kl-divergence-base``). With
    `out_path` the file is written there (nothing cached); else it is cached under `key`
    (default: base_key of the F16 file's content) and reused (`use_cache` False: neither read
    nor written; the file then goes to `scratch`, a folder, default a new temporary one). The
    tool writes to a temporary name; only a file whose size its header confirms takes the
    final name. Returns {"path", "ppl_base", "seconds", "cached"}."""
    text = Path(text)
    if not text.is_file():
        raise WorkbenchError("no such text file", path=str(text))
    bin_dir = llama_bin()
    cache = None
    if out_path is None:
        if use_cache:
            cache = _cache(cache_dir)
            key = key or base_key([file_key(f16)], text, ctx, chunks)
            hit = cached_base(key, cache_dir)
            if hit is not None:
                return {"path": hit, "ppl_base": None, "seconds": 0.0, "cached": True}
        tmp = cache.temp(key) if cache is not None else None
        if tmp is None:                      # no cache, or one that cannot be written
            cache = None
            target = Path(scratch or tempfile.mkdtemp(prefix="qw-kld-base-")) / "base.kld"
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        else:
            target = cache.path(key)
    else:
        target = Path(out_path)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    own_log = log is None
    log = Path(log) if log else tmp.with_suffix(".data")     # (a stale one: clean_stale_temps)
    cmd = [bin_dir / "llama-perplexity", "-m", f16, "-f", text, "-c", ctx,
           "-t", tool_threads(threads),
           "--kl-divergence-base", tmp]
    if chunks:
        cmd += ["--chunks", chunks]
    try:
        rc, dt = yield from run_child(cmd, log, label, timeout, tool_env(bin_dir),
                                      status=chunk_status())
        out = read_log(log)
        short = _too_short(out.text())
        if short:
            raise WorkbenchError(short, path=str(text))
        if rc != 0 or not tmp.is_file() or tmp.stat().st_size == 0:
            raise WorkbenchError(f"llama-perplexity failed on the float model (exit status {rc})"
                                 f": {out.last()}", path=str(f16))
        bad = base_file_problem(tmp)
        if bad:
            raise WorkbenchError(f"llama-perplexity wrote an incomplete base logits file "
                                 f"({bad}; is the disk full?): {out.last()}",
                                 path=str(target.parent))
        final = cache.put_file(key, tmp) if cache is not None else None
        if final is not None:
            target = final
        else:                       # not cached (or the cache's record could not be written)
            if cache is not None:
                target = Path(scratch or tempfile.mkdtemp(prefix="qw-kld-base-")) / "base.kld"
            shutil.move(tmp, target)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if own_log:
            with contextlib.suppress(OSError):
                log.unlink()
    return {"path": target, "ppl_base": parse_final_ppl(out.text()), "seconds": dt,
            "cached": False}


def score(quant, base, ctx: int = DEFAULT_CTX, *, threads: int | None = None, log=None,
          timeout: float = DEFAULT_TIMEOUT, label: str | None = None):
    """Job: ``llama-perplexity --kl-divergence`` of the GGUF `quant` against the base logits
    `base`. Returns parse_kld's figures plus "seconds" (the tool's wall time) and "bytes"."""
    quant = Path(quant)
    bin_dir = llama_bin()
    own_log = log is None
    log = Path(log) if log else Path(tempfile.mkstemp(prefix="qw-kld-", suffix=".log")[1])
    cmd = [bin_dir / "llama-perplexity", "-m", quant, "-c", ctx, "-t", tool_threads(threads),
           "--kl-divergence-base", base, "--kl-divergence"]
    try:
        rc, dt = yield from run_child(cmd, log, label or f"llama-perplexity KLD {quant.name}",
                                      timeout, tool_env(bin_dir), status=chunk_status())
        out = read_log(log)
    finally:
        if own_log:
            with contextlib.suppress(OSError):
                log.unlink()
    if rc != 0:
        raise WorkbenchError(f"llama-perplexity --kl-divergence failed (exit status {rc}): "
                             f"{out.last()}", path=str(quant))
    try:
        res = parse_kld(out.text())
    except WorkbenchError as exc:
        raise WorkbenchError(f"{exc.problem}: {out.last()}", path=str(quant)) from None
    res["seconds"] = dt
    res["bytes"] = quant.stat().st_size
    return res


# ----------------------------------------------------------------------------- check

def check_llama(model, plan, text, ctx: int = DEFAULT_CTX, *, chunks: int | None = None,
                threads: int | None = None, keep_path=None, cache_dir=None,
                timeout: float = DEFAULT_TIMEOUT, quant_model=None, use_cache: bool = True):
    """Job for ``check --runtime llama.cpp``: the plan exported to GGUF (the project's
    exporter; from `quant_model` when given: the model with the plan's methods applied) and an
    F16 GGUF of the float `model`, both in a temporary folder (the F16 export
    is skipped when the base logits for this model, text and context are cached; `use_cache`
    False: never read nor written); then llama-perplexity's KLD of the plan's file. Returns
    {"model_kind", "runtime", "tokens", "chunks", "ctx", "bytes", "kld": {...},
    "seconds": {...}}."""
    from workbench.core.outputs import input_files
    from workbench.export import export
    from workbench.quant.plan import Plan
    text = Path(text)
    if not text.is_file():
        raise WorkbenchError("no such text file", path=str(text))
    llama_bin()                                  # missing tools: said before any export
    # the F16 file is the model's weights, config and tokenizer (the files it is read from,
    # and the config of a GGUF read as a Hugging Face model), by content
    inputs = ["exported F16", sorted((file_key(f) for f in input_files(model)), key=str),
              model_key(model)]
    key = base_key(inputs, text, ctx, chunks) if use_cache else None
    seconds = {}
    with tempfile.TemporaryDirectory(prefix="qw-check-llama-") as tmp:
        tmp = Path(tmp)
        base = cached_base(key, cache_dir) if use_cache else None
        ppl_base = None
        if base is None:
            f16 = tmp / "float-f16.gguf"
            t0 = time.perf_counter()
            yield Progress(0, 1, "exporting the float model to an F16 GGUF")
            yield from export(model, Plan(default="fp16"), "gguf", f16)
            seconds["export_f16"] = time.perf_counter() - t0
            b = yield from base_logits(f16, text, ctx, chunks=chunks, threads=threads, key=key,
                                       cache_dir=cache_dir, timeout=timeout,
                                       use_cache=use_cache, scratch=tmp)
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

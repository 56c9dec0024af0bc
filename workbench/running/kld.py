"""KL divergence of a quantized causal LM to its float model, scored the way
``llama-perplexity --kl-divergence`` scores it, in process.

The text (a whole file) is tokenized as one stream (the tokenizer's BOS first when it adds
one) and cut into contiguous chunks of ``ctx`` tokens (the rest after the last whole chunk is
dropped); the first token of each chunk is replaced by BOS when the tokenizer adds one. Each
chunk runs on its own; the positions ``ctx/2 .. ctx-2`` are scored, each predicting the next
token, so a chunk scores ``ctx - 1 - ctx/2`` tokens with at least ``ctx/2`` of context (the
facts of llama.cpp's tools/perplexity/perplexity.cpp). Figures, as llama-perplexity reports
them: PPL(Q), PPL(base), Mean PPL(Q)/PPL(base) = exp(mean ln p_base - mean ln p_q), the mean,
median and the 99% / 99.9% points of the per-token KLD (linear interpolation at
fraction·(n-1) over the sorted values) and "Same top p" (float and quantized argmax agree).

The float model's next-token distributions are cached on disk, sparse: per scored token the
top-K log-probabilities and their ids (K = 64), S = 64 more ids drawn from the rest of the
distribution in proportion to their probability with their log-probabilities, the log of the
mass outside the top-K and the log-probability of the actual next token: 128·8 + 8 bytes a
token whatever the vocabulary. The KLD against the sparse base (``sparse_kld``) is
``Σ_topK p log(p/q) + p_tail log(p_tail/q_tail)`` (``q_tail = 1 - Σ_topK q``: the tail merged
into one outcome, a lower bound of the full KL) plus the KL inside the tail, estimated without
bias from the drawn ids. The merged-tail bound alone is 21% low on SmolLM2 at K = 64 (49k
vocabulary, q4_k: 13.9% of the mass is outside the top 64 on average); with the drawn ids the
mean is within 0.2% (docs/methods.md states the errors measured against the full
distribution). The cache entry (workbench.core.cache: the entry holds its key and a checksum,
verified on every read) is keyed by the content of the model's weight files and config.json
(a SHA-256 of every byte), the chunks' token ids, the compute device and dtype, K and S and the
torch / transformers versions; it lives in ``$QUANT_WORKBENCH_KLD_CACHE`` or
``~/.cache/quant-workbench/kld`` (``$XDG_CACHE_HOME`` honoured); the 32 most recently used
entries are kept (the llama.cpp runtime's ``*.kld`` files beside them are
workbench.export.llama_kld's). An entry that fails its checks is removed and rewritten.

On a cache miss the float and the quantized model advance side by side, block by block, as
``check`` always did (one block's weights at a time); on a hit only the quantized model runs.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from workbench.core.errors import WorkbenchError

CACHE_VERSION = 2
DEFAULT_CTX = 512            # llama-perplexity's -c 512
TOP_K = 64
TAIL_SAMPLES = 64         # ids drawn from the rest of the distribution (see sparse_kld)
TOKENS_PER_BATCH = 2048      # chunks run together: this many tokens a batch at most
CACHE_KEEP = 32              # cache entries kept (the most recently used), ~1 KB a scored token


# ---- the token stream -----------------------------------------------------------------------
def bos_of(folder) -> int | None:
    """The BOS id the tokenizer adds in front of a text, None when it adds none: the tokenizer's
    own post-processor decides (llama.cpp's converter reads it the same way), else
    tokenizer_config.json's ``add_bos_token``."""
    tok = _tokenizer(folder)
    if tok is None:
        return None
    probe = "Hello world"
    with_sp = tok.encode(probe, add_special_tokens=True).ids
    plain = tok.encode(probe, add_special_tokens=False).ids
    if len(with_sp) > len(plain) and with_sp[1:1 + len(plain)] == plain:
        return int(with_sp[0])
    cfg = Path(folder) / "tokenizer_config.json"
    if cfg.is_file():
        from workbench.core.limits import load_sidecar_json
        # too large, too deep or malformed: refused (naming it), never read as absent
        tc = load_sidecar_json(cfg, "tokenizer_config.json")
        if isinstance(tc, dict) and tc.get("add_bos_token") is True:
            b = tc.get("bos_token")
            if isinstance(b, dict):
                b = b.get("content")
            if isinstance(b, str):
                i = tok.token_to_id(b)
                return int(i) if i is not None else None
    return None


def _tokenizer(folder):
    if not (Path(folder) / "tokenizer.json").is_file():
        return None
    from workbench.running.calibration import load_tokenizer
    tok = load_tokenizer(folder)
    tok.no_truncation()
    tok.no_padding()
    return tok


def text_stream(model, path, max_tokens: int | None = None) -> tuple[np.ndarray, int | None]:
    """(int64 token ids of the whole file as one stream, BOS id or None). Text: the file as it
    is; JSONL: the "text" fields joined by newlines; .npy / safetensors: the ids flattened.
    `max_tokens` bounds the work (the text beyond what that many tokens can reach is not
    tokenized)."""
    from workbench.running.calibration import (CHARS_PER_TOKEN, DEFAULT_CALIB, _npy_ids,
                                               _safetensors_ids, check_ids, read_texts,
                                               read_utf8, vocab_size)
    from workbench.formats.llama_names import model_folder
    p = Path(path) if path else DEFAULT_CALIB
    folder = model_folder(model)
    bos = bos_of(folder)
    if p.suffix.lower() in (".npy", ".safetensors"):
        arr = _npy_ids(p) if p.suffix.lower() == ".npy" else _safetensors_ids(p)
        ids = np.asarray(arr, dtype=np.int64).reshape(-1)
        if max_tokens:
            ids = ids[:max_tokens]
    else:
        if p.suffix.lower() in (".jsonl", ".json"):
            text = "\n".join(read_texts(p))
        else:
            text = read_utf8(p, "text")
        if max_tokens:
            text = text[:max_tokens * CHARS_PER_TOKEN]
        tok = _tokenizer(folder)
        if tok is None:
            raise WorkbenchError("no tokenizer.json in the model folder (give token ids "
                                 "instead: .npy or safetensors)", path=str(folder))
        ids = np.asarray(tok.encode(text, add_special_tokens=False).ids, dtype=np.int64)
        if bos is not None:
            ids = np.concatenate([[bos], ids]).astype(np.int64)
        if max_tokens:
            ids = ids[:max_tokens]
    check_ids([ids], vocab_size(model), p)
    return ids, bos


def make_chunks(ids: np.ndarray, ctx: int, bos: int | None,
                max_chunks: int | None = None) -> np.ndarray:
    """(n_chunk, ctx) int64: contiguous chunks of the stream (the tail after the last whole
    chunk dropped), the first token of each replaced by `bos` when there is one."""
    n = len(ids) // ctx
    if max_chunks:
        n = min(n, max_chunks)
    out = np.array(ids[:n * ctx], dtype=np.int64).reshape(n, ctx)
    if bos is not None and n:
        out[:, 0] = bos
    return out


def scored_positions(ctx: int) -> range:
    """Positions of a chunk whose next-token prediction is scored (llama.cpp: first = ctx/2,
    through ctx-2)."""
    return range(ctx // 2, ctx - 1)


def percentile(sorted_vals: np.ndarray, fraction: float) -> float:
    """llama-perplexity's percentile: linear interpolation at fraction·(n-1) of sorted values."""
    v = sorted_vals
    if fraction <= 0:
        return float(v[0])
    if fraction >= 1:
        return float(v[-1])
    p = fraction * (len(v) - 1)
    i = int(p)
    p -= i
    return float((1 - p) * v[i] + p * v[min(i + 1, len(v) - 1)])


def median(sorted_vals: np.ndarray) -> float:
    n = len(sorted_vals)
    return float(0.5 * (sorted_vals[n // 2] + sorted_vals[n // 2 - 1]) if n % 2 == 0
                 else sorted_vals[n // 2])


# ---- the sparse base ------------------------------------------------------------------------
def sparse_base(lb, k: int, samples: int = 0, gen=None):
    """The cached form of float64 log-probs `lb` (torch, rows): (ids (n, k + samples): the
    top-k ids, then `samples` ids drawn from the rest in proportion to their probability
    (systematic sampling: one uniform offset a row from `gen`), their log-probs, the log of the
    mass outside the top-k)."""
    import torch
    k = min(k, lb.shape[-1])
    vals, ids = torch.topk(lb, k, dim=-1)
    rest = lb.scatter(-1, ids, float("-inf"))
    tail = torch.logsumexp(rest, dim=-1)
    if samples:
        c = torch.cumsum(rest.exp(), -1)
        u = torch.rand(lb.shape[0], 1, generator=gen, dtype=torch.float64).to(lb.device)
        tgt = (torch.arange(samples, dtype=torch.float64, device=lb.device)[None] + u) \
            / samples * c[:, -1:]
        drawn = torch.searchsorted(c, tgt).clamp(max=lb.shape[-1] - 1)
        ids = torch.cat([ids, drawn], -1)
        vals = torch.cat([vals, lb.gather(-1, drawn)], -1)
    return ids, vals, tail


def sparse_kld(ids, lb_s, lb_tail, lq, k: int):
    """Per-token KL(base || quant) from the sparse base (torch, float64): the top-k terms
    Σ p log(p/q) exactly, the tail merged into one outcome p_tail log(p_tail/q_tail), plus the
    KL inside the tail estimated from the drawn tail ids s (drawn ∝ p): p_tail · mean_s
    (r - 1 - log r), r = q̃_s/p̃_s with p̃, q̃ normalized over the tail (an unbiased estimate, never
    negative: E_p̃[r] = 1). Without drawn ids (k columns only) the merged-tail KL, a lower
    bound of the full KL."""
    import torch
    # the quantized side rounded as the cached base is (float32): a model against itself
    # gives exactly 0, and the rounding (1e-7 relative) is far below any KLD that matters
    lq_s = lq.gather(-1, ids).float().double()
    top = (lb_s[:, :k].exp() * (lb_s[:, :k] - lq_s[:, :k])).sum(-1)
    lq_tail = torch.logsumexp(lq.scatter(-1, ids[:, :k], float("-inf")), dim=-1)
    lq_tail = lq_tail.float().double()
    p_tail = lb_tail.exp()
    live = p_tail > 0
    zero = torch.zeros_like(p_tail)
    out = top + torch.where(live, p_tail * (lb_tail - lq_tail), zero)
    if ids.shape[-1] > k:
        lr = (lq_s[:, k:] - lq_tail[:, None]) - (lb_s[:, k:] - lb_tail[:, None])
        inner = torch.nan_to_num((lr.exp() - 1 - lr).mean(-1), nan=0.0, posinf=0.0)
        out = out + torch.where(live, p_tail * inner, zero)
    return out


# ---- the cache ------------------------------------------------------------------------------
def cache_dir() -> Path:
    env = os.environ.get("QUANT_WORKBENCH_KLD_CACHE")
    if env:
        return Path(env)
    from workbench.core.cache import cache_root
    return cache_root() / "kld"


def _cache() -> "Cache":
    from workbench.core.cache import Cache
    return Cache("kld", ".safetensors", CACHE_KEEP, folder=cache_dir())


def cache_key(model, chunks: np.ndarray, k: int, samples: int, compute: str) -> str:
    """Everything the float model's distributions depend on (workbench.core.cache): the content
    of its weight files and config.json, the chunks' token ids, the compute device and dtype,
    K and S, and the versions of torch and transformers that ran it."""
    import torch
    import transformers
    from workbench.core.cache import make_key, model_key
    tok = hashlib.sha256(np.ascontiguousarray(chunks, dtype=np.int64).tobytes()).hexdigest()
    return make_key(["kld", CACHE_VERSION, model_key(model), compute, tok, list(chunks.shape),
                     k, samples, torch.__version__, transformers.__version__])


def read_cache(key: str, n_rows: int, width: int, vocab: int) -> dict | None:
    """The cached sparse base, None when absent or not verified (workbench.core.cache: the
    entry's key and checksum), or not consistent (other shapes, ids outside the vocabulary,
    values that are not log-probabilities): such an entry is removed."""
    cache = _cache()
    blob = cache.get_bytes(key)
    if blob is None:
        return None
    try:
        from safetensors.numpy import load
        d = load(blob)
        ids, lp, tail, nll = d["ids"], d["logp"], d["tail"], d["nll"]
        ok = (ids.shape == (n_rows, width) and lp.shape == (n_rows, width)
              and tail.shape == (n_rows,) and nll.shape == (n_rows,) and ids.dtype.kind in "iu"
              and not (n_rows and (ids.min() < 0 or ids.max() >= vocab))
              and np.isfinite(lp).all() and np.isfinite(nll).all()
              and not ((lp > 1e-4).any() or (tail > 1e-4).any() or np.isnan(tail).any()
                       or (nll < -1e-4).any()))
    except Exception:  # noqa: BLE001 - any unreadable entry is a miss, rewritten afterwards
        ok = False
    if not ok:
        cache.remove(key)
        return None
    return {"ids": ids.astype(np.int64), "logp": lp, "tail": tail, "nll": nll}


def write_cache(key: str, base: dict, meta: dict) -> bool:
    from safetensors.numpy import save
    blob = save({"ids": np.ascontiguousarray(base["ids"], dtype=np.int32),
                 "logp": np.ascontiguousarray(base["logp"], dtype=np.float32),
                 "tail": np.ascontiguousarray(base["tail"], dtype=np.float32),
                 "nll": np.ascontiguousarray(base["nll"], dtype=np.float32)},
                metadata={k: str(v) for k, v in meta.items()})
    return _cache().put_bytes(key, blob)      # a cache that cannot be written only costs time


# ---- the job --------------------------------------------------------------------------------
def max_positions(config) -> int | None:
    for c in (config, getattr(config, "get_text_config", lambda: None)()):
        if c is None:
            continue
        for a in ("max_position_embeddings", "n_positions", "max_seq_len"):
            v = getattr(c, a, None)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    return None


def kld_check(model, plan, text=None, ctx: int | None = None, chunks: int | None = None,
              weights=None, device: str | None = None, top_k: int = TOP_K,
              tail_samples: int = TAIL_SAMPLES, use_cache: bool = True, exact: bool = False,
              emulate: str | None = None):
    """Job: llama-perplexity's KL-divergence figures of `plan` (or `weights`, see
    runner_jobs.check) against the float model on `text` (a file; default the calibration
    text), in chunks of `ctx` tokens (default 512, or the model's maximum positions when
    fewer). `exact`: also the KLD against the full float distribution (``kld_full``, to
    measure the sparse cache's error; the cache is then not read). `emulate` "llama.cpp": the
    quantized model's Linear inputs rounded as llama.cpp's CPU dot products round them
    (workbench/running/act_emulate.py). Returns the figures
    (see the module doc) under "kld", with check's causal-LM keys beside them."""
    import time

    import torch

    from workbench.core.progress import Progress
    from workbench.running.runner_store import ActivationStore, new_budget
    from workbench.running.runner_passes import plan_override, runner_job
    from workbench.running.act_emulate import emulated_decisions, emulation
    emulating = emulated_decisions(model, plan, emulate)
    runner = yield from runner_job(model, device)
    if runner.kind != "causal-lm":
        raise WorkbenchError("KL-divergence scoring needs a causal LM", path=str(model.path))
    limit = max_positions(runner.config)
    if ctx is None:
        ctx = min(DEFAULT_CTX, limit) if limit else DEFAULT_CTX
    elif ctx < 4:
        raise WorkbenchError(f"ctx={ctx}: a chunk needs at least 4 tokens", params=("ctx",))
    elif limit and ctx > limit:
        raise WorkbenchError(f"ctx={ctx} is longer than the model's {limit} positions "
                             "(config.json): choose a smaller ctx=", path=str(model.path),
                             params=("ctx",))
    yield Progress(0, 100, "tokenizing")
    ids, bos = text_stream(model, text, ctx * chunks + 1 if chunks else None)
    note = None
    if len(ids) < ctx:
        if len(ids) < 8:
            raise WorkbenchError(f"the text has {len(ids)} tokens: too short to score (a chunk "
                                 f"needs {ctx}, see ctx=)", path=str(text or "calibration"),
                                 params=("ctx",))
        note = (f"the text has {len(ids)} tokens, fewer than --ctx {ctx}: scored as one chunk "
                f"of {len(ids)} tokens")
        ctx = len(ids)
    grid = make_chunks(ids, ctx, bos, chunks)
    n_chunk = grid.shape[0]
    pos = scored_positions(ctx)
    first, n_pos = pos.start, len(pos)
    n_rows = n_chunk * n_pos
    vocab = int(runner._meta[runner.head_params[0]].shape[0])
    k = min(top_k, vocab)
    ns = tail_samples if vocab > k else 0
    compute = f"{runner.device.type}:{str(runner.dtype).replace('torch.', '')}"
    key = cache_key(model, grid, k, ns, compute) if use_cache else None
    base = None if (exact or not use_cache) else read_cache(key, n_rows, k + ns, vocab)
    cache_state = "hit" if base is not None else ("off" if not use_cache else "miss")
    quant = plan_override(model, plan, weights)
    hooks, switch = emulation(runner, emulating)
    data = list(grid)
    bsz = max(1, TOKENS_PER_BATCH // ctx)
    budget = new_budget()
    run_float = base is None
    t0 = time.monotonic()
    fstore = qstore = None
    try:
        qstore = ActivationStore(budget)
        if run_float:
            fstore = ActivationStore(budget)
            batches, _ = runner.capture(data, bsz, None, fstore)
            runner.capture(data, bsz, quant, qstore)
        else:
            batches, _ = runner.capture(data, bsz, quant, qstore)
        L = len(runner.layers)
        sides = ([(fstore, None)] if run_float else []) + [(qstore, quant)]
        what = "float and quantized" if run_float else "quantized (float from the cache)"
        steps = L * len(batches) * len(sides)
        step = 0
        for i in range(L):
            for st, ov in sides:
                runner.materialize(runner.layer_params[i], ov)
                switch["on"] = ov is quant
                try:
                    for bi, b in enumerate(batches):
                        yield Progress(2 + 88 * step / steps, 100,
                                       f"{what}: block {i + 1}/{L}, chunks "
                                       f"{min((bi + 1) * bsz, n_chunk)}/{n_chunk}")
                        runner.current = b
                        with torch.no_grad():
                            st.put(bi, runner.call_block(i, b, st.get(bi)))
                        step += 1
                    runner.current = None
                finally:
                    runner.release(runner.layer_params[i])
        for st, ov in sides:                                  # final norms
            runner.finish_store(batches, st, ov)
        out = yield from _head(runner, batches, grid, fstore, qstore, quant, base, k, ns,
                               first, n_pos, exact, n_chunk, switch)
    finally:
        for h in hooks:
            h.remove()
        if fstore is not None:
            fstore.close()
        if qstore is not None:
            qstore.close()
    new_base, acc = out
    written = False
    if run_float and use_cache:
        written = write_cache(key, new_base, {"version": CACHE_VERSION, "ctx": ctx, "k": k,
                                              "tail_samples": ns, "chunks": n_chunk,
                                              "compute": compute})
    res = _figures(acc, n_chunk, ctx, k, ns)
    res["kld"]["cache"] = "written" if written else cache_state
    res["kld"]["seconds"] = round(time.monotonic() - t0, 3)
    res["kld"]["bos"] = bos
    if note:
        res["kld"]["note"] = note
    if emulate:
        res["kld"]["emulate"] = emulate
    yield Progress(100, 100, "done")
    return res


def _head(runner, batches, grid, fstore, qstore, quant, base, k, ns, first, n_pos, exact,
          n_chunk, switch=None):
    """Job: the head over the scored rows of every chunk. Returns (sparse base of the float
    model (new, or the cached one), per-token accumulators)."""
    import torch

    from workbench.core.progress import Progress
    n_rows = n_chunk * n_pos
    acc = {"kld": np.empty(n_rows), "same": np.empty(n_rows, bool), "nll_b": np.empty(n_rows),
           "nll_q": np.empty(n_rows)}
    if exact:
        acc["kld_full"] = np.empty(n_rows)
    new = base if base is not None else {"ids": np.empty((n_rows, k + ns), np.int64),
                                         "logp": np.empty((n_rows, k + ns), np.float32),
                                         "tail": np.empty(n_rows, np.float32),
                                         "nll": np.empty(n_rows, np.float32)}
    qhead = runner.head_weights(quant) if fstore is not None else None
    gen = torch.Generator().manual_seed(0)      # the tail draws: the same on every run
    runner.materialize(runner.head_params, None if fstore is not None else quant)
    try:
        step = max(1, runner.token_chunk())
        row = 0
        c0 = 0
        for bi, b in enumerate(batches):
            nb = b.ids.shape[0]
            yield Progress(90 + 10 * bi / len(batches), 100,
                           f"head: chunks {c0 + nb}/{n_chunk}")
            hq_all = qstore.get(bi)
            hf_all = fstore.get(bi) if fstore is not None else None
            # (chunk in batch, position) of every scored row, in chunk order
            ii = torch.arange(nb).repeat_interleave(n_pos)
            tt = torch.arange(first, first + n_pos).repeat(nb)
            nxt_all = torch.from_numpy(grid[c0:c0 + nb, first + 1:first + 1 + n_pos]
                                       .reshape(-1).copy())
            for s in range(0, len(ii), step):
                sl = slice(s, s + step)
                r = slice(row + s, row + min(s + step, len(ii)))
                nxt = nxt_all[sl].to(runner.device)
                with torch.no_grad():
                    if switch is not None:
                        switch["on"] = True
                    zq = runner.logits(hq_all[ii[sl], tt[sl]], qhead).double()
                    if switch is not None:
                        switch["on"] = False
                    lq = torch.log_softmax(zq, -1)
                    if hf_all is not None:
                        lb = torch.log_softmax(runner.logits(hf_all[ii[sl], tt[sl]]).double(), -1)
                        ids, lb_k, lb_tail = sparse_base(lb, k, ns, gen)
                        # the figures use the values as cached (float32), so a later cached
                        # run gives the same figures
                        lb_k = lb_k.float().double()
                        lb_tail = lb_tail.float().double()
                        nll_b = (-lb.gather(-1, nxt[:, None])[:, 0]).float().double()
                        new["ids"][r] = ids.cpu().numpy()
                        new["logp"][r] = lb_k.cpu().numpy()
                        new["tail"][r] = lb_tail.cpu().numpy()
                        new["nll"][r] = nll_b.cpu().numpy()
                        if exact:
                            acc["kld_full"][r] = (lb.exp() * (lb - lq)).sum(-1).cpu().numpy()
                    else:
                        dev = lq.device
                        ids = torch.from_numpy(base["ids"][r]).to(dev)
                        lb_k = torch.from_numpy(base["logp"][r]).to(dev).double()
                        lb_tail = torch.from_numpy(base["tail"][r]).to(dev).double()
                        nll_b = torch.from_numpy(base["nll"][r]).to(dev).double()
                    acc["kld"][r] = sparse_kld(ids, lb_k, lb_tail, lq, k).cpu().numpy()
                    acc["same"][r] = (zq.argmax(-1) == ids[:, 0]).cpu().numpy()
                    acc["nll_b"][r] = nll_b.cpu().numpy()
                    acc["nll_q"][r] = (-lq.gather(-1, nxt[:, None])[:, 0]).float().cpu().numpy()
            row += len(ii)
            c0 += nb
    finally:
        runner.release(runner.head_params)
    return new, acc


def _figures(acc: dict, n_chunk: int, ctx: int, k: int, ns: int) -> dict:
    kl = np.sort(np.maximum(acc["kld"], 0.0))       # rounding can give -1e-17 for equal rows
    n = len(kl)
    ln_b, ln_q = float(acc["nll_b"].mean()), float(acc["nll_q"].mean())
    kld = {"ppl_base": float(np.exp(ln_b)), "ppl_quant": float(np.exp(ln_q)),
           "ppl_ratio": float(np.exp(ln_q - ln_b)), "mean": float(kl.mean()),
           "median": median(kl), "p99": percentile(kl, 0.99), "p999": percentile(kl, 0.999),
           "max": float(kl[-1]), "same_top1": float(100.0 * acc["same"].mean()),
           "tokens": n, "chunks": n_chunk, "ctx": ctx, "top_k": k, "tail_samples": ns}
    res = {"model_kind": "causal-lm", "samples": n_chunk, "tokens": n,
           "kl_mean": kld["mean"], "kl_p99": kld["p99"], "kl_max": kld["max"],
           "top1_agree": float(acc["same"].mean()), "ppl_base": kld["ppl_base"],
           "ppl": kld["ppl_quant"], "kld": kld}
    if "kld_full" in acc:
        full = np.sort(np.maximum(acc["kld_full"], 0.0))
        res["kld_full"] = {"mean": float(full.mean()), "median": median(full),
                           "p99": percentile(full, 0.99), "p999": percentile(full, 0.999),
                           "max": float(full[-1]),
                           "sparse_error_mean": float(full.mean() - kl.mean()),
                           "sparse_error_rel": float((full.mean() - kl.mean())
                                                     / max(full.mean(), 1e-300))}
    return res

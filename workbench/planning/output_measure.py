"""The ``output`` sensitivity measure (workbench.planning.sensitivity): the measured change of the
model's outputs with one tensor quantized (mean KL divergence for a causal LM, 1 - cosine for
an encoder), cached on disk; and rank agreement between measures.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from workbench.quant.plan import KEEP
from workbench.core.progress import Progress, run as run_job

CACHE_KEEP = 64           # entries kept (the most recently used)


def cache_dir() -> Path:
    from workbench.core.cache import cache_root
    return cache_root() / "output-sensitivity"


def _cache():
    from workbench.core.cache import Cache
    return Cache("output-sensitivity", ".json", CACHE_KEEP, folder=cache_dir())


def cache_key(model, runner, data, max_len: int) -> str:
    """Everything the measured values depend on (workbench.core.cache): the content of the
    model's weight files and config.json, the calibration samples' token ids (the text, the
    tokenizer, --samples and the length limit in one), the compute device and dtype, and the
    torch / transformers versions."""
    import torch
    import transformers
    from workbench.core.cache import make_key, model_key
    h = hashlib.sha256()
    for ids in data:
        a = np.ascontiguousarray(ids, dtype=np.int64)
        h.update(len(a).to_bytes(8, "little"))
        h.update(a.tobytes())
    return make_key(["output-measure", 2, model_key(model), h.hexdigest(), len(data), max_len,
                     f"{runner.device}:{runner.dtype}", torch.__version__,
                     transformers.__version__])


def _read_cache(key: str) -> dict:
    """{"name|applied": value} of a verified entry; {} on a miss (a bad entry removed)."""
    cache = _cache()
    blob = cache.get_bytes(key)
    if blob is None:
        return {}
    try:
        data = json.loads(blob)
        out = {k: float(v) for k, v in data["values"].items() if isinstance(k, str)}
        if all(np.isfinite(v) for v in out.values()) and data.get("key") == key:
            return out
    except (ValueError, KeyError, AttributeError, TypeError):
        pass
    cache.remove(key)
    return {}


def _write_cache(key: str, values: dict) -> None:
    # a cache that cannot be written only costs time
    _cache().put_bytes(key, json.dumps({"version": 2, "key": key, "values": values}).encode())


def output_measure(kind: str, base, quant) -> float:
    """Mean KL(base || quant) per token (causal LM) or mean 1 - cosine per sample (encoder)."""
    if kind == "encoder":
        b = np.asarray(base, dtype=np.float64)
        q = np.asarray(quant, dtype=np.float64)
        nb = np.linalg.norm(b, axis=1)
        nq = np.linalg.norm(q, axis=1)
        cos = (b * q).sum(1) / np.maximum(nb * nq, 1e-300)
        return float(np.mean(1.0 - cos))
    tot, cnt = 0.0, 0
    for lb, lq in zip(base, quant):
        if len(lb) == 0:
            continue
        pb = np.exp(lb.astype(np.float64))
        tot += float((pb * (lb.astype(np.float64) - lq)).sum())
        cnt += len(lb)
    return tot / max(cnt, 1)


def output_errors_job(model, schemes, calib=None, samples=None, names=None, runtime: str = "any",
                      max_len: int = 128, batch_size: int = 32, use_cache: bool = True):
    """Job: {(name, scheme): measured output change} (see the module doc)."""
    from workbench.running.calibration import calibration_samples
    from workbench.core.progress import subjob
    from workbench.quant.streaming import dequantized
    from workbench.running.runner_passes import runner_job
    from workbench.running.runner_measures import output_pass
    from workbench.quant.runtimes import decide
    runner = yield from runner_job(model)
    data = yield from subjob(calibration_samples(model, calib, samples, max_len), 0, 2, 100)
    names = [n for n in (names if names is not None else model.tensors)
             if model.info(n).ndim >= 2 and model.info(n).is_float]
    ckey = cache_key(model, runner, data, max_len) if use_cache else None
    cached = _read_cache(ckey) if use_cache else {}
    todo = {}
    out = {}
    for n in names:
        info = model.info(n)
        for s in schemes:
            applied = decide(info, s, runtime).applied
            if applied == KEEP or runner.block_of(n) is None:
                out[(n, s)] = 0.0    # unchanged, or not read by the network's forward pass
                continue
            k = f"{n}|{applied}"
            if k in cached:
                out[(n, s)] = cached[k]
            else:
                todo.setdefault(k, (n, applied, []))[2].append(s)
    if not todo:
        yield Progress(100, 100, "output sensitivity (cached)")
        return out

    def only(n, applied):
        def ov(m):
            return dequantized(model, n, applied) if m == n else None
        ov.changes = lambda m: m == n
        return ov

    items = [(k, n, only(n, applied)) for k, (n, applied, _) in todo.items()]
    data = sorted(data, key=len)          # less padding per batch; the means do not change
    got = yield from subjob(output_pass(runner, data, items, batch_size), 2, 100, 100)
    for k, (n, applied, ss) in todo.items():
        cached[k] = got[k]
        for s in ss:
            out[(n, s)] = got[k]
    if use_cache:
        _write_cache(ckey, cached)
    yield Progress(100, 100, "done")
    return out


def output_errors(model, schemes, calib=None, samples=None, names=None, progress=None,
                  cancel=None, runtime: str = "any") -> dict:
    """{(name, scheme): float}: mean KL (causal LM, nats per token) or 1 - cosine (encoders) of
    the model's outputs with only that tensor quantized, over the calibration samples (default:
    resources/calibration.txt). `progress(Progress)`, `cancel() -> bool`."""
    return run_job(output_errors_job(model, schemes, calib, samples, names, runtime),
                   progress, cancel)


def spearman(a, b) -> float:
    """Spearman rank correlation (average ranks for ties)."""
    def ranks(x):
        x = np.asarray(x, dtype=np.float64)
        o = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[o] = np.arange(len(x), dtype=np.float64)
        for v in np.unique(x):
            m = x == v
            if m.sum() > 1:
                r[m] = r[m].mean()
        return r
    ra, rb = ranks(a), ranks(b)
    ra -= ra.mean()
    rb -= rb.mean()
    den = np.sqrt((ra ** 2).sum() * (rb ** 2).sum())
    return float((ra * rb).sum() / den) if den > 0 else float("nan")


def rank_agreement(table, reference, scheme: str, names=None) -> float:
    """Spearman correlation over tensors of `table`'s values against `reference`'s (e.g. the
    weight or activation measure against the measured output change) for one scheme; tensors
    whose reference value is 0 up to rounding (not read by the network's forward pass, e.g.
    BERT's pooler for mean-pooled embeddings) are left out."""
    names = [n for n in (names or table.names) if (n, scheme) in reference.values
             and (n, scheme) in table.values]
    top = max([abs(reference.values[(n, scheme)]) for n in names] + [0.0])
    names = [n for n in names if abs(reference.values[(n, scheme)]) > 1e-9 * top]
    return spearman([table.values[(n, scheme)] for n in names],
                    [reference.values[(n, scheme)] for n in names])

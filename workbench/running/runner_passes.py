"""Passes over a Runner: the cached runner of a model, a plan's dequantized weights as an
override, every block in turn over the batches, and the head's outputs in token chunks.
"""

from __future__ import annotations

import numpy as np

from workbench.quant.plan import KEEP
from workbench.quant.streaming import dequantized
from workbench.running.runner import Runner
from workbench.running.runner_config import current_device
from workbench.running.runner_store import ActivationStore, Batch, new_budget


_RUNNERS: dict[tuple, Runner] = {}


def runner_job(model, device: str | None = None):
    """Job: :func:`get_runner`'s Runner, saying first that the network is being built (the
    import of transformers and the model's construction take seconds)."""
    from workbench.core.progress import Progress
    yield Progress(0, 1, "building the network (transformers)")
    return get_runner(model, device)


def get_runner(model, device: str | None = None) -> Runner:
    """One cached Runner per (model path, file signature, device)."""
    from workbench.quant.stats import file_signature
    dev = device or current_device()
    # a GGUF read as a Hugging Face model has one companion folder per opening
    key = (str(model.path), file_signature(str(model.path)), dev, getattr(model, "folder", None))
    r = _RUNNERS.get(key)
    if r is None:
        r = _RUNNERS[key] = Runner(model, dev)
    return r


def plan_override(model, plan=None, weights=None, cache: dict | None = None):
    """override(name) -> float array | None: `weights` ({name: array}, or any mapping) where it
    has the tensor, else the plan's dequantized tensor (None: the original)."""
    assignment = plan.resolve(model) if plan is not None else {}

    def fn(n):
        if weights is not None:
            return weights[n] if n in weights else None
        s = assignment.get(n, KEEP)
        if s == KEEP:
            return None
        if cache is not None and (n, s) in cache:
            return cache[(n, s)]
        w = dequantized(model, n, s)
        if cache is not None:
            cache[(n, s)] = w
        return w

    def changes(n):
        if weights is not None:
            return n in weights
        return assignment.get(n, KEEP) != KEEP
    fn.changes = changes
    return fn


def block_pass(runner: Runner, data, batch_size: int = 16, override=None, hooks=None,
               keep_inputs: bool = False, label: str = "running", span=(0, 100), budget=None):
    """Job: run `data` through every block (weights under `override`). `hooks(i, block)`
    returns a list of hook handles to remove after block i (statistics). Returns
    (batches, store of the last block's outputs, [stores of each block's inputs] when
    `keep_inputs`)."""
    from workbench.core.progress import Progress
    a, z = span
    L = len(runner.layers)
    budget = budget or new_budget()
    yield Progress(a, 100, f"{label}: embeddings")
    batches, store = runner.capture(data, batch_size, override, ActivationStore(budget))
    inputs = []
    for i in range(L):
        yield Progress(a + (z - a) * (i + 1) / (L + 1), 100, f"{label}: block {i + 1}/{L}")
        src = store
        if keep_inputs:
            inputs.append(store)
            store = ActivationStore(budget)
        runner.materialize(runner.layer_params[i], override)
        handles = hooks(i, runner.layers[i]) if hooks else []
        try:
            runner.run_block(i, batches, src, store)
        finally:
            for h in handles:
                h.remove()
            runner.release(runner.layer_params[i])
    return batches, store, inputs


def _encoder_pool(runner, h, b):
    import torch
    m = torch.from_numpy(b.mask).to(h.device).unsqueeze(-1).to(h.dtype)
    return ((h * m).sum(1) / m.sum(1).clamp(min=1)).float().cpu().numpy()


def _head_rows(b: Batch):
    """(batch index, position) of every position that predicts a real next token."""
    rows = []
    for i in range(b.ids.shape[0]):
        n = int(b.mask[i].sum())
        rows.extend((i, t) for t in range(max(n - 1, 0)))
    return rows


def head_chunks(runner, batches, stores, override=None):
    """Yield (batch index, rows [(i, t)], [float32 log-probs (n, vocab) per store]) in token
    chunks, the final norm and the head materialized once."""
    import torch
    runner.materialize(runner.norm_params + runner.head_params, override)
    try:
        step = runner.token_chunk()
        for bi, b in enumerate(batches):
            rows = _head_rows(b)
            hs = [runner.finish(s.get(bi)) for s in stores]
            for c0 in range(0, len(rows), step):
                rr = rows[c0:c0 + step]
                ii = torch.tensor([r[0] for r in rr])
                tt = torch.tensor([r[1] for r in rr])
                with torch.no_grad():
                    lps = [torch.log_softmax(runner.logits(h[ii, tt]), dim=-1) for h in hs]
                yield bi, rr, lps
    finally:
        runner.release(runner.norm_params + runner.head_params)


def final_outputs(runner, batches, store, override=None):
    """Encoder: list of pooled (hidden,) arrays; causal LM: list of (len-1, vocab) log-probs
    (small models only: the whole vocabulary for every token)."""
    import torch
    if runner.kind == "encoder":
        runner.materialize(runner.norm_params, override)
        try:
            out = []
            for bi, b in enumerate(batches):
                with torch.no_grad():
                    out.extend(list(_encoder_pool(runner, runner.finish(store.get(bi)), b)))
            return out
        finally:
            runner.release(runner.norm_params)
    per = {}
    for bi, rr, (lp,) in head_chunks(runner, batches, [store], override):
        lp = lp.float().cpu().numpy()
        for k, (i, t) in enumerate(rr):
            per.setdefault((bi, i), []).append(lp[k])
    out = []
    for bi, b in enumerate(batches):
        for i in range(b.ids.shape[0]):
            rows = per.get((bi, i))
            out.append(np.stack(rows) if rows else np.zeros((0, runner.head.out_features),
                                                             np.float32))
    return out


def run_outputs(runner: Runner, samples, batch_size: int = 16, label: str = "running",
                override=None):
    """Job: the runner's outputs for every sample, block by block: encoders (hidden,)
    mean-pooled states, causal LMs (len-1, vocab) next-token log-probs (position t predicts
    token t+1), one array per sample, in the order of `samples`."""
    from workbench.core.progress import Progress, subjob
    batches, store, _ = yield from subjob(block_pass(runner, samples, batch_size, override,
                                                     label=label), 0, 95, 100)
    try:
        out = final_outputs(runner, batches, store, override)
    finally:
        store.close()
    yield Progress(100, 100, label)
    return out

"""Jobs over the layer-by-layer runner (workbench.running.runner): ``check`` (float and quantized
activations side by side, KL / top-1 / perplexity at the head chunk by chunk), ``input_pass``
(the inputs of every weight, experts' per routed token: calibrate and the methods' statistics)
and ``expert_usage`` (the router's choices)."""

from __future__ import annotations

import numpy as np

from workbench.running.runner_store import ActivationStore, new_budget
from workbench.running.runner_passes import (_head_rows, block_pass, final_outputs, get_runner,
                                             plan_override, runner_job)


# -- end-to-end check ------------------------------------------------------------------------------

def compare_outputs(kind: str, base, quant, samples) -> dict:
    """Figures of quantized vs original outputs (see `check`) from whole output arrays."""
    if kind == "encoder":
        cos = []
        for a, b in zip(base, quant):
            na, nb = np.linalg.norm(a), np.linalg.norm(b)
            cos.append(float(a @ b / (na * nb)) if na > 0 and nb > 0 else 0.0)
        cos = np.asarray(cos)
        return {"cosine_mean": float(cos.mean()), "cosine_min": float(cos.min())}
    acc = _KLAcc()
    for lb, lq, ids in zip(base, quant, samples):
        if len(lb) == 0:
            continue
        nxt = ids[1:len(lb) + 1]
        acc.add(np.asarray(lb, np.float64), np.asarray(lq, np.float64), nxt)
    return acc.result()


class _KLAcc:
    """KL / top-1 / perplexity accumulated chunk by chunk (exact p99 from the per-token KLs)."""

    def __init__(self):
        self.kl, self.agree, self.nll_b, self.nll_q = [], [], [], []

    def add(self, lb, lq, nxt):
        pb = np.exp(lb)
        self.kl.append((pb * (lb - lq)).sum(-1))
        self.agree.append(lb.argmax(-1) == lq.argmax(-1))
        r = np.arange(len(nxt))
        self.nll_b.append(-lb[r, nxt])
        self.nll_q.append(-lq[r, nxt])

    def result(self) -> dict:
        kl = np.concatenate(self.kl) if self.kl else np.zeros(1)
        return {"kl_mean": float(kl.mean()), "kl_p99": float(np.percentile(kl, 99)),
                "kl_max": float(kl.max()),
                "top1_agree": float(np.concatenate(self.agree).mean()) if self.agree else 1.0,
                "ppl_base": float(np.exp(np.concatenate(self.nll_b).mean())) if self.nll_b
                else float("nan"),
                "ppl": float(np.exp(np.concatenate(self.nll_q).mean())) if self.nll_q
                else float("nan")}


def check(model, plan, calib=None, samples: int | None = None, max_len: int = 128,
          weights=None, device: str | None = None, batch_size: int = 16,
          emulate: str | None = None):
    """Job: run the calibration inputs through the original and the plan-quantized model, block
    by block, float and quantized activations side by side (`weights`: {name: float array} or
    any mapping to load instead of the plan's own dequantized tensors — a method's output,
    workbench.running.methods_apply.runner_weights).
    Returns {"model_kind", "samples", "tokens", ...figures}: encoders cosine_mean/cosine_min of
    mean-pooled final hidden states; causal LMs kl_mean/kl_p99/kl_max (nats), top1_agree,
    ppl_base, ppl — accumulated at the head in token chunks. `emulate` "llama.cpp": the
    quantized passes' Linear inputs rounded as llama.cpp's CPU dot products round them, as in
    kld.kld_check (workbench/running/act_emulate.py; the float passes untouched; the figures
    then carry "emulate")."""
    import torch
    from workbench.running.act_emulate import emulated_decisions, emulation
    from workbench.running.calibration import calibration_samples
    from workbench.core.progress import Progress, subjob
    emulating = emulated_decisions(model, plan, emulate)
    runner = yield from runner_job(model, device)
    data = yield from subjob(calibration_samples(model, calib, samples, max_len), 0, 5, 100)
    quant = plan_override(model, plan, weights)
    budget = new_budget()
    batches, fstore = runner.capture(data, batch_size, None, ActivationStore(budget))
    qstore = ActivationStore(budget)
    hooks, switch = emulation(runner, emulating)
    try:
        _, q0 = runner.capture(data, batch_size, quant, qstore)
        L = len(runner.layers)
        for i in range(L):
            yield Progress(5 + 85 * i / L, 100, f"original and quantized: block {i + 1}/{L}")
            runner.materialize(runner.layer_params[i])
            try:
                runner.run_block(i, batches, fstore, fstore)
            finally:
                runner.release(runner.layer_params[i])
            runner.materialize(runner.layer_params[i], quant)
            switch["on"] = True
            try:
                runner.run_block(i, batches, qstore, qstore)
            finally:
                switch["on"] = False
                runner.release(runner.layer_params[i])
        yield Progress(90, 100, "head")
        n_tok = int(sum(len(s) for s in data))
        res = {"model_kind": runner.kind, "samples": len(data), "tokens": n_tok}
        if runner.kind == "encoder":
            base = final_outputs(runner, batches, fstore)
            switch["on"] = True
            try:
                qout = final_outputs(runner, batches, qstore, quant)
            finally:
                switch["on"] = False
            res.update(compare_outputs("encoder", base, qout, data))
        else:
            acc = _KLAcc()
            for st, ov in ((fstore, None), (qstore, quant)):   # final norms, float / quantized
                runner.finish_store(batches, st, ov)
            qhead = runner.head_weights(quant)       # None: the plan keeps the head
            runner.materialize(runner.head_params)
            try:
                step = runner.token_chunk()
                for bi, b in enumerate(batches):
                    yield Progress(90 + 10 * bi / len(batches), 100, "head")
                    rows = _head_rows(b)
                    hf, hq = fstore.get(bi), qstore.get(bi)
                    for c in range(0, len(rows), step):
                        rr = rows[c:c + step]
                        ii = torch.tensor([r[0] for r in rr])
                        tt = torch.tensor([r[1] for r in rr])
                        with torch.no_grad():
                            lb = torch.log_softmax(runner.logits(hf[ii, tt]).double(), -1)
                            switch["on"] = True
                            try:
                                zq = runner.logits(hq[ii, tt], qhead)
                            finally:
                                switch["on"] = False
                            lq = torch.log_softmax(zq.double(), -1)
                        nxt = np.array([b.ids[i, t + 1] for i, t in rr])
                        acc.add(lb.double().cpu().numpy(), lq.double().cpu().numpy(), nxt)
            finally:
                runner.release(runner.head_params)
            res.update(acc.result())
    finally:
        for h in hooks:
            h.remove()
        fstore.close()
        qstore.close()
    if emulate:
        res["emulate"] = emulate
    yield Progress(100, 100, "done")
    return res


# -- inputs of every weight (statistics) -----------------------------------------------------------

def _route_args(args, kwargs):
    h = args[0] if args else kwargs.get("hidden_states")
    idx = args[1] if len(args) > 1 else kwargs.get("top_k_index")
    return h, idx


def input_pass(model, calib=None, samples: int | None = None, max_len: int = 128, names=None,
               observe=None, route=None, device: str | None = None, batch_size: int = 16,
               label: str = "collecting layer inputs", done=None, subset: slice | None = None):
    """Job: run the calibration inputs block by block and hand the inputs of every weight read
    as a matrix to ``observe(workbench name, x)`` (x: float32 (tokens, in) over the real,
    unpadded tokens). Linear / Conv1D weights get their module's input; an expert's weights get
    the tokens the router sent to that expert (gate / up: the block's hidden state of those
    tokens; down: act(gate)·up of those tokens); the head gets the final-normed hidden states.
    ``route(experts module names {expert: [names]}, top-k expert indices of the real tokens)``
    sees the router's choices. ``done(names)`` is called once the inputs of `names` are all
    observed (a block's tensors when the next block starts, the head's at the end), so a
    caller can finish and free their statistics block by block. `subset`: run only these of
    the calibration samples (e.g. ``slice(1, None, 2)``, every other one: a held-out fold).
    Returns the calibration samples that ran."""
    import torch
    from workbench.running.calibration import calibration_samples
    from workbench.core.progress import Progress, subjob
    runner = yield from runner_job(model, device)
    data = yield from subjob(calibration_samples(model, calib, samples, max_len), 0, 5, 100)
    if subset is not None:
        data = data[subset]
    want = None if names is None else set(names)
    lin = [n for n in runner.linear_names() if want is None or n in want]
    experts = runner.expert_names()
    by_block: dict = {}
    for n in lin:
        by_block.setdefault(runner.block_of(n), []).append(n)
    exp_block: dict = {}
    for mod, parts in experts.items():
        some = next(iter(next(iter(parts.values())).values()))[0]
        exp_block.setdefault(runner.block_of(some), []).append((mod, parts))

    def lin_hook(n):
        def hook(mod, inputs):
            x = inputs[0].detach()
            x = x.reshape(-1, x.shape[-1])
            keep = runner.current.keep.to(x.device)
            if keep.shape[0] == x.shape[0]:
                x = x[keep]
            observe(n, x.float())
        return hook

    def exp_hook(parts):
        gu = parts.get("gate_up_proj", {})
        dn = parts.get("down_proj", {})

        def hook(mod, args, kwargs):
            h, idx = _route_args(args, kwargs)
            if h is None or idx is None:
                return
            h = h.detach().reshape(-1, h.shape[-1])
            idx = idx.reshape(h.shape[0], -1)
            keep = runner.current.keep.to(h.device)
            if keep.shape[0] != h.shape[0]:
                keep = torch.ones(h.shape[0], dtype=torch.bool, device=h.device)
            if route is not None:
                route(parts, idx[keep])
            if observe is None:
                return
            for e in range(int(mod.gate_up_proj.shape[0])):
                sel = (idx == e).any(-1) & keep
                if not bool(sel.any()):
                    continue
                x = h[sel].float()
                for n in gu.get(e, []) + gu.get(None, []):
                    if want is None or n in want:
                        observe(n, x)
                targets = [n for n in dn.get(e, []) + dn.get(None, [])
                           if want is None or n in want]
                if targets:
                    with torch.no_grad():
                        g, u = torch.nn.functional.linear(
                            x, mod.gate_up_proj[e].float()).chunk(2, dim=-1)
                        inter = mod.act_fn(g) * u
                    for n in targets:
                        observe(n, inter)
        return hook

    def block_names(i):
        out = list(by_block.get(i, []))
        for _mod, parts in exp_block.get(i, []):
            out += [n for p in parts.values() for ns in p.values() for n in ns
                    if want is None or n in want]
        return out

    started: list = []

    def finished_before(i):
        if done is not None and started and started[-1] != i:
            done(block_names(started[-1]))
        started.append(i)

    def hooks(i, block):
        finished_before(i)
        hs = []
        if observe is not None:
            hs += [runner.module_of(n).register_forward_pre_hook(lin_hook(n))
                   for n in by_block.get(i, [])]
        for mod, parts in exp_block.get(i, []):
            if getattr(mod, "is_transposed", False) or not hasattr(mod, "gate_up_proj"):
                continue     # a layout the workbench does not read yet: no per-expert inputs
            hs.append(mod.register_forward_pre_hook(exp_hook(parts), with_kwargs=True))
        return hs

    batches, store, _ = yield from subjob(block_pass(runner, data, batch_size, hooks=hooks,
                                                     label=label), 5, 97, 100)
    if started:
        finished_before(None)
    try:
        head = [n for n in by_block.get("head", [])]
        if head and observe is not None:
            runner.materialize(runner.norm_params)
            try:
                for bi, b in enumerate(batches):
                    with torch.no_grad():
                        x = runner.finish(store.get(bi))
                    x = x.reshape(-1, x.shape[-1])[b.keep.to(x.device)].float()
                    for n in head:
                        observe(n, x)
            finally:
                runner.release(runner.norm_params)
            if done is not None:
                done(head)
    finally:
        store.close()
    yield Progress(100, 100, "done")
    return data


def expert_usage(model, calib=None, samples=None, max_len: int = 128):
    """Job: {workbench name of each expert weight tensor: fraction of the calibration tokens the
    router sends to that expert} (each token goes to top-k experts, so one layer's fractions
    sum to k). Merged GGUF expert tensors (all experts in one) get 1.0. Empty for a model
    without mixture-of-experts layers."""
    import torch
    runner = get_runner(model)
    counts: dict = {}
    totals: dict = {}

    def route(parts, idx):
        key = id(parts)
        n_exp = 1 + max((e for p in parts.values() for e in p if e is not None), default=-1)
        c = counts.setdefault(key, (parts, np.zeros(max(n_exp, 1))))[1]
        if n_exp:
            hit = torch.stack([(idx == e).any(-1) for e in range(n_exp)], 1)
            c += hit.sum(0).cpu().numpy()
        totals[key] = totals.get(key, 0) + int(idx.shape[0])

    if not runner.expert_names():
        return {}
    yield from input_pass(model, calib, samples, max_len, names=[], observe=None, route=route,
                          label="router choices")
    out = {}
    for key, (parts, c) in counts.items():
        tot = max(totals.get(key, 0), 1)
        for p in parts.values():
            for e, ns in p.items():
                for n in ns:
                    out[n] = 1.0 if e is None else float(c[e] / tot)
    return out

"""The model-level sensitivity measures, block by block (workbench.running.runner).

* ``fisher_pass``: a forward pass storing every block's input (an ActivationStore, spilled to
  disk beyond its budget), the probes' gradients at the head in token chunks, then backward
  block by block, each block recomputed from its stored input (block-level checkpointing):
  per parameter the sum over batches and probes of the squared gradient.
* ``output_pass``: per tensor, the model's output change with only that tensor quantized,
  starting from the cached float inputs of the tensor's block (the blocks before it are not
  re-run), against the float model's final hidden states (KL chunk by chunk at the head).
"""

from __future__ import annotations

import numpy as np

from workbench.core.progress import Progress, subjob
from workbench.running.runner_store import ActivationStore, new_budget
from workbench.running.runner_passes import _encoder_pool, _head_rows


def forward_inputs(runner, data, batch_size: int, budget, label: str):
    """Job: (batches, [stores]) with stores[i] the input of block i and stores[L] the last
    block's output (before the final norm)."""
    L = len(runner.layers)
    batches, st = runner.capture(data, batch_size, None, ActivationStore(budget))
    stores = [st]
    for i in range(L):
        yield Progress(i, L, f"{label}: block {i + 1}/{L}")
        runner.materialize(runner.layer_params[i])
        dst = ActivationStore(budget)
        try:
            runner.run_block(i, batches, stores[-1], dst)
        finally:
            runner.release(runner.layer_params[i])
        stores.append(dst)
    return batches, stores


def _rows_index(rr):
    import torch
    return torch.tensor([r[0] for r in rr]), torch.tensor([r[1] for r in rr])


#: a model whose float32 parameters take at most this many bytes is small: a pass over it
#: keeps its widened weights and its Fisher sums in RAM (`keep_resident`); a larger one reads
#: each block's weights when it runs and spills its sums to disk, so its memory stays one
#: block's (SmolLM2-135M: 0.5 GB each; Llama-3-8B: 32 GB)
RESIDENT_BYTES = 2 << 30


def keep_resident(runner) -> bool:
    """Whether `runner`'s model is small (RESIDENT_BYTES); if so its weights, once read for a
    pass, stay in `runner.resident` (cleared by the pass when it ends)."""
    m = runner.model
    small = sum(m.info(n).numel for n in m.tensors) * 4 <= RESIDENT_BYTES
    runner.resident = {} if small else None
    return small


class SquareSums(dict):
    """{parameter name: running sum of scale * grad**2} in `workbench.core.spill` arrays (a
    memory-mapped file per large parameter, updated a row chunk at a time), so the Fisher
    diagonal of a model larger than RAM never is in memory; `in_ram`: plain arrays (a small
    model's, `keep_resident`: no file's page faults and releases)."""

    def __init__(self, scale: float = 1.0, in_ram: bool = False):
        super().__init__()
        self.scale = scale
        self.in_ram = in_ram

    def slot(self, pn: str, shape) -> np.ndarray:
        """The running sum of parameter `pn` (zeros of `shape` on first use)."""
        from workbench.core import spill
        a = self.get(pn)
        if a is None:
            a = self[pn] = (np.zeros(tuple(shape), np.float32) if self.in_ram
                            else spill.zeros(tuple(shape), np.float32))
        return a

    def add(self, runner, pnames) -> None:
        """Add the squares of the current gradients of `pnames` and drop the gradients."""
        from workbench.core import spill
        for pn in pnames:
            mod, attr = runner._owner[pn]
            p = mod._parameters[attr]
            if p is None or p.grad is None:
                continue
            if p.grad.is_sparse:        # an embedding's: only the rows of the tokens seen
                g = p.grad.coalesce()
                spill.add_row_squares(self.slot(pn, g.shape), g.indices()[0].cpu().numpy(),
                                      g.values(), self.scale)
            else:
                spill.add_squares(self.slot(pn, p.grad.shape), p.grad, self.scale)
            p.grad = None

    def add_tensor(self, pn: str, g) -> None:
        """Add the squares of gradient `g` (a tensor of parameter `pn`'s shape)."""
        from workbench.core import spill
        spill.add_squares(self.slot(pn, g.shape), g, self.scale)


class HeadGrads:
    """The head's weight (and bias) gradients accumulated by hand while the head's parameters
    stay frozen. A hook on the head's output keeps each token chunk's output gradient dz and
    input x; at `flush` the weight gradient sum(dz.T @ x) is formed a vocabulary chunk at a
    time and its squares added, so no vocabulary x hidden gradient is ever whole. When the
    kept dz would outgrow a quarter of such an array (long batches: tokens > hidden / 4),
    they go into one vocabulary x hidden buffer instead (``addmm_`` in place). Autograd would
    hold the weight, its gradient and a per-chunk gradient temporary (three vocabulary x
    hidden float32 arrays, 6.3 GB for Llama-3-8B's head). Used when the head is a plain
    Linear owning its parameters."""

    #: the kept (dz, x) may hold up to 1/KEEP_DIVISOR of a vocabulary x hidden array
    KEEP_DIVISOR = 4
    #: rows of the weight gradient formed at once at `flush` (x hidden floats)
    ROW_ELEMENTS = 1 << 24

    def __init__(self, runner):
        import torch
        self.runner = runner
        head = runner.head
        self.names = {}
        for pn in runner.head_params:
            mod, attr = runner._owner[pn]
            self.names[attr] = pn
        w = head._parameters["weight"]
        self.shape = tuple(w.shape)
        self.device = w.device
        self.w = None                       # the buffer, made only when the pairs outgrow it
        self.pairs: list = []               # (dz, x) float32 per token chunk
        self.kept = 0                       # elements held in pairs
        self.limit = self.shape[0] * self.shape[1] // self.KEEP_DIVISOR
        self.b = None
        if "bias" in self.names and head._parameters.get("bias") is not None:
            self.b = torch.zeros(tuple(head._parameters["bias"].shape), dtype=torch.float32,
                                 device=w.device)
        self._handle = head.register_forward_hook(self._hook)

    @staticmethod
    def usable(runner) -> bool:
        import torch
        head = getattr(runner, "head", None)
        if not isinstance(head, torch.nn.Linear) or not runner.head_params:
            return False
        return all(runner._owner[pn][0] is head and runner._owner[pn][1] in ("weight", "bias")
                   for pn in runner.head_params)

    def _hook(self, _mod, inputs, out):
        import torch
        if not torch.is_grad_enabled() or not out.requires_grad:
            return None
        x = inputs[0].detach()

        def grab(g):
            g2 = g.reshape(-1, g.shape[-1]).float()
            x2 = x.reshape(-1, x.shape[-1]).float()
            if self.b is not None:
                self.b.add_(g2.sum(0))
            if self.w is None and self.kept + g2.numel() + x2.numel() <= self.limit:
                self.pairs.append((g2.detach().clone(), x2.clone()))
                self.kept += g2.numel() + x2.numel()
                return
            if self.w is None:
                self.w = torch.zeros(self.shape, dtype=torch.float32, device=self.device)
                for gp, xp in self.pairs:
                    self.w.addmm_(gp.t(), xp)
                self.pairs, self.kept = [], 0
            self.w.addmm_(g2.t(), x2)
        out.register_hook(grab)
        return None

    def flush(self, acc: SquareSums) -> None:
        """Squares into `acc`; the gradients start again from zero."""
        import torch
        pn = self.names["weight"]
        if self.w is not None:
            acc.add_tensor(pn, self.w)
            self.w = None
        elif self.pairs:
            from workbench.core import spill
            G = torch.cat([gp for gp, _ in self.pairs])
            X = torch.cat([xp for _, xp in self.pairs])
            self.pairs, self.kept = [], 0
            a = acc.slot(pn, self.shape)
            step = max(1, self.ROW_ELEMENTS // max(self.shape[1], 1))
            for r0 in range(0, self.shape[0], step):
                r1 = min(r0 + step, self.shape[0])
                spill.add_squares(a[r0:r1], G[:, r0:r1].t() @ X, acc.scale)
            spill.release(a)
        if self.b is not None:
            acc.add_tensor(self.names["bias"], self.b)
            self.b.zero_()

    def close(self) -> None:
        self._handle.remove()
        self.w = self.b = None
        self.pairs = []


def _logit_probe(z, gen):
    """A probe of the logits' Fisher information diag(p) - p p^T (p = softmax(z)) with
    Gaussian rather than categorical draws: sqrt(p) * e - p (sqrt(p) . e), e ~ N(0, I). Its
    covariance is the same as the score's e_y - p for y ~ p, but a peaked p no longer makes
    rare labels carry the estimate (less variance per probe)."""
    import torch
    p = torch.softmax(z.float(), dim=-1)
    e = torch.randn(p.shape, generator=gen, dtype=torch.float32).to(p.device)
    se = e.mul_(p.sqrt())                   # sqrt(p) * e, in place: a vocabulary-wide array
    s = se.sum(-1, keepdim=True)            # of float32 per token is the step's largest
    v = se.sub_(p.mul_(s))
    return v.to(z.dtype)


def fisher_pass(runner, data, probes: int = 2, batch_size: int = 8, seed: int = 0,
                on_final=None):
    """Job: ({param name: sum of squared probe gradients / probes (float32, the parameter's
    shape; a `SquareSums`, large ones memory-mapped files)}, count) — see
    workbench.planning.fisher.fisher_diagonals for the probes. `on_final(param names, acc,
    count)`: called as soon as those parameters' sums are final (a block's once its backward
    is done, the rest at the end), so a caller can start on them while the pass goes on."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    small = keep_resident(runner)
    try:
        return (yield from _fisher_pass(runner, data, probes, batch_size, gen, on_final, small))
    finally:
        runner.resident = None


def _fisher_pass(runner, data, probes, batch_size, gen, on_final, small):
    import torch
    budget = new_budget()
    L = len(runner.layers)
    # one fraction for the whole pass, never going back (a line's ETA extrapolates it): the
    # forward 0-35 %, the head 35-45 %, the blocks' backward 45-100 %
    batches, stores = yield from subjob(forward_inputs(runner, data, batch_size, budget,
                                                       "output gradients (forward)"),
                                        0, 35, 100)
    grads = ActivationStore(budget)
    acc = SquareSums(1.0 / probes, in_ram=small)
    count = 0
    top = runner.norm_params + runner.head_params
    hand = runner.kind != "encoder" and HeadGrads.usable(runner)
    if hand:
        runner.materialize(runner.norm_params, grad=True)
        runner.materialize(runner.head_params, grad=False)
        hg = HeadGrads(runner)
        top = runner.norm_params
    else:
        runner.materialize(top, grad=True)
        hg = None
    try:
        for bi, b in enumerate(batches):
            yield Progress(35 + 10 * bi / max(len(batches), 1), 100, "output gradients (head)")
            h = stores[L].get(bi).detach().requires_grad_(True)
            for k in range(probes):
                with torch.enable_grad():
                    x = runner.finish(h)
                    if runner.kind == "encoder":
                        m = torch.from_numpy(b.mask).to(x.device).unsqueeze(-1).to(x.dtype)
                        pooled = (x * m).sum(1) / m.sum(1).clamp(min=1)
                        bd = pooled.detach().float()
                        nrm = bd.norm(dim=1, keepdim=True).clamp(min=1e-30)
                        u = bd / nrm
                        z = torch.randn(bd.shape, generator=gen, dtype=torch.float32)
                        z = z - (z * u).sum(1, keepdim=True) * u
                        obj = (pooled.float() * (z / nrm).to(pooled.device)).sum()
                        obj.backward()
                        if k == 0:
                            count += b.ids.shape[0]
                    else:
                        rows = _head_rows(b)
                        step = runner.token_chunk()
                        chunks = list(range(0, len(rows), step))
                        for ci, c in enumerate(chunks):
                            rr = rows[c:c + step]
                            ii, tt = _rows_index(rr)
                            z = runner.logits(x[ii, tt])
                            obj = (z * _logit_probe(z.detach(), gen)).sum()
                            obj.backward(retain_graph=ci < len(chunks) - 1)
                        if k == 0:
                            count += len(rows)
                acc.add(runner, top)
                if hg is not None:
                    hg.flush(acc)
                g = h.grad if h.grad is not None else torch.zeros_like(h)
                grads.put((bi, k), g.detach().clone())
                h.grad = None
    finally:
        if hg is not None:
            hg.close()
        runner.release(runner.norm_params + runner.head_params)
    stores[L].close()
    for i in reversed(range(L)):
        yield Progress(45 + 55 * (L - 1 - i) / L, 100, f"output gradients: block {i + 1}/{L}")
        pn = runner.layer_params[i]
        runner.materialize(pn, grad=True)
        try:
            for bi, b in enumerate(batches):
                runner.current = b
                h = stores[i].get(bi).detach().requires_grad_(True)
                with torch.enable_grad():
                    out = runner.call_block(i, b, h)
                    for k in range(probes):
                        out.backward(grads.get((bi, k)).to(out.dtype),
                                     retain_graph=k < probes - 1)
                        acc.add(runner, pn)
                        g = h.grad if h.grad is not None else torch.zeros_like(h)
                        grads.put((bi, k), g.detach().clone())
                        h.grad = None
                runner.current = None
        finally:
            runner.release(pn)
        stores[i + 1].close() if i + 1 < L else None
        if on_final is not None:         # (a parameter that blocks share waits for the last)
            later = {p for j in range(i) for p in runner.layer_params[j]} | set(runner.pre_params)
            on_final([p for p in pn if p not in later], acc, count)
    # the embeddings: their forward again, with gradients, up to the first block; a lookup
    # table's gradient is sparse (the rows of the tokens seen), never a dense table's size
    runner.materialize(runner.pre_params, grad=True)
    sparse = _sparse_lookups(runner, runner.pre_params)
    try:
        from workbench.running.runner_store import Batch
        for bi, b in enumerate(batches):
            bb = Batch(b.ids, b.mask, [None] * L)
            bb.first = None
            runner._run_capture(bb, grad=True, only_first=True)
            if bb.first.requires_grad:
                for k in range(probes):
                    bb.first.backward(grads.get((bi, k)).to(bb.first.dtype),
                                      retain_graph=k < probes - 1)
                    acc.add(runner, runner.pre_params)
    finally:
        for mod, was in sparse:
            mod.sparse = was
        runner.release(runner.pre_params)
        stores[0].close()
        grads.close()
    if on_final is not None:
        on_final(list(acc), acc, count)     # the rest (the callee skips what it has had)
    return acc, count


def _sparse_lookups(runner, pnames) -> list:
    """Make the `torch.nn.Embedding` modules owning `pnames` give sparse weight gradients (a
    dense one is the whole table again: 2.1 GB for Llama-3-8B's); [(module, its old flag)]."""
    import torch
    out = []
    for pn in pnames:
        mod, attr = runner._owner[pn]
        if isinstance(mod, torch.nn.Embedding) and attr == "weight" and not mod.sparse:
            out.append((mod, mod.sparse))
            mod.sparse = True
    return out


def by_tensor(runner, model, acc: dict) -> dict:
    """{workbench name: F in the tensor's own shape} from per-parameter sums (a tied table's
    two uses add up; fused experts give each expert's slice). Views of `acc`'s arrays where
    the layout allows, else copies made a row chunk at a time (`workbench.core.spill`)."""
    from workbench.core import spill
    out: dict = {}
    for pn, a in acc.items():
        for n in runner._source(pn):
            slot = runner.slots[n]
            region = slot.region(a) if slot.param == pn or slot.expert is not None \
                or slot.parts > 1 else a
            shape = tuple(model.info(n).shape)
            r = region
            if r.shape != shape:
                r = r.T if r.ndim == 2 and r.T.shape == shape else r.reshape(shape)
            r = spill.contiguous(r)
            if n in out:     # a tied table's second use: added into the first's region
                s = out[n]
                if not (s.flags.writeable and s.flags.c_contiguous):
                    s = spill.to_disk(s)
                spill.add_into(s, r)
                out[n] = s
            else:
                out[n] = r
    return out


def _measure(runner, batches, base, quant, qhead=None) -> float:
    """Mean KL(base || quant) per predicted token (causal LM; head materialized by the
    caller) or mean 1 - cosine of the pooled states (encoder), from final-normed stores."""
    import torch
    if runner.kind == "encoder":
        tot, n = 0.0, 0
        for bi, b in enumerate(batches):
            pb = _encoder_pool(runner, base.get(bi), b).astype(np.float64)
            pq = _encoder_pool(runner, quant.get(bi), b).astype(np.float64)
            cos = (pb * pq).sum(1) / np.maximum(np.linalg.norm(pb, axis=1)
                                                 * np.linalg.norm(pq, axis=1), 1e-300)
            tot += float((1.0 - cos).sum())
            n += len(cos)
        return tot / max(n, 1)
    tot, cnt = 0.0, 0
    step = runner.token_chunk()
    for bi, b in enumerate(batches):
        rows = _head_rows(b)
        hb, hq = base.get(bi), quant.get(bi)
        for c in range(0, len(rows), step):
            ii, tt = _rows_index(rows[c:c + step])
            with torch.no_grad():
                lb = torch.log_softmax(runner.logits(hb[ii, tt]).double(), -1)
                lq = torch.log_softmax(runner.logits(hq[ii, tt], qhead).double(), -1)
            tot += float((lb.exp() * (lb - lq)).sum())
            cnt += len(ii)
    return tot / max(cnt, 1)


def output_pass(runner, data, items, batch_size: int = 16):
    """Job: {key: measured output change} for `items` [(key, workbench name, override)] —
    each with only that tensor changed (override(name) -> array | None)."""
    budget = new_budget()
    L = len(runner.layers)
    batches, stores = yield from forward_inputs(runner, data, batch_size, budget,
                                                "original model")
    base = ActivationStore(budget)
    for bi in range(len(batches)):
        base.put(bi, stores[L].get(bi))
    runner.finish_store(batches, base)
    order = {"pre": -1, "norm": L, "head": L + 1}
    items = sorted(items, key=lambda it: order.get(runner.block_of(it[1]), runner.block_of(it[1])))
    out = {}
    head_on = runner.kind != "encoder"
    try:
        for j, (key, name, ov) in enumerate(items):
            yield Progress(j, len(items), f"output change {j + 1}/{len(items)} {name}")
            blk = runner.block_of(name)
            cur = ActivationStore(budget)
            try:
                if blk == "pre":
                    _, st = runner.capture(data, batch_size, ov, cur)
                    start = 0
                elif blk in ("norm", "head"):
                    for bi in range(len(batches)):
                        cur.put(bi, stores[L].get(bi))
                    start = L
                else:
                    for bi in range(len(batches)):
                        cur.put(bi, stores[blk].get(bi))
                    start = blk
                for i in range(start, L):
                    runner.materialize(runner.layer_params[i], ov if i == blk else None)
                    try:
                        runner.run_block(i, batches, cur, cur)
                    finally:
                        runner.release(runner.layer_params[i])
                runner.finish_store(batches, cur, ov if blk == "norm" else None)
                if head_on:
                    qhead = runner.head_weights(ov)     # the head itself, or a tied table
                    runner.materialize(runner.head_params)
                    try:
                        out[key] = _measure(runner, batches, base, cur, qhead)
                    finally:
                        runner.release(runner.head_params)
                else:
                    out[key] = _measure(runner, batches, base, cur)
            finally:
                cur.close()
    finally:
        base.close()
        for s in stores:
            s.close()
    return out

"""Does weighting an expert's error by its routed-token fraction predict what quantizing it does to
the model's outputs? ``python -m workbench.bench.moe FOLDER [--scheme q2_k] [--samples 8]``

For every per-expert tensor of a Hugging Face MoE folder (qwen3_moe / qwen2_moe / mixtral /
deepseek): quantize that tensor alone, run the calibration samples, and measure the mean KL
divergence of the next-token distributions from the original model's (nats per token). Prints
the Spearman rank correlation over tensors of that measured KL with the plain squared weight
error and with the usage-weighted error (workbench.running.moe.expert_usage), the figures docs/moe.md
quotes.
"""

from __future__ import annotations

import argparse
import re
import sys
import time

import numpy as np


def _expert_slot(net, name: str):
    """(fused parameter, expert, row slice) holding HF per-expert tensor `name` in the network."""
    from workbench.formats.catalog import block_index, expert_index, projection
    b, e, proj = block_index(name), expert_index(name), projection(name)
    mods = dict(net.named_modules())
    cands = [m for m in mods if re.search(rf"layers\.{b}\.(?:mlp|block_sparse_moe)\.experts$", m)]
    exp = mods[cands[0]]
    if proj == "down":
        return exp.down_proj, e, slice(None)
    inter = exp.gate_up_proj.shape[1] // 2
    return exp.gate_up_proj, e, (slice(0, inter) if proj == "gate" else slice(inter, None))


def measure(folder, scheme: str = "q2_k", samples: int = 8, out=sys.stdout) -> dict:
    import torch
    from workbench.running.calibration import calibration_samples
    from workbench.formats.loaders import open_model
    from workbench.running.moe import _net_with_weights, expert_usage
    from workbench.core.progress import run
    from workbench.quant.streaming import dequantized
    from workbench.planning.output_measure import spearman
    model = open_model(folder)
    t0 = time.perf_counter()
    usage = run(expert_usage(model, samples=samples))
    t_usage = time.perf_counter() - t0
    net = _net_with_weights(model)
    data = run(calibration_samples(model, None, samples, 128))

    def logprobs():
        res = []
        with torch.no_grad():
            for s in data:
                ids = torch.from_numpy(np.asarray(s, np.int64)[None])
                res.append(torch.log_softmax(net(input_ids=ids).logits[0, :-1].float(), -1))
        return res
    base = logprobs()
    names = sorted(usage)
    kl, sse = {}, {}
    for n in names:
        w = model.read(n)
        q = dequantized(model, n, scheme)
        sse[n] = float(((q.astype(np.float64) - w) ** 2).sum())
        p, e, rows = _expert_slot(net, n)
        old = p.data[e, rows].clone()
        with torch.no_grad():
            p.data[e, rows] = torch.from_numpy(np.array(q, np.float32))
        try:
            quant = logprobs()
        finally:
            with torch.no_grad():
                p.data[e, rows] = old
        kl[n] = float(np.mean([(b.exp() * (b - a)).sum(-1).mean().item()
                               for b, a in zip(base, quant)]))
    weighted = {n: sse[n] * usage[n] for n in names}
    res = {"model": str(folder), "scheme": scheme, "tensors": len(names), "samples": len(data),
           "spearman_sse_vs_kl": spearman([sse[n] for n in names], [kl[n] for n in names]),
           "spearman_weighted_vs_kl": spearman([weighted[n] for n in names],
                                               [kl[n] for n in names]),
           "usage_seconds": t_usage}
    print(f"{folder}: {len(names)} expert tensors, {scheme} one at a time, {len(data)} samples; "
          f"Spearman vs measured KL: plain sse {res['spearman_sse_vs_kl']:.3f}, "
          f"usage-weighted {res['spearman_weighted_vs_kl']:.3f} "
          f"(expert_usage {t_usage:.1f} s)", file=out)
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbench.bench.moe")
    p.add_argument("folder")
    p.add_argument("--scheme", default="q2_k")
    p.add_argument("--samples", type=int, default=8)
    a = p.parse_args(argv)
    measure(a.folder, a.scheme, a.samples)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

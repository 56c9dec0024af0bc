"""The synthetic method table of docs/methods.md (numpy only, a few seconds):

    python -m workbench.bench.synthetic_figures [SCHEMES] [METHODS]

The inputs of ``tests/workbench/test_methods_formats.py`` (``synthetic_data``: correlated,
heavy-tailed inputs with outlier channels; W 32×512): statistics from the first 4000 rows,
error on the 2000 held-out rows. Per scheme, each method's relative layer output error
‖X(W − Ŵ)ᵀ‖²/‖XWᵀ‖², Ŵ = ``Method.effective_weight`` (AWQ with ``fold=True``: the 1/s is
taken as folded into the preceding op, as the test does).
"""
from __future__ import annotations

import sys
import time

import numpy as np

SCHEMES = ("int4-g128", "int3-g64", "q4_0", "q5_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k")
METHODS = ("rtn", "imatrix", "gptq", "awq")


def synthetic_data(rows=32, cols=512, n=6000, seed=0):
    """W [rows, cols] and X [n, cols] (float32): X = t₆ noise mixed by I + N(0, 1/cols),
    with per-channel log-normal scales (outlier channels)."""
    rng = np.random.default_rng(seed)
    mix = rng.normal(size=(cols, cols)) / np.sqrt(cols) + np.eye(cols)
    X = (rng.standard_t(6, size=(n, cols)) @ mix) * np.exp(rng.normal(0, 0.8, size=cols))
    W = rng.normal(0, 0.05, size=(rows, cols))
    return W.astype(np.float32), X.astype(np.float32)


def relative_errors(scheme_name, methods=METHODS, data=None):
    """{method: ‖Xh(W − Ŵ)ᵀ‖²/‖Xh Wᵀ‖²} on the held-out rows."""
    from workbench.schemes import get_scheme
    from workbench.quant.methods import LayerStats, get_method
    W, X = synthetic_data() if data is None else data
    st, Xh = LayerStats.from_inputs(X[:4000]), X[4000:]
    scheme = get_scheme(scheme_name)
    ref = float(np.sum((Xh @ W.T) ** 2))
    out = {}
    for m in methods:
        meth = get_method(m)
        qt = meth.quantize(W, scheme, st, fold=True) if m == "awq" else meth.quantize(W, scheme, st)
        wq = meth.effective_weight(qt, scheme)
        out[m] = float(np.sum((Xh @ (W - wq).T) ** 2)) / ref
    return out


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    schemes = argv[0].split(",") if argv else list(SCHEMES)
    methods = argv[1].split(",") if len(argv) > 1 else list(METHODS)
    data = synthetic_data()
    t = time.time()
    print("| scheme | " + " | ".join(methods) + " |")
    print("|---" * (len(methods) + 1) + "|", flush=True)
    for sn in schemes:
        e = relative_errors(sn, methods, data)
        print(f"| {sn} | " + " | ".join(f"{e[m]:.5f}" for m in methods) + " |", flush=True)
    print(f"({time.time() - t:.1f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()

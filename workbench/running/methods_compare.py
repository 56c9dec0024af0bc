"""One tensor under (scheme, method) pairs: what the GUI's comparison view shows per method.

    stats = run(tensor_stats(model, [name, *awq_peers], calib))      # one calibration pass
    mr = run(evaluate_method(model, name, "int4-g128", "gptq", stats))
    mr.result          # the TensorResult `evaluate --method gptq` reports (weight error, bytes)
    mr.out_rel         # ‖X(W − Ŵ)ᵀ‖² / ‖X Wᵀ‖² on the calibration inputs X (LayerStats.X)
    mr.out_sqnr_db     # −10·log10(out_rel): the layer output SQNR

Everything goes through the CLI's code: ``running.methods_apply.prepare`` (given the statistics, so the
model runs once per tensor, not once per pair) builds the MethodModel of a plan that assigns
(scheme, method) to `name`, ``evaluate.evaluate_tensor`` measures it, and Ŵ is the weight the
folded model computes with, mapped back (``MethodModel.unfold``), as ``workbench.bench.minilm_figures`` does.

AWQ folds its scale into the op producing the layer's input only when every consumer of that
input uses awq (``apply.fold_groups``): `peers` gives the other tensors of that fold group (and
the consumers `name` produces for) with the (scheme, method) the current plan gives them, so a
pair is measured as assigning it in that plan would quantize it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.quant.plan import KEEP, Plan
from workbench.core.progress import Progress
from workbench.schemes import get_scheme


@dataclass
class MethodResult:
    result: object                  # workbench.quant.evaluate.TensorResult (requested scheme, method)
    out_rel: float | None           # relative layer output error on the calibration inputs
    notes: list = field(default_factory=list)

    @property
    def scheme(self) -> str:
        return self.result.requested

    @property
    def method(self) -> str:
        return self.result.method

    @property
    def out_sqnr_db(self) -> float | None:
        if self.out_rel is None:
            return None
        return math.inf if self.out_rel <= 0 else -10.0 * math.log10(self.out_rel)


def applies(method: str, scheme: str) -> str | None:
    """None when `method` can quantize with `scheme` (and the method changes anything), else
    why not (keep and 16/32-bit floats store the weights as they are)."""
    from workbench.quant.methods.base import get_method
    if scheme == KEEP:
        return "keep stores the tensor unchanged"
    s = get_scheme(scheme)
    if s.nominal_bits >= 16:
        return f"{scheme} is not a quantizing scheme"
    return get_method(method).supports(s)


def peers_of(model, name: str) -> list[str]:
    """The other 2-D tensors whose AWQ fold involves `name`: those reading the same input
    (the same ``fold_target``) and those `name` produces the input of."""
    from workbench.quant.methods.awq import fold_target
    mine = fold_target(name)
    stem = name[:-len(".weight")] if name.endswith(".weight") else name
    out = []
    for n, info in model.tensors.items():
        if n == name or info.ndim != 2:
            continue
        t = fold_target(n)
        if t is not None and (t == mine or t == stem):
            out.append(n)
    return sorted(out)


def context_plan(name: str, scheme: str, method: str, peers: dict | None = None) -> Plan:
    """A plan assigning (scheme, method) to `name` and {peer: (scheme, method)} to its peers;
    everything else kept."""
    peers = dict(peers or {})
    plan = Plan(KEEP).with_assignments({**{p: s for p, (s, _m) in peers.items()}, name: scheme})
    by_method: dict[str, list[str]] = {}
    for p, (_s, m) in peers.items():
        by_method.setdefault(m or "rtn", []).append(p)
    by_method.setdefault(method, []).append(name)
    for m, names in by_method.items():
        if m != "rtn":
            plan = plan.with_method(m, names)
    return plan


def tensor_stats(model, names, calib=None, samples: int | None = None):
    """Job: {name: LayerStats} of the Linear inputs among `names` (one pass over `calib`,
    default the shipped calibration text). Raises WorkbenchError when the model is not runnable."""
    from workbench.running.methods_apply import collect_stats
    got = yield from collect_stats(model, calib, names=set(names), samples=samples, want_h=True)
    return got


def layer_output_error(X, w0, wq) -> float:
    """‖X(W − Ŵ)ᵀ‖² / ‖X Wᵀ‖² (float64 sums)."""
    X = np.asarray(X, np.float32)
    D = X @ (np.asarray(w0, np.float32) - np.asarray(wq, np.float32)).T
    R = X @ np.asarray(w0, np.float32).T
    num = float(np.einsum("ij,ij->", D, D, dtype=np.float64))
    den = float(np.einsum("ij,ij->", R, R, dtype=np.float64))
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


def evaluate_method(model, name: str, scheme: str, method: str, stats: dict,
                    peers: dict | None = None, runtime: str = "any"):
    """Job: the MethodResult of `name` under (`scheme`, `method`) given calibration `stats`
    ({name: LayerStats}, from :func:`tensor_stats`); `peers` as :func:`context_plan`."""
    from workbench.quant.evaluate import evaluate_tensor, quantize
    from workbench.quant.runtimes import decide
    from workbench.running.methods_apply import prepare
    why = applies(method, scheme) if method != "rtn" else None
    if why:
        raise WorkbenchError(f"method {method} does not apply: {why}", tensor=name)
    info = model.info(name)
    plan = context_plan(name, scheme, method, peers)
    mm = yield from prepare(model, plan, runtime=runtime, stats=stats)
    decision = decide(info, scheme, runtime)
    memo = {}
    qfn = getattr(mm, "quantize_tensor", None)
    if qfn is not None:
        def quantize_tensor(n, w, s, _f=qfn):      # evaluate_tensor and Ŵ share one quantization
            key = (n, s)
            if key not in memo:
                memo[key] = _f(n, w, s)
            return memo[key]
        mm.quantize_tensor = quantize_tensor
    # a tensor whose weights an AWQ fold changed must not share the plain result's cache entry
    # (evaluate_tensor keys rtn results by file, tensor and scheme only)
    folded = name in getattr(mm, "folded_names", ())
    r = evaluate_tensor(mm, name, scheme, decision=decision,
                        **({"cache": None} if folded else {}))
    yield Progress(1, 2, f"{scheme} · {method}")
    st = stats.get(name)
    out = None
    if st is not None and st.X is not None and decision.applied != KEEP:
        w0 = model.read_matrix(name)
        applied = decision.applied
        if qfn is not None and (mm.method_of(name) != "rtn" or name in mm.folded_names):
            qt = mm.quantize_tensor(name, mm.read_matrix(name), applied)
            wq = mm.unfold(name, get_scheme(applied).dequantize(qt).reshape(w0.shape))
        else:
            wq = get_scheme(applied).dequantize(quantize(w0, applied, tensor=name)) \
                .reshape(w0.shape)
        out = layer_output_error(st.X, w0, wq)
    notes = list(getattr(mm, "notes", []) or [])
    if method != "rtn" and st is None:
        notes.append(f"{name} is not the input of a Linear layer: {method} falls back to rtn")
    yield Progress(2, 2, f"{scheme} · {method}")
    return MethodResult(r, out, notes)


def compare_methods(model, name: str, schemes, methods, calib=None, peers: dict | None = None):
    """Job: {(scheme, method): MethodResult} for every pair the method applies to (one
    calibration pass; awq peers' statistics included)."""
    from workbench.core.progress import subjob
    awq_peers = [p for p, (_s, m) in (peers or {}).items() if m == "awq"]
    stats = yield from subjob(tensor_stats(model, [name, *awq_peers], calib), 0, 30, 100)
    pairs = [(s, m) for s in schemes for m in methods if m == "rtn" or applies(m, s) is None]
    out = {}
    for i, (s, m) in enumerate(pairs):
        out[(s, m)] = yield from subjob(evaluate_method(model, name, s, m, stats, peers),
                                        30 + 70 * i / max(len(pairs), 1),
                                        70 / max(len(pairs), 1), 100)
    return out

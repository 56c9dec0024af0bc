"""The method as a dimension of the allocation: (scheme, method) pairs per tensor.

A tensor stored under one scheme takes the same bytes whatever method chose its codes (rtn,
imatrix, gptq), so the knapsack over (scheme, method) pairs is the knapsack over schemes with
each scheme's value the least over its methods. Per Linear weight and scheme the allocator
therefore needs each method's error on one scale, measured on text the method was not fitted
to: the calibration samples are cut into two folds (even and odd samples), each method fits its
statistics on the even fold (``running.methods_apply.collect_stats``: E[x²] for imatrix, GPTQ's
H = 2 E[x xᵀ]) and one quantization per (tensor, applied scheme, method) is scored on the odd
fold's C = E[x xᵀ], the layer input's second-moment matrix:

    e_m = Σ_i a_i · ΔW_i C_held ΔW_iᵀ,   ΔW = Ŵ_m − W

the layer's output error with every output row i weighted by a_i: how much a change of that
output reaches the model's output (the ``fisher`` measure's diagonal summed over the row's
inputs, a Kronecker-factored Fisher; 1 for the other measures). Scoring on the fit's own C
rewards overfitting: on SmolLM2-135M, GPTQ fitted and scored on the same 64 calibration lines
was chosen for 205 tensors and raised llama.cpp's held-out KL divergence (docs/methods.md).
The full matrix C matters: GPTQ's compensation makes errors that cancel through the
correlations of the inputs, which a diagonal measure (fisher, activation) cannot see — on
MiniLM's layer-0 FFN down projection at q4_0 GPTQ has 1.8x rtn's diagonal error but 0.085x its
full one.

The table's value of a pair is the measure's own value of rtn times e_best / e_rtn, so that
rtn-only tables (``--methods rtn``) are exactly today's, and a method only lowers a value where
it lowers the layer's estimated output error. ``SensitivityTable.methods`` records the chosen
method per (tensor, scheme); `plan_with_methods` writes the chosen tensor's method into the
plan's rules, and the exporters apply it (``running.methods_apply.prepare``, on the same calibration
text: give ``export`` the same ``--calib``).

AWQ is not a candidate: its scale is folded into the op before the layer, shared by every
tensor reading that input, so its effect on one tensor is not separable from its neighbours'.
"""

from __future__ import annotations

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.quant.plan import KEEP
from workbench.core.progress import Progress
from workbench.planning.measures import get_measure

#: the methods `allocate` weighs by default when calibration statistics can be collected.
#: Every one is judged on the held-out fold, on the pairs near the solution of the rtn table
#: (`near_choices`; `weigh_methods`)
DEFAULT_METHODS = ("rtn", "imatrix", "gptq")
#: methods the first solve uses (on every pair); the others are weighed only near the solution
CHEAP_METHODS = ("rtn",)
PAIR_METHODS = ("rtn", "imatrix", "gptq")
#: rounds of weighing the costly methods around the solution of the table so far
NEAR_ROUNDS = 4
#: --methods auto on a causal LM for these targets (others: rtn; `default_methods`)
CAUSAL_LM_METHODS = {"mlx": ("rtn", "imatrix")}
#: targets whose methods, gptq not among them, are judged on the held-out fold's diagonal
#: E[x²] rather than its full C (no Hessian passes: `method_pairs`' ``diagonal``)
DIAGONAL_TARGETS = ("mlx",)


def parse_methods(text: str | None) -> list[str] | None:
    """The --methods value: None for "auto", else the validated list (rtn always included:
    it is the reference every other method's estimate is a ratio to)."""
    if text is None or text.strip() == "auto":
        return None
    out = []
    for m in (t.strip().lower() for t in text.split(",")):
        if not m:
            continue
        if m not in PAIR_METHODS:
            extra = " (awq's fold couples the tensors sharing an input: export with the " \
                    "method awq)" if m == "awq" else ""
            raise WorkbenchError(f"methods={text.strip()!r}: unknown or unsupported method "
                                 f"{m!r} (choose from {', '.join(PAIR_METHODS)}){extra}",
                                 params=("methods",))
        out.append(m)
    return list(dict.fromkeys(["rtn"] + out))


def default_methods(measure: str, runnable: bool, kind: str | None = None,
                    target: str = "any") -> list[str]:
    """--methods auto: rtn, imatrix and gptq (DEFAULT_METHODS) when the measure weighs the
    layer outputs (fisher, activation, output), the model runs on calibration text and is not
    a causal LM; rtn otherwise. The ``weight`` measure scores the weights themselves, where
    rtn is already the best. A causal LM (`kind` "causal-lm") gets rtn: its calibration lines
    are short contexts, unlike the long ones it is used and judged on, and methods chosen on
    them (even judged on a held-out fold of them) raised llama.cpp's KL divergence on held-out
    text: SmolLM2-135M at the bytes of llama.cpp's Q4_K_M, 0.0871 with gptq on 173 tensors
    and imatrix on 34 against 0.0635 with rtn (docs/methods.md); `--methods rtn,imatrix,gptq`
    still weighs them. The ``mlx`` target weighs rtn and imatrix on a causal LM
    (CAUSAL_LM_METHODS): its rtn is mlx's min-max rounding (no scale search, unlike llama.cpp's
    K-quants), which the weighted search cuts far more (SmolLM2-135M, held-out fold, output
    error against rtn: imatrix 0.29-0.79x, gptq 0.33-1.02x at mlx-q2/q3/q4-g64 and nvfp4 on
    three layers; docs/methods.md); gptq (its Hessians: minutes a fold) only when asked."""
    if not (runnable and get_measure(measure).reads_calibration):
        return ["rtn"]
    if kind != "causal-lm":
        return list(DEFAULT_METHODS)
    return list(CAUSAL_LM_METHODS.get(target, ("rtn",)))


def _kind(model) -> str | None:
    """"causal-lm" / "encoder" from the model's config.json, None when it cannot be told."""
    try:
        from workbench.running.runner_config import model_kind, read_config
        return model_kind(read_config(model))
    except Exception:   # noqa: BLE001 - unknown kind: the general default
        return None


def row_weights_from_fisher(model, calib, samples) -> dict:
    """{name: a_i per output row}: the fisher diagonal summed over each row's inputs (the
    diagonals `fisher_diagonals` cached for the table are reused)."""
    from workbench.core.progress import run
    from workbench.planning.fisher import fisher_diagonals
    diag, _count = run(fisher_diagonals(model, calib, samples))
    out = {}
    for n, f in diag.items():
        f = np.asarray(f)
        if f.ndim == 2:
            out[n] = np.asarray(f, np.float64).sum(1)
    return out


def output_error(dw: np.ndarray, C: np.ndarray, a: np.ndarray | None) -> float:
    """Σ_i a_i ΔW_i C ΔW_iᵀ (a None: all ones). The product ΔW C runs in C's dtype (the
    allocator passes a float32 C: half the time of float64, about 1e-7 relative), the rest
    in float64."""
    dw = np.asarray(dw)
    if np.ndim(C) == 1:     # the diagonal of C (E[x²]): Σ_j ΔW_ij² C_jj
        q = (np.asarray(dw, np.float64) ** 2 @ np.asarray(C, np.float64))
        return float(q.sum() if a is None else q @ a)
    q = (np.asarray(dw @ C, np.float64) * dw).sum(1)
    return float(q.sum() if a is None else q @ a)


def held_c(stats) -> np.ndarray:
    """C = H / 2 of `stats` as float32, for `output_error`; statistics without a Hessian give
    its diagonal E[x²] (1-D)."""
    if getattr(stats, "H", None) is None:
        return np.asarray(stats.d, np.float64)
    return (np.asarray(stats.H, np.float64) / 2.0).astype(np.float32)


def pair_errors(w: np.ndarray, scheme: str, stats, methods, a=None, tensor=None,
                factor=None, held=None, C=None) -> dict:
    """{method: e_m} for one weight matrix and applied scheme (methods that do not support the
    scheme are left out; rtn is always there). The methods fit on `stats`; the error is
    measured on `held` (the held-out fold's statistics: C = H/2 of samples the methods never
    saw), or on `stats` itself when `held` is None. `factor`: GPTQ's `hessian_factor` of
    this weight from `stats`, computed once for all its schemes; `C`: `held_c` of the
    statistics the error is measured on, computed once (default: here)."""
    from workbench.quant.accel import dequantize
    from workbench.quant.evaluate import quantize
    from workbench.quant.methods.base import get_method
    from workbench.schemes import get_scheme
    sch = get_scheme(scheme)
    if C is None:
        C = held_c(held if held is not None else stats)
    out = {}
    for m in methods:
        if m == "rtn":
            qt = quantize(w, scheme, tensor=tensor)
        else:
            meth = get_method(m)
            if meth.supports(sch) is not None:
                continue
            opts = {"factor": factor} if m == "gptq" and factor is not None else {}
            qt = meth.quantize(w, sch, stats, tensor=tensor, **opts)
        wq = dequantize(qt).reshape(w.shape)
        out[m] = output_error(wq - w, C, a)
    return out


#: output rows a method is weighed on per tensor (every row of a smaller tensor): rtn, imatrix
#: and GPTQ quantize each row on its own (GPTQ with the tensor's shared inverse Hessian), so
#: the ratio e_m / e_rtn over a sample of rows estimates the whole tensor's at a fraction of
#: the cost; the export quantizes every row
METHOD_ROWS = 128


def row_local(scheme) -> bool:
    """Whether `scheme` quantizes every output row on its own (its blocks and scales never span
    two rows), so that a subset of rows quantizes as it does inside the whole tensor."""
    from workbench.schemes import get_scheme
    from workbench.schemes.ggml.common import GGMLScheme
    from workbench.schemes.integer import IntAffine
    sch = get_scheme(scheme)
    from workbench.schemes.mlx import MLXScheme
    if isinstance(sch, (GGMLScheme, MLXScheme)):    # groups within a row
        return True
    if isinstance(sch, IntAffine):
        return type(sch.gran).__name__ != "PerTensor"
    return False


def sample_rows(scores, limit: int = METHOD_ROWS) -> tuple[np.ndarray, np.ndarray]:
    """`workbench.planning.estimate.proportional_rows` with the methods' row count."""
    from workbench.planning.estimate import proportional_rows
    return proportional_rows(scores, limit)


#: calibration samples below which the held-out fold is too small to judge a method by: the
#: methods are then not weighed (rtn only), and the summary says why
MIN_FOLD_SAMPLES = 4


def method_pairs(model, table, methods, calib=None, row_weights: dict | None = None,
                 runtime: str = "any", only: dict | None = None, stats=None,
                 want_h: bool | None = None, diagonal: bool = False):
    """Job: fold the methods into `table` (a SensitivityTable, changed in place): for every
    Linear weight with calibration statistics and every candidate scheme a method supports,
    value(n, s) *= e_best / e_rtn and ``table.methods[(n, s)] = best``. Returns a summary
    dict (tensors, pairs, seconds, won: {method: pairs it won}).

    The methods are judged on text they were not fitted to: the calibration samples are cut
    into two folds (even and odd samples); every method fits its statistics on the even
    fold (imatrix's E[x²], GPTQ's Hessian) and each error e_m is measured on the odd fold's
    C. A method that only fits its own calibration text (GPTQ on a few thousand tokens
    overfits a 1536-column Hessian) loses there to rtn and is not chosen; one chosen has
    lowered the output error on samples it never saw. The export then fits the chosen
    method on the whole calibration text.

    `only`: {tensor: schemes} to weigh (others keep what an earlier call gave them); `stats`:
    the (fit, held) statistics of an earlier call (returned as ``summary["stats"]``) instead of
    two new passes; `want_h`: collect the fit fold's Hessians (default: when gptq is weighed);
    `diagonal`: no Hessians at all, the held-out error is the diagonal one, Σ_i a_i Σ_j ΔW_ij²
    E_held[x_j²] (imatrix's own objective; for methods without gptq, whose compensation only
    the full C sees: a pass of E[x²] per fold instead of in x in matrices).
    A value is always the measure's rtn value times e_best / e_rtn, whichever call set it."""
    import time

    from workbench.running.calibration import calibration_samples
    from workbench.running.methods_apply import collect_stats
    from workbench.core.progress import subjob
    if only is None or not hasattr(table, "methods"):
        table.methods = {}
    # {(tensor, applied scheme): {method: error}} of this table's earlier calls (same rows,
    # same statistics): a later stage computes only the methods it adds
    known = getattr(table, "method_errors", None)
    if known is None or only is None:
        known = table.method_errors = {}
    if not hasattr(table, "rtn_values"):
        table.rtn_values = dict(table.values)
    # rtn alone with want_h: only the fold statistics, for a later call to weigh methods on
    stats_only = methods == ["rtn"] and (bool(want_h) or (diagonal and want_h is not None))
    if not [m for m in methods if m != "rtn"] and not stats_only:
        return {"tensors": 0, "pairs": 0}
    t0 = time.perf_counter()
    data = yield from subjob(calibration_samples(model, calib), 0, 1, 100)
    if len(data) < MIN_FOLD_SAMPLES:
        return {"tensors": 0, "pairs": 0,
                "note": f"{len(data)} calibration samples: too few to hold some out "
                        f"(at least {MIN_FOLD_SAMPLES}); methods not weighed"}
    names = []
    for n in table.names:
        info = model.info(n)
        if info.ndim != 2:
            continue
        if any(table.applied.get((n, s), KEEP) not in (KEEP, "fp16", "bf16", "fp32")
               for s in table.schemes):
            names.append(n)
    if only is not None:
        names = [n for n in names if n in only]
    if stats is None:
        want_h = ("gptq" in methods if want_h is None else want_h) and not diagonal
        half = 49 if stats_only else 14     # statistics only: they are the whole job
        fit = yield from subjob(collect_stats(model, calib, names=names, want_h=want_h,
                                              keep_rows=0, subset=slice(0, None, 2)), 1,
                                half + 1, 100)
        held = yield from subjob(collect_stats(model, calib, names=names, want_h=not diagonal,
                                               keep_rows=0, subset=slice(1, None, 2)),
                                 half + 2, half, 100)
    else:
        fit, held = stats
    t1 = time.perf_counter()

    def usable(n):
        cols = model.info(n).matrix_shape[1]
        return all(n in st and getattr(st[n], f, None) is not None
                   and np.asarray(getattr(st[n], f)).shape[-1] == cols
                   for st, f in ((fit, "d"), (held, "d" if diagonal else "H")))
    todo = [] if stats_only else [n for n in names if usable(n)]
    pairs = 0
    won: dict[str, int] = {}
    for i, n in enumerate(todo):
        yield Progress(30 + 70 * i // max(len(todo), 1), 100, f"methods {i + 1}/{len(todo)} {n}")
        w = np.ascontiguousarray(model.read_matrix(n), np.float32).reshape(
            model.info(n).matrix_shape)
        a = None
        if row_weights is not None:
            a = row_weights.get(n)
            if a is None or len(a) != w.shape[0] or not np.any(a > 0):
                continue       # the network does not read it: its value is 0 under every pair
        by_applied: dict[str, dict] = {}
        C = None            # held_c(held[n]), made when a pair is not known yet
        factor = None
        if "gptq" in methods and getattr(fit[n], "H", None) is not None:
            from workbench.quant.methods.gptq import hessian_factor
            factor = hessian_factor(fit[n].H, w, tensor=n)
        base = np.ones(w.shape[0]) if a is None else np.asarray(a, np.float64)
        rows, hw = sample_rows(base * np.einsum("ij,ij->i", w, w, dtype=np.float64))
        ws = np.ascontiguousarray(w[rows])
        as_ = base[rows] * hw
        for s in [k[1] for k in table.values if k[0] == n]:
            if only is not None and s not in only[n]:
                continue
            applied = table.applied.get((n, s), KEEP)
            if applied in (KEEP, "fp16", "bf16", "fp32") or (n, s) not in table.values:
                continue
            if applied not in by_applied:
                sub = len(rows) < w.shape[0] and row_local(applied)
                f = factor
                if sub and factor is not None:    # the factor's W: the same rows
                    f = (np.ascontiguousarray(factor[0][rows]),) + tuple(factor[1:])
                done = known.setdefault((n, applied), {})
                todo_m = [m for m in methods if m not in done]
                if todo_m:      # an earlier stage's errors are the same numbers: reuse them
                    if C is None:
                        C = held_c(held[n])
                    done.update(pair_errors(ws if sub else w, applied, fit[n], todo_m,
                                            as_ if sub else a, tensor=n, factor=f,
                                            held=held[n], C=C))
                by_applied[applied] = {m: e for m, e in done.items() if m in methods}
                pairs += len(by_applied[applied])
            errs = by_applied[applied]
            e_rtn = errs.get("rtn", 0.0)
            best = min(errs, key=lambda m: (errs[m], m != "rtn"))
            table.values[(n, s)] = table.rtn_values[(n, s)]
            table.methods.pop((n, s), None)
            if best == "rtn" or e_rtn <= 0:
                continue
            table.values[(n, s)] *= errs[best] / e_rtn
            table.methods[(n, s)] = best
            won[best] = won.get(best, 0) + 1
    yield Progress(100, 100, "methods weighed")
    return {"tensors": len(todo), "pairs": pairs, "won": won, "seconds_stats": t1 - t0,
            "seconds_pairs": time.perf_counter() - t1,
            "folds": [len(data[0::2]), len(data[1::2])], "stats": (fit, held)}


def near_choices(table, assignment: dict) -> dict:
    """{tensor: {its scheme in `assignment`, the next smaller candidate}}: the pairs where a
    costlier method can still move the allocation (it lowers a value, so the solver may take
    the scheme below the one it chose, or keep this one at a lower error)."""
    out = {}
    for n in table.names:
        cands = [s for s in table.schemes if (n, s) in table.values
                 and table.applied.get((n, s), KEEP) not in (KEEP, "fp16", "bf16", "fp32")]
        if not cands:
            continue
        cands.sort(key=lambda s: (table.bytes[(n, s)], s))
        s0 = assignment.get(n)
        pick = set()
        if s0 in cands:
            i = cands.index(s0)
            pick = {s0} | ({cands[i - 1]} if i > 0 else set())
        elif s0 is not None and (n, s0) in table.bytes:     # kept / float: the largest below
            below = [s for s in cands if table.bytes[(n, s)] <= table.bytes[(n, s0)]]
            pick = {below[-1]} if below else set()
        if pick:
            out[n] = pick
    return out


def plan_with_methods(plan, table, model):
    """The solved plan with each tensor's chosen method on its exact-name rule (rtn: none)."""
    from workbench.quant.plan import Rule
    methods = getattr(table, "methods", None) or {}
    if not methods:
        return plan
    rules = []
    for r in plan.rules:
        m = None
        if not r.is_regex and r.match in model.tensors:
            info = model.info(r.match)
            scheme = plan.scheme_and_source(r.match, info.ndim, info.is_float)[0]
            m = methods.get((r.match, scheme))
        rules.append(Rule(r.match, r.scheme, r.fallback, m or r.method) if m else r)
    return plan._copy(rules=rules)


def method_counts(plan, table, model) -> dict:
    """{method: number of tensors with a choice that use it} (tensors kept unquantized count
    as rtn)."""
    out = {m: 0 for m in PAIR_METHODS}
    for n in table.names:
        m = plan.method_for(n)
        out[m] = out.get(m, 0) + 1
    return {m: c for m, c in out.items() if c}


def _runnable(model) -> bool:
    from workbench.formats.llama_names import has_config
    return has_config(model)


def weigh_methods(model, table, methods: str | None = "auto", measure: str = "weight",
                  calib=None, imatrix=None, samples: int | None = None, target: str = "any",
                  solve=None, drive=None, say=None) -> dict:
    """The allocate command's step between the table and the solver: resolve `methods` (the
    --methods text: "auto" or a comma-separated list) and fold the methods into `table` (see
    `method_pairs`). `measure`, `calib`, `imatrix`, `samples`: those the table was measured
    with. `solve(table) -> {tensor: scheme}`: the allocation of a table; given, the costly
    methods (imatrix, gptq) are weighed only on the pairs `near_choices` finds around the rtn
    table's solution, on the same statistics, and again around each new solution
    (NEAR_ROUNDS). `drive(job)` runs each stage's
    progress job (default: workbench.core.progress.run); `say(line)` gets the notes (default:
    none). Returns {"methods": weighed, "pairs", "tensors", "seconds", "won"}."""
    import time

    if drive is None:
        from workbench.core.progress import run as drive
    quiet = say is None
    t0 = time.perf_counter()
    methods = parse_methods(methods)
    auto = methods is None
    kind = None
    if auto:
        kind = _kind(model)
        methods = default_methods(measure, not imatrix and _runnable(model), kind, target)
    if imatrix and len(methods) > 1:
        raise WorkbenchError("methods= other than rtn collect their statistics from the "
                             "calibration text: give calib= (or nothing), not imatrix=",
                             path=imatrix, params=("methods", "calib", "imatrix"))
    if len(methods) == 1:
        table.methods = {}
        if (auto and kind == "causal-lm" and not quiet
                and get_measure(measure).reads_calibration):
            say("methods: rtn (--methods auto on a causal LM: methods fitted to calibration "
                "lines raised the held-out KL divergence; --methods rtn,imatrix,gptq weighs "
                "them)")
        return {"methods": methods, "pairs": 0, "tensors": 0, "seconds": 0.0}
    costly = [m for m in methods if m not in CHEAP_METHODS]
    staged = bool(costly) and solve is not None
    if not quiet:
        say(f"methods: weighing {', '.join(methods)} per tensor and scheme"
            + (" (--methods auto)" if auto else "")
            + (f"; {', '.join(costly)} near the allocation" if staged else "")
            + ", each fitted on half the calibration samples and judged on the other half")
    row_weights = get_measure(measure).row_weights
    rw = row_weights(model, calib, samples) if row_weights is not None else None
    first = [m for m in methods if m in CHEAP_METHODS] if staged else methods
    # mlx without gptq: judged on the held-out fold's E[x²] (no Hessians; DIAGONAL_TARGETS)
    diagonal = target in DIAGONAL_TARGETS and "gptq" not in methods
    res = drive(method_pairs(model, table, first, calib, rw, target,
                             want_h=(not diagonal) if staged else None, diagonal=diagonal))
    if res.get("note") and not quiet:
        say(f"methods: {res['note']}")
    if staged and "stats" in res:
        # weigh the costly methods around the solution; a method that lowers a value can move
        # the solution to pairs not weighed yet: weigh those too, until it stays (NEAR_ROUNDS)
        weighed: dict[str, set] = {}
        for _ in range(NEAR_ROUNDS):
            near = {n: v - weighed.get(n, set())
                    for n, v in near_choices(table, solve(table)).items()}
            near = {n: v for n, v in near.items() if v}
            if not near:
                break
            more = drive(method_pairs(model, table, methods, calib, rw, target, only=near,
                                      stats=res["stats"], diagonal=diagonal))
            res["pairs"] += more.get("pairs", 0)
            for n, v in near.items():
                weighed.setdefault(n, set()).update(v)
        res["near_pairs"] = sum(len(v) for v in weighed.values())
        res["won"] = {}
        for m in table.methods.values():
            res["won"][m] = res["won"].get(m, 0) + 1
    res.pop("stats", None)
    res["methods"] = methods
    res["seconds"] = time.perf_counter() - t0
    return res

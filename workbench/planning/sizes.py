"""Bytes per tensor under a runtime's schemes: the smallest model a scheme list can make, the
uniform plans' sizes, and the message when a budget is below the smallest.
"""

from __future__ import annotations


from workbench.quant.plan import KEEP
from workbench.quant.runtimes import runtime_and_names


def _bytes_as(info, d) -> int:
    from workbench.schemes import get_scheme
    return int(info.nbytes if d.applied == KEEP else get_scheme(d.applied).nbytes(tuple(info.shape)))


def size_floor(model, schemes, runtime: str = "any", pins: dict | None = None) -> tuple[int, int]:
    """(bytes of the smallest plan the candidates allow, parameters), from shapes alone (nothing
    is quantized or run), counted as `build_table` and `evaluate` count them: lets `allocate`
    refuse an impossible budget before it measures anything."""
    from workbench.quant.runtimes import decide
    rt, gnames = runtime_and_names(model, runtime)
    pins = dict(pins or {})
    total, params = 0, 0
    for n in model.tensors:
        info = model.info(n)
        params += info.numel
        keep = _bytes_as(info, decide(info, KEEP, rt))
        if n in pins:
            total += _bytes_as(info, decide(info, pins[n], rt, explicit=True,
                                            gguf_name=gnames.get(n) if gnames else None))
            continue
        if not (info.ndim >= 2 and info.is_float):
            total += keep
            continue
        best = keep
        for sch in schemes:
            d = decide(info, sch, rt, explicit=True, gguf_name=gnames.get(n) if gnames else None)
            best = min(best, _bytes_as(info, d))
        total += best
    return total, params


def uniform_sizes(model, runtime: str = "any", exclude=()) -> dict[str, int]:
    """Bytes of the uniform plan (every float matrix at one scheme) of each scheme `runtime`
    can run, except `exclude`, smallest first (sizes only)."""
    from workbench.quant.runtimes import candidate_schemes, decide
    rt, gnames = runtime_and_names(model, runtime)
    out = {}
    for sch in candidate_schemes(rt.name):
        if sch in exclude:
            continue
        total = 0
        for n in model.tensors:
            info = model.info(n)
            if info.ndim >= 2 and info.is_float:
                d = decide(info, sch, rt, explicit=True,
                           gguf_name=gnames.get(n) if gnames else None)
                total += min(_bytes_as(info, d), info.nbytes)
            else:
                total += _bytes_as(info, decide(info, KEEP, rt))
        out[sch] = int(total)
    return dict(sorted(out.items(), key=lambda kv: kv[1]))


def below_smallest_message(model, budget_bytes: int, cheapest: int, params: int, schemes,
                           runtime: str) -> str:
    """The refusal of a budget below the smallest plan: that plan's size, and the schemes the
    target runs (not among the candidates) whose uniform plan would fit the budget."""
    p = max(params, 1)
    msg = (f"budget {budget_bytes:,d} bytes ({8.0 * budget_bytes / p:.3f} bits/weight) is below "
           f"the smallest plan the candidates allow, {cheapest:,d} bytes "
           f"({8.0 * cheapest / p:.3f} bits/weight, every tensor at its cheapest of "
           f"{', '.join(schemes)})")
    sizes = uniform_sizes(model, runtime, exclude=schemes) if model is not None else {}
    reach = [f"{s} ({8.0 * b / p:.3f})" for s, b in sizes.items() if b <= budget_bytes]
    if reach:
        return msg + "; candidates that reach the budget as a uniform plan: " + ", ".join(reach)
    return msg + f"; no scheme {runtime} runs reaches it: raise the budget"


def sized_candidates(model, names, runtime, pins, budget, auto: bool):
    """(candidates, bytes of the smallest plan, parameters, the budget in bytes) for
    `allocate`; with `auto` (the "auto" candidate list) the lattice i-quants join when the
    budget's mean bits/weight is low enough to use them (runtimes.low_bit_candidates)."""
    from workbench.quant.runtimes import low_bit_candidates
    cheapest, params = size_floor(model, names, runtime, pins)
    want = int(budget.value) if budget.kind == "bytes" else int(budget.value * params / 8.0 + 1e-9)
    low = [s for s in low_bit_candidates(runtime, want * 8.0 / max(params, 1)) if s not in names]
    if auto and low:
        names = list(names) + low
        cheapest, params = size_floor(model, names, runtime, pins)
    return names, cheapest, params, want

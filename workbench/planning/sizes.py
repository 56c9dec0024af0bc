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


#: allocate's default candidates leave out schemes more than this many bits per weight below the
#: budget's mean: the optimal plan never used one on the real LMs and MiniLM (the lowest scheme
#: chosen sat 1.1-1.7 bits below the mean), and each candidate costs a pass over every tensor.
GAP_BITS = 2.0


def budget_candidates(model, names, budget, runtime: str = "any", pins: dict | None = None,
                      say=None) -> list[str]:
    """The candidates among `names` for `budget` (a workbench.planning.budget.Budget): those of
    nominal bits per weight below the budget's mean minus GAP_BITS are left out, and so are the
    slow lattice types (runtimes.LOW_BIT_ONLY) when the mean is their bits per weight + 1 or
    more; unless that would make the budget unreachable (then none is). `say(line)` is told
    which."""
    from workbench.quant.runtimes import LOW_BIT_ONLY
    from workbench.schemes import get_scheme
    params = sum(model.info(n).numel for n in model.tensors)
    want = budget.value * params / 8.0 if budget.kind == "bpw" else float(budget.value)
    if params <= 0 or want <= 0:
        return list(names)
    mean = budget.value if budget.kind == "bpw" else 8.0 * want / params
    low = mean - GAP_BITS
    keep = [s for s in names if get_scheme(s).bits_per_weight() >= low
            and (s not in LOW_BIT_ONLY or mean < LOW_BIT_ONLY[s] + 1)]
    out = [s for s in names if s not in keep]
    if not out or not keep or (budget.over != "linear"
                               and size_floor(model, keep, runtime, pins)[0] > want):
        return list(names)
    if say is not None:
        say(f"candidates: {len(out)} schemes left out at the budget's mean of {mean:.2f} "
            f"bits/weight ({', '.join(out)}: more than {GAP_BITS:g} under it, or a lattice "
            "type it is over by 1 or more); --schemes naming them weighs them too")
    return keep

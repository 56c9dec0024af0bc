"""The API's typed results: the measure chosen, an allocation, a frontier (one-line reprs,
``to_dict()``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from workbench.planning.budget import Budget
from workbench.quant.plan import Plan

if TYPE_CHECKING:   # the heavy types, for annotations only
    from workbench.formats.model import Model
    from workbench.planning.allocate import Solution
    from workbench.planning.frontier import FrontierPoint
    from workbench.planning.sensitivity import SensitivityTable
    from workbench.quant.evaluate import Evaluation


@dataclass(frozen=True)
class MeasureChoice:
    """The sensitivity measure, the calibration samples it reads and why it was chosen."""
    measure: str
    samples: int | None
    reason: str
    auto: bool = False


@dataclass(repr=False)
class Allocation:
    """An allocated plan and what it costs (:func:`allocate_plan`). ``repr`` is one line (bytes,
    bits per weight, the predicted error, the schemes used); :meth:`to_dict` is `allocate
    --json`'s document."""
    plan: Plan
    table: "SensitivityTable"
    budget: Budget
    budget_bytes: int               # the budget in bytes of what it counts
    solution: "Solution"            # error (the predicted total), exact, bound
    evaluation: "Evaluation"
    accounting: dict[str, Any]      # bytes and bits per weight in every accounting
    methods_weighed: dict[str, Any]  # workbench.planning.allocate_methods.weigh_methods' summary
    candidates: list[str]
    target: str
    seconds: dict[str, float] = field(default_factory=dict)
    model: "Model | None" = None    # the model the plan was allocated for

    def __repr__(self) -> str:
        from workbench.planning.sensitivity import predicted_unit
        t = self.evaluation.totals
        unit = predicted_unit(self.model, self.measure) if self.model is not None else ""
        what = {"kl": "predicted KLD", "1-cosine": "predicted 1-cos"}.get(unit, "predicted")
        used: dict[str, int] = {}
        for r in self.evaluation.tensors.values():
            used[r.scheme] = used.get(r.scheme, 0) + 1
        top = sorted(used.items(), key=lambda kv: -kv[1])
        shown = ", ".join(f"{s} {n}" for s, n in top[:4]) + (
            f", +{len(top) - 4} more" if len(top) > 4 else "")
        return (f"<Allocation {t.bytes_after:,d} bytes, {t.bits_per_weight:.3f} bits/weight, "
                f"{what} {self.solution.error:.4g} ({self.measure}), target {self.target}: "
                f"{shown}>")

    @property
    def measure(self) -> str:
        return self.table.measure

    @property
    def measure_reason(self) -> str:
        return getattr(self.table, "measure_reason", "given")

    def save(self, path: str | os.PathLike) -> None:
        """Write the plan JSON (atomically)."""
        self.plan.save(str(path))

    def to_dict(self, output: str | None = None) -> dict:
        """`allocate --json`'s document (`output`: the plan file written)."""
        from workbench.planning.allocate_methods import method_counts
        from workbench.planning.sensitivity import predicted_unit
        t = self.evaluation.totals
        acc = self.accounting
        out = {"output": output, "budget_bytes": self.budget_bytes,
               "budget": {**self.budget.to_dict(), "bytes": self.budget_bytes},
               "accounting": acc, "bits_per_weight_linear": acc["bits_per_weight_linear"],
               "bytes": t.bytes_after, "bits_per_weight": t.bits_per_weight,
               "sqnr_db": t.sqnr_db, "measure": self.measure,
               "measure_reason": self.measure_reason, "candidates": self.candidates,
               "predicted": self.solution.error, "exact": self.solution.exact,
               "bound": self.solution.bound, "target": self.target,
               "seconds": {"sensitivity": self.seconds["sensitivity"],
                           "solve": self.seconds["solve"]},
               "schemes": _scheme_counts(self.evaluation, self.candidates),
               "methods": method_counts(self.plan, self.table, self.model),
               "methods_weighed": self.methods_weighed["methods"]}
        out["seconds"]["methods"] = self.methods_weighed.get("seconds", 0.0)
        out["predicted_unit"] = predicted_unit(self.model, self.measure)   # kl, 1-cosine, ...
        return out


@dataclass(repr=False)
class Frontier:
    """Allocated plans over a range of budgets beside the uniform plans and llama.cpp's recipes
    (:func:`compute_frontier`)."""
    table: "SensitivityTable"
    allocated: list["FrontierPoint"]
    uniform: list["FrontierPoint"]
    recipes: list["FrontierPoint"]
    recipe_error: str | None = None     # why no recipe points, when none
    seconds: dict = field(default_factory=dict)
    schemes: list[str] = field(default_factory=list)    # the candidates (parse_schemes)

    def __repr__(self) -> str:
        b = [p.bits_per_weight for p in self.allocated]
        span = f" from {min(b):.3f} to {max(b):.3f} bits/weight" if b else ""
        return (f"<Frontier {len(self.allocated)} allocated plans{span}, "
                f"{len(self.uniform)} uniform, {len(self.recipes)} recipes; "
                f"{self.table.measure} measure, target {self.table.runtime}>")

    @property
    def points(self) -> list["FrontierPoint"]:
        """Every point, fewest bits per weight first."""
        return sorted(self.allocated + self.uniform + self.recipes,
                      key=lambda p: p.bits_per_weight)


def _scheme_counts(evaluation, candidates) -> dict[str, int]:
    """Tensors per candidate scheme; a tensor's dtype variant (an MLX scheme's ``@bf16``,
    which the export's dtype picks) counts as its registered scheme."""
    from workbench.schemes import get_scheme
    wanted = set(candidates)

    def listed(name):
        if not name or name in wanted or "@" not in name:
            return name
        return getattr(get_scheme(name), "base_name", name)
    names = [listed(r.scheme) for r in evaluation.tensors.values()]
    return {s: names.count(s) for s in candidates}

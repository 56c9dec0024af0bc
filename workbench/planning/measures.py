"""The sensitivity measures, one registry as schemes, methods and exporters have
(docs/methods.md, "Sensitivity and allocation"): each measure's name, what it needs (a runnable network, calibration
inputs; whether an imatrix stands for them) and the units its values are in. Every list,
table and message of measure names reads from here (the API's choices, the CLI's --measure,
the app's menu and tooltips), and so does all that differs per measure: the job giving its
values (workbench.planning.measure_jobs), its stages in allocate's expected cost, the rows'
weights its methods are judged with, whether it sees a mixture's routing and its rank in the
automatic choice. workbench.planning.sensitivity builds the table from them; no module
compares a measure's name.

Units: a measure whose values estimate the network's output change (``output_units``) is in
the units `check` measures: mean KL divergence per token (nats) on a causal LM, mean 1 - cosine
of the pooled embeddings on an encoder (workbench.planning.sensitivity.predicted_unit); the
others are in their own units (``unit``), comparable between tensors but not to `check`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from workbench.core.errors import WorkbenchError
from workbench.planning import measure_jobs as jobs


@dataclass(frozen=True)
class Measure:
    """A sensitivity measure's facts."""
    name: str
    #: what a value is, in a line (the CLI's table heading; output units: see `units`)
    unit: str
    #: the app's description of the measure (its menu's tooltip)
    description: str
    #: runs the network (a config.json of a supported architecture and the [model] extra)
    needs_model: bool = False
    #: reads calibration inputs (a pass over the calibration text, or an imatrix for them)
    reads_calibration: bool = False
    #: an imatrix (llama.cpp's activation statistics) can stand for the calibration pass
    takes_imatrix: bool = False
    #: its values estimate (or are) the output change, in `check`'s units
    output_units: bool = False
    #: measured directly (the reference the others are ranked against), not predicted
    measured: bool = False
    #: the CLI's --measure help phrase (default: `description`)
    summary: str = ""
    #: Job(measure_jobs.MeasureInputs) -> (errors {(tensor, scheme): value}, the factor the
    #: squared weight error of the tensors it does not reach is multiplied by); None: every
    #: value is evaluate's squared weight error
    values: Callable | None = None
    #: (params, tensors, schemes, samples) -> {stage: seconds} of its work in an allocation
    #: (workbench.planning.allocate_cost; None: every weight quantized for every scheme)
    cost: Callable | None = None
    #: (model, calib, samples) -> {tensor: weight per output row} the methods are judged with
    #: (workbench.planning.allocate_methods; None: every row alike)
    row_weights: Callable | None = None
    #: runs the network with its router, so a mixture's experts are not weighted again by how
    #: often the router picks them
    sees_routing: bool = False
    #: the automatic choice (measure "auto") takes the highest rank the inputs allow; None:
    #: never chosen automatically
    auto_rank: int | None = None

    def units(self, causal: bool) -> str:
        """What a value is, for a causal LM (`causal`) or an encoder."""
        if not self.output_units:
            return self.unit
        out = "KL nats/token" if causal else "1 - cosine"
        return out if self.measured else f"{out} (estimated)"

    def runs_network(self, imatrix=None) -> bool:
        """Whether it runs the network on these inputs (an imatrix it takes stands for the
        calibration pass)."""
        return self.needs_model or (self.reads_calibration
                                    and not (imatrix and self.takes_imatrix))

    def weighs_experts(self, calib=None) -> bool:
        """Whether a mixture's experts are weighted by how often the router picks them (when
        the measure does not see the routing itself and calibration inputs are there)."""
        return not self.sees_routing and (self.reads_calibration or calib is not None)

    def stages(self, params: int, tensors: int, schemes: int, samples: int) -> dict:
        """{stage: seconds} of its work in an allocation (workbench.planning.allocate_cost)."""
        return (self.cost or jobs.weight_cost)(params, tensors, schemes, samples)

    def refusal(self, calib, imatrix) -> WorkbenchError | None:
        """The error saying why the inputs given cannot feed this measure, in the API's terms
        (the CLI says its flags); None: they can."""
        if imatrix and self.reads_calibration and not self.takes_imatrix:
            return WorkbenchError(f"measure={self.name!r} runs the calibration inputs: give "
                                  "calib=, not imatrix=", params=("measure", "calib", "imatrix"))
        return None


_REGISTRY: dict[str, Measure] = {}


def register(measure: Measure) -> Measure:
    if measure.name in _REGISTRY:
        raise ValueError(f"measure {measure.name!r} is registered twice")
    _REGISTRY[measure.name] = measure
    return measure


register(Measure("weight", "squared weight error",
                 "weight error (Σ squared reconstruction error)",
                 summary="squared weight error", cost=jobs.weight_cost, auto_rank=0))
register(Measure("activation", "sum E[x^2] |dW|^2",
                 "activation-weighted error Σ_j E[x_j²]·‖ΔW[:,j]‖²",
                 reads_calibration=True, takes_imatrix=True, summary="imatrix-weighted error",
                 values=jobs.activation_values, cost=jobs.activation_cost, auto_rank=1))
register(Measure("fisher", "estimated output change",
                 "output-gradient- and activation-weighted error ½·Σ F·ΔW² (an estimate of the "
                 "output change from one calibration pass)",
                 needs_model=True, reads_calibration=True, output_units=True,
                 summary="activation- and output-gradient-weighted error (a second-order "
                         "estimate of the output measure from one calibration pass)",
                 values=jobs.fisher_values, cost=jobs.fisher_cost,
                 row_weights=jobs.fisher_row_weights, sees_routing=True, auto_rank=2))
register(Measure("output", "measured output change",
                 "measured output change with only that tensor quantized",
                 needs_model=True, reads_calibration=True, output_units=True, measured=True,
                 summary="measured KL / 1-cosine with only that tensor quantized",
                 values=jobs.output_values, cost=jobs.output_cost, sees_routing=True))


def list_measures() -> list[Measure]:
    """The measures, in the order lists show them."""
    return list(_REGISTRY.values())


def measure_names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def get_measure(name: str) -> Measure:
    """The measure called `name`; an unknown name is a WorkbenchError listing them."""
    m = _REGISTRY.get(name)
    if m is None:
        raise WorkbenchError(f"unknown measure {name!r} (choose from "
                             f"{', '.join(_REGISTRY)})")
    return m

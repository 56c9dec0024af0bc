"""Each built-in sensitivity measure's work, as its Measure entry (workbench.planning.measures)
names it: the job that gives its table's values, what an allocation with it costs, and the
row weights its methods are judged with. workbench.planning.sensitivity, allocate_cost and
allocate_methods call these through the registry, never by the measure's name.

A values job takes a :class:`MeasureInputs` and returns ``(errors, missing_scale)``:
``errors[(tensor, scheme)]`` for the tensors it reaches, and the factor the squared weight
error of the others is multiplied by (0: they count as nothing). The weight measure has no
job: every value is evaluate's squared weight error."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from workbench.core.errors import WorkbenchError


@dataclass(frozen=True)
class MeasureInputs:
    """What a measure's values are computed from: the model, the candidate schemes (with any
    pinned or extra ones), the calibration inputs or imatrix, the samples read, the target
    runtime (its fallbacks apply), a cluster executor (or None) and whether caches are used."""
    model: Any
    schemes: list
    calib: Any = None
    imatrix: Any = None
    samples: int | None = None
    runtime: str = "any"
    executor: Any = None
    use_cache: bool = True


# ---- values -----------------------------------------------------------------------------------
# Each job's progress is out of 80 (the table's sizes take the rest), as the table job shows it.
def activation_values(inp: MeasureInputs):
    """Job: sum_j E[x_j^2] |dW[:, j]|^2 from the calibration pass (or the imatrix); tensors the
    statistics do not reach get their weight error times the mean second moment."""
    from workbench.core.progress import subjob
    from workbench.planning.sensitivity import activation_errors, embedding_usage
    from workbench.running.imatrix import second_moments
    model = inp.model
    mom = yield from subjob(second_moments(model, inp.calib, inp.imatrix, inp.samples),
                            0, 30, 80)
    try:
        usage = yield from subjob(embedding_usage(model, inp.calib, inp.samples), 30, 5, 80)
    except WorkbenchError:
        usage = {}   # an imatrix without a runnable model: linear weights only
    errors = yield from subjob(activation_errors(model, inp.schemes, mom, usage, inp.runtime,
                                                 inp.executor), 35, 45, 80)
    scale = float(np.mean([np.mean(v) for v in mom.values()])) if mom else 1.0
    return errors, scale


def fisher_values(inp: MeasureInputs):
    """Job: 1/2 sum F dW^2 with the fisher diagonal of one calibration pass (its errors are
    measured alongside the pass, block by block); tensors it does not reach count as 0."""
    from workbench.core.progress import subjob
    from workbench.planning.fisher import EarlyFisherErrors, fisher_diagonals, fisher_errors
    early = EarlyFisherErrors(inp.model, inp.schemes, inp.runtime)
    try:
        diag, count = yield from subjob(fisher_diagonals(inp.model, inp.calib, inp.samples,
                                                         early=early), 0, 45, 80)
        errors = yield from subjob(fisher_errors(inp.model, inp.schemes, diag, count,
                                                 inp.runtime, early=early), 45, 35, 80)
    finally:
        early.close()
    return errors, 0.0


def output_values(inp: MeasureInputs):
    """Job: the measured output change with one tensor quantized at a time (cached)."""
    from workbench.planning.output_measure import output_errors_job
    errors = yield from output_errors_job(inp.model, inp.schemes, inp.calib, inp.samples,
                                          runtime=inp.runtime, use_cache=inp.use_cache)
    return errors, 0.0


# ---- what an allocation with it costs (workbench.planning.allocate_cost's rates) ---------------
def weight_cost(params: int, tensors: int, schemes: int, samples: int) -> dict:
    """{stage: seconds}: every weight quantized and measured for every scheme."""
    from workbench.planning import allocate_cost as rate
    return {f"{schemes} schemes' errors": rate.ERRORS_FULL * params * schemes}


def activation_cost(params: int, tensors: int, schemes: int, samples: int) -> dict:
    """{stage: seconds}: a forward pass collecting the inputs (none with an imatrix: `samples`
    0), then every weight quantized and measured."""
    from workbench.planning import allocate_cost as rate
    out = {}
    if samples:
        out[f"activation pass over {samples} samples"] = rate.PASS_FORWARD * params * samples
    return {**out, **weight_cost(params, tensors, schemes, samples)}


def fisher_cost(params: int, tensors: int, schemes: int, samples: int) -> dict:
    """{stage: seconds}: the forward and backward pass, and the sampled rows' errors (partly
    hidden behind the pass: ERRORS_OVERLAP)."""
    from workbench.planning import allocate_cost as rate
    pass_s = rate.PASS_FISHER * params * samples
    errors = rate.ERRORS_SAMPLED * params * schemes
    return {f"fisher pass over {samples} samples": pass_s,
            f"{schemes} schemes' errors": max(errors - rate.ERRORS_OVERLAP * pass_s,
                                              0.25 * errors)}


def output_cost(params: int, tensors: int, schemes: int, samples: int) -> dict:
    """{stage: seconds}: the network run again for every tensor and scheme."""
    from workbench.planning import allocate_cost as rate
    return {f"output change of {tensors} tensors x {schemes} schemes":
            rate.PASS_FORWARD * params * samples * tensors * schemes / 2}


# ---- the methods' row weights -----------------------------------------------------------------
def fisher_row_weights(model, calib, samples) -> dict:
    """{name: a_i per output row}: the fisher diagonal summed over each row's inputs."""
    from workbench.planning.allocate_methods import row_weights_from_fisher
    return row_weights_from_fisher(model, calib, samples)

"""The API's model map: `quant-workbench map`'s document without the window."""

from __future__ import annotations

from typing import TYPE_CHECKING, Union

from workbench.api._common import CancelCheck, Driver, ProgressCallback, _driver

if TYPE_CHECKING:
    from workbench.formats.model import Model
    from workbench.quant.plan import Plan


def map_model(model: "Model", plan: Union["Plan", str, None] = None, *, overlay: str = "bits",
              progress: ProgressCallback | None = None, cancel: CancelCheck | None = None,
              driver: Driver | None = None) -> dict:
    """The model map of `model` under `plan` (a Plan, a scheme name for every weight matrix
    with no runtime convention, or None: the window's default plan, int8-channel): its blocks
    and sections, per-block and whole-model totals, each tensor's scheme, and `overlay`'s value
    per tensor ("bits" per weight from the schemes' sizes; "sqnr" dB, the plan evaluated;
    "kurtosis" or "outliers", every tensor read). The dict is `map --json`'s: "model",
    "blocks", "totals", "schemes", "overlay", "values"."""
    from workbench.planning.model_map import map_values_job, summary
    from workbench.quant.plan import Plan
    if plan is None:
        plan = Plan()
    elif not isinstance(plan, Plan):
        from workbench.api import make_plan
        plan = make_plan(str(plan))
    res = summary(model, plan)
    res["overlay"] = overlay
    res["values"] = _driver(progress, cancel, driver)(map_values_job(model, plan, overlay))
    return res

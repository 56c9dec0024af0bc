"""Choosing a plan, for the app (app/ reads the domain through workbench.api and workbench.core
only: the import contract in pyproject.toml): the schemes' families and Pareto fronts, the model
map's overlays, the sensitivity measures, the allocator, the frontier and the diff of two plans."""

from workbench.planning import frontier
from workbench.planning.allocate import allocate
from workbench.planning.diff import diff
from workbench.planning.measures import get_measure, list_measures
from workbench.planning.model_map import (HIGHER_IS_BETTER, OVERLAY_TEXT, OVERLAYS, colour_range,
                                          layout, layout_job, normalise, overlay_values,
                                          plan_bytes_of)
from workbench.planning.scheme_choice import (FAMILIES, bits_per_weight, family_of, grouped,
                                              pareto_front, points_from_results)
from workbench.planning.sensitivity import MEASURES

__all__ = ["FAMILIES", "HIGHER_IS_BETTER", "MEASURES", "OVERLAYS", "OVERLAY_TEXT", "allocate",
           "bits_per_weight", "colour_range", "diff", "family_of", "frontier", "get_measure",
           "grouped", "layout", "layout_job", "list_measures", "normalise", "overlay_values",
           "pareto_front", "plan_bytes_of", "points_from_results"]

"""What a plan is made of, for the app (app/ reads the domain through workbench.api and
workbench.core only: the import contract in pyproject.toml): the plan and its rules, the
schemes' registry, the target runtimes' decisions on a plan, and the export formats' preflight.

These are the domain's own objects, named here once so that the window's dependence on the
domain is this list (docs/architecture.md, "Layers"); scripts use ``qw.*``."""

from workbench.export import list_exporters
from workbench.export.preflight import Preflight, best_format, check
from workbench.quant.plan import KEEP, Plan, Rule, default_plan
from workbench.quant.runtimes import Decider, decide, get_runtime, plan_decisions, summarize
# the registry's own functions (qw.get_scheme / qw.list_schemes check their arguments first:
# 15 us a call against 0.5, and the window asks per tensor and scheme)
from workbench.schemes import get_scheme, list_schemes

__all__ = ["KEEP", "Decider", "Plan", "Preflight", "Rule", "best_format", "check", "decide",
           "default_plan", "get_runtime", "get_scheme", "list_exporters", "list_schemes",
           "plan_decisions", "summarize"]

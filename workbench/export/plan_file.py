"""Export the plan itself as versioned JSON."""

from __future__ import annotations

from workbench.core.progress import Progress
from workbench.export import register_exporter


@register_exporter("plan", ".json", "the mixed-precision plan (versioned JSON)",
                   activations=True)
def export_plan(model, plan, out_path):
    yield Progress(0, 1, "writing plan")
    plan.save(out_path)
    yield Progress(1, 1, "done")
    return {"path": str(out_path), "format": "plan", "rules": len(plan.rules)}

"""`quant-workbench report [MODEL] --plan PLAN.json -o report.html`.

A self-contained HTML report (totals, per-tensor table, plots as embedded PNG) for design
reviews. The numbers come from the same evaluation job as `evaluate`; the plots are drawn
offscreen with the desktop app's plot widgets (PySide6, imported lazily).
"""

from __future__ import annotations

from workbench.cli.common import add_model_arg, drive, open_model_arg


def register(sub) -> None:
    p = sub.add_parser("report", help="write an HTML report of a plan (totals, table, plots)")
    add_model_arg(p)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--plan", help="plan JSON file")
    g.add_argument("--scheme", help="one scheme for every weight matrix")
    p.add_argument("--compare", metavar="FILE",
                   help="a second plan or quantized file (GGUF, quantized safetensors, "
                        "compressed-tensors) of this model: a section comparing it with this "
                        "plan tensor by tensor (as `quant-workbench diff`, without the check)")
    p.add_argument("-o", "--output", required=True, help="HTML file to write")
    p.set_defaults(func=run)


def run(args) -> int:
    import os
    from workbench.core.errors import WorkbenchError
    from workbench.cli.common import plan_from_args
    plan = plan_from_args(args)
    model = open_model_arg(args)
    try:
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
        from app.main import create_app
        from app.report import report_job, write_report
    except ImportError as exc:
        raise WorkbenchError(f"the desktop app is not available ({exc})") from None
    ev, stats = drive(report_job(model, plan))
    res = None
    if args.compare:
        from workbench.api.choices import diff
        res = drive(diff(plan, args.compare, model, check=False))
    create_app(offscreen=True)
    write_report(model, plan, args.output, ev, stats, diff_result=res)
    t = ev.totals
    print(f"wrote {args.output}: {len(ev.tensors)} tensors, {t.bits_per_weight:.3f} bits/weight, "
          f"model SQNR {t.sqnr_db:.2f} dB")
    return 0

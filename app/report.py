"""An HTML design-review report: totals, the per-tensor table and the plots as images.

Self-contained: the images are embedded as base64 PNG, so it reads offline in a browser.
The numbers come from one Qt-free job, :func:`report_job` (workbench evaluation and
statistics); the plots are drawn with the app's own plot widgets, offscreen.
"""

from __future__ import annotations

import base64
import datetime
import html
import math

import numpy as np

from workbench.core.atomic import write_text_atomic
from workbench.api.tensors import evaluate
from workbench.api.plans import KEEP
from workbench.core.progress import Progress, subjob
from workbench.api.tensors import DEFAULT_CACHE, model_stats

from .format import fmt_bytes, fmt_count, fmt_db, fmt_float, fmt_shape

MAX_TENSOR_PLOTS = 48


def plotted(model) -> list[str]:
    """The weight matrices whose plots go into the report (the first MAX_TENSOR_PLOTS)."""
    return [n for n, i in model.tensors.items() if i.ndim >= 2 and i.is_float][:MAX_TENSOR_PLOTS]


def report_job(model, plan):
    """Job: (Evaluation, {name: TensorStats}) for the report."""
    ev = yield from subjob(evaluate(model, plan), 0, 70, 100)
    st = yield from subjob(model_stats(model, plotted(model), cache=DEFAULT_CACHE), 70, 30, 100)
    yield Progress(100, 100, "report data ready")
    return ev, st


def _png(widget, size=(560, 260)) -> str:
    from PySide6.QtWidgets import QApplication
    from .screenshot import png_bytes
    widget.resize(*size)
    widget.show()
    QApplication.processEvents()
    data = png_bytes(widget)
    widget.hide()
    return base64.b64encode(data).decode("ascii")


def _img(b64: str, alt: str, cls: str = "plot") -> str:
    return f'<img class="{cls}" alt="{html.escape(alt)}" src="data:image/png;base64,{b64}">'


def _overview_plots(ev, w) -> list[str]:
    import pyqtgraph as pg
    names = list(ev.tensors)
    bits = np.array([ev.tensors[n].bits_per_weight for n in names])
    sq = np.array([ev.tensors[n].error.sqnr_db for n in names], dtype=np.float64)
    x = np.arange(len(names))
    out = []
    w.setTitle("bits per weight, per tensor (model order)")
    bars = pg.BarGraphItem(x=x, height=bits, width=0.8, brush="#4c9aff")
    w.addItem(bars)
    w.setLabel("bottom", "tensor index")
    w.setLabel("left", "bits/weight")
    out.append(_img(_png(w, (1100, 240)), "bits per weight per tensor", "wide"))
    finite = np.where(np.isfinite(sq), sq, np.nan)
    colours = ["#3fb950" if v >= 25 else "#d29922" if v >= 15 else "#f85149"
               for v in np.nan_to_num(finite, nan=99)]
    w.removeItem(bars)
    w.setTitle("SQNR dB per quantized tensor (exact tensors omitted)")
    ok = np.isfinite(finite)
    w.addItem(pg.BarGraphItem(x=x[ok], height=finite[ok], width=0.8,
                              brushes=[c for c, k in zip(colours, ok) if k]))
    w.setLabel("bottom", "tensor index")
    w.setLabel("left", "SQNR dB")
    out.append(_img(_png(w, (1100, 240)), "SQNR per tensor", "wide"))
    return out


def _tensor_plots(model, ev, stats, name: str, h, c) -> str:
    from . import analysis
    st = stats[name]
    r = ev.tensors[name]
    deq = grid = None
    if r.scheme != KEEP and st.count:
        deq = analysis.dequantized_histogram(model, name, r.scheme, st.hist_edges)
        grid = analysis.grid_levels(r.scheme, st.min, st.max)
    h.set_data(st.hist_edges, st.hist_counts, deq, grid, r.scheme)
    h.getPlotItem().setTitle(f"histogram · {r.scheme}", size="9pt")
    c.set_data(st.ch_min, st.ch_max, st.ch_absmax)
    c.getPlotItem().setTitle("per-channel range", size="9pt")
    return (f'<div class="tensor"><h3>{html.escape(name)}</h3><p class="meta">'
            f'{fmt_shape(r.shape)} · {r.scheme} · SQNR {fmt_db(r.error.sqnr_db)} dB · '
            f'kurtosis {st.kurtosis:.2f} · outliers {100 * st.outlier_frac:.3f}%</p>'
            f'{_img(_png(h), name + " histogram")}{_img(_png(c), name + " channels")}</div>')


def _sq_class(v: float) -> str:
    if not math.isfinite(v):
        return "good"
    return "good" if v >= 25 else "fair" if v >= 15 else "poor"


def _map_section(model, plan, ev) -> str:
    """The model map (issue 23): every tensor a cell coloured by its bits per weight."""
    from .model_map import render_map_png
    sizes = {n: r.bytes for n, r in ev.tensors.items()}
    png = render_map_png(model, plan, bits_of=lambda n: sizes.get(n, model.info(n).nbytes))
    return ("<h2>Model map</h2><p class='meta'>Each tensor a cell, by block and role, coloured "
            "by bits per weight; per-block totals at the left (`quant-workbench map` prints "
            "them).</p>" + _img(base64.b64encode(png).decode("ascii"), "model map", "wide"))


def _diff_section(res) -> str:
    """A comparison with a second plan or quantized file (`quant-workbench diff`)."""
    t = res["totals"]

    def side(d):
        if d is None:
            return "<td>—</td><td></td><td></td>"
        return (f"<td>{html.escape(str(d['type']))}</td><td>{d['bits_per_weight']:.3f}</td>"
                f"<td>{fmt_float(d['rel_rmse'])}</td>")
    rows = "".join(f"<tr><td class='name'>{html.escape(r['name'])}</td>{side(r['a'])}"
                   f"{side(r['b'])}</tr>" for r in res["tensors"]
                   if not r["same_type"] and (r["a"] or r["b"]))
    cards = []
    for tag, label in (("a", "THIS PLAN"), ("b", "COMPARED")):
        x = t[f"{tag}_matched"]
        cards.append(f"<div class='card'><div class='c'>{label}</div><div class='v'>"
                     f"{fmt_bytes(x['bytes'])} · {x['bits_per_weight']:.3f} b/w · "
                     f"{fmt_db(x['sqnr_db']) if x['sqnr_db'] is not None else '—'} dB</div></div>")
    return (f"<h2>Compared with {html.escape(res['b']['path'])} ({html.escape(res['b']['kind'])})"
            f"</h2><p class='meta'>{t['matched']} tensors in both: {t['same_type']} of the same "
            f"type, {t['different_type']} different (listed); {t['only_a']} only here, "
            f"{t['only_b']} only there. Sizes and SQNR over the tensors both hold.</p>"
            f"<div class='totals'>{''.join(cards)}</div>"
            "<table><tr><th>tensor</th><th>this type</th><th>bits/w</th><th>rel. RMSE</th>"
            f"<th>their type</th><th>bits/w</th><th>rel. RMSE</th></tr>{rows}</table>")


def render_html(model, plan, ev, stats, screenshot_b64: str | None = None,
                diff_result=None) -> str:
    """The report as one HTML string (draws plots: needs a QApplication)."""
    t = ev.totals
    rows = []
    for r in ev.tensors.values():
        e = r.error
        note = f' title="{html.escape(r.note)}"' if r.note else ""
        rows.append(
            f"<tr><td class='name'{note}>{html.escape(r.name)}</td><td>{fmt_shape(r.shape)}</td>"
            f"<td>{fmt_count(r.params)}</td><td>{html.escape(r.scheme)}</td>"
            f"<td>{r.bits_per_weight:.3f}</td><td>{fmt_bytes(r.bytes)}</td>"
            f"<td>{fmt_float(e.rel_rmse)}</td><td class='{_sq_class(e.sqnr_db)}'>{fmt_db(e.sqnr_db)}</td>"
            f"<td>{fmt_float(e.max_abs_err)}</td></tr>")
    import pyqtgraph as pg
    from .plots.channels import ChannelRangePlot
    from .plots.histogram import HistogramPlot
    shot = _img(screenshot_b64, "window", "wide") if screenshot_b64 else ""
    # one widget of each kind, re-used for every image
    h, c, w = HistogramPlot(), ChannelRangePlot(), pg.PlotWidget()
    tensors = "".join(_tensor_plots(model, ev, stats, n, h, c) for n in stats)
    overview = "".join(_overview_plots(ev, w))
    for widget in (h, c, w):
        widget.deleteLater()
    more = len([1 for i in model.tensors.values() if i.ndim >= 2 and i.is_float]) - len(stats)
    rules = "".join(f"<li><code>{html.escape(r.match)}</code> → {html.escape(r.scheme)}</li>"
                    for r in plan.rules) or "<li>(none)</li>"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>Quantization report — {html.escape(model.path)}</title>
<style>
body {{ font-family: "DejaVu Sans", Helvetica, Arial, sans-serif; background: #1b1e24;
       color: #c9ced8; margin: 24px 32px; }}
h1, h2, h3 {{ color: #e6e9ef; font-weight: 600; }} h3 {{ font-size: 13px; margin: 4px 0; }}
.totals {{ display: flex; gap: 12px; flex-wrap: wrap; }}
.card {{ background: #22262e; border: 1px solid #2e333d; border-radius: 6px; padding: 8px 14px; }}
.card .c {{ font-size: 10px; letter-spacing: 1px; color: #7d8596; }}
.card .v {{ font: bold 18px "DejaVu Sans Mono", monospace; color: #e6e9ef; }}
table {{ border-collapse: collapse; font: 12px "DejaVu Sans Mono", monospace; width: 100%; }}
th {{ background: #262a33; color: #9aa2b1; text-align: right; padding: 4px 8px; position: sticky; top: 0; }}
td {{ padding: 2px 8px; text-align: right; border-bottom: 1px solid #262a33; }}
td.name, th:first-child {{ text-align: left; }}
.good {{ color: #3fb950; }} .fair {{ color: #d29922; }} .poor {{ color: #f85149; }}
img.wide {{ max-width: 100%; border: 1px solid #2e333d; border-radius: 4px; margin: 6px 0; }}
img.plot {{ width: 49%; border: 1px solid #2e333d; border-radius: 4px; }}
.tensor {{ margin: 14px 0 20px; }} .meta {{ color: #8a92a3; font-size: 12px; margin: 2px 0 6px; }}
code {{ color: #ffb454; }}
</style></head><body>
<h1>Quantization report</h1>
<p class="meta">{html.escape(model.path)} · {model.format} · {len(model.tensors)} tensors ·
generated {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}</p>
<div class="totals">
<div class="card"><div class="c">MODEL SIZE</div><div class="v">{fmt_bytes(t.bytes_before)} → {fmt_bytes(t.bytes_after)}</div></div>
<div class="card"><div class="c">COMPRESSION</div><div class="v">{t.compression:.2f}×</div></div>
<div class="card"><div class="c">AVG BITS / WEIGHT</div><div class="v">{t.bits_per_weight:.3f}</div></div>
<div class="card"><div class="c">MODEL SQNR</div><div class="v {_sq_class(t.sqnr_db)}">{fmt_db(t.sqnr_db)} dB</div></div>
<div class="card"><div class="c">PARAMETERS</div><div class="v">{fmt_count(t.params)}</div></div>
</div>
<h2>Plan</h2><p>default <code>{html.escape(plan.default)}</code>; rules:</p><ul>{rules}</ul>
{shot}
<h2>Overview</h2>{overview}
{_map_section(model, plan, ev)}
{_diff_section(diff_result) if diff_result else ""}
<h2>Tensors</h2>
<table><tr><th>tensor</th><th>shape</th><th>params</th><th>scheme</th><th>bits/w</th><th>bytes</th>
<th>rel. RMSE</th><th>SQNR dB</th><th>max err</th></tr>
{''.join(rows)}</table>
<h2>Weight plots</h2>
<p class="meta">Histogram of the weights (blue), of the dequantized weights (amber) and the
scheme's grid for a block spanning the tensor's range; per-output-channel min/max/absmax with
outlier channels in red.{f' {more} more matrices are not plotted.' if more > 0 else ''}</p>
{tensors}
</body></html>
"""


def write_report(model, plan, out_path, ev, stats, screenshot_b64=None, diff_result=None) -> None:
    write_text_atomic(out_path, render_html(model, plan, ev, stats, screenshot_b64, diff_result))


def write_report_from_window(win, out_path):
    """From the GUI: run the data job on the compute thread, then draw and write."""
    from .screenshot import png_bytes
    from .workers import FOREGROUND
    model, plan = win.doc.model, win.doc.plan
    shot = base64.b64encode(png_bytes(win)).decode("ascii")

    def done(result):
        ev, st = result
        from workbench.core.errors import WorkbenchError
        try:
            write_report(model, plan, out_path, ev, st, shot)
            win.status_label.setText(f"report saved to {out_path}")
        except WorkbenchError as exc:
            win.messages.error("Cannot save report", str(exc))

    return win.runner.submit(lambda: report_job(model, plan), "Building report", FOREGROUND,
                             visible=True, on_done=done,
                             on_error=lambda m: win.messages.error("Cannot build report", m))

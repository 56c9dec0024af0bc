"""The Model map tab: overlays, legend, selection everywhere, one-edit assignment, export."""

import numpy as np
from PySide6.QtCore import QPoint, Qt

from apphelpers import wait_idle

Q = "model.layers.0.self_attn.q_proj.weight"
DOWN1 = "model.layers.1.mlp.down_proj.weight"


def _centre(canvas, name):
    r = canvas.cell_rect(name)
    return QPoint(int(r.center().x()), int(r.center().y()))


def test_map_click_selects_everywhere_and_band_assigns_one_edit(window, qtbot):
    win = window
    view = win.model_map
    win.tabs.setCurrentIndex(win.map_tab_index)
    c = view.canvas
    assert len(c.names) == len(win.doc.model.tensors)
    qtbot.mouseClick(c, Qt.MouseButton.LeftButton, pos=_centre(c, Q))
    assert win.doc.current == Q
    assert win.browser.current_name() == Q if hasattr(win.browser, "current_name") else True
    # rubber band over block 1's attention + mlp cells
    names = [n for n in c.names if n.startswith("model.layers.1.") and n.endswith("proj.weight")]
    a, b = c.cell_rect(names[0]), c.cell_rect(names[-1])
    qtbot.mousePress(c, Qt.MouseButton.LeftButton, pos=QPoint(int(a.left()) + 1, int(a.top()) + 1))
    qtbot.mouseMove(c, QPoint(int(b.right()) - 1, int(b.bottom()) - 1))
    qtbot.mouseRelease(c, Qt.MouseButton.LeftButton, pos=QPoint(int(b.right()) - 1,
                                                                int(b.bottom()) - 1))
    assert set(names) <= c.selected
    before = dict(win.doc.assignment)
    depth = win.undo_stack.count()
    assert view.assign_selection("q8_0")
    assert win.undo_stack.count() == depth + 1
    assert all(win.doc.scheme_of(n) == "q8_0" for n in names)
    wait_idle(qtbot, win)
    view.refresh()
    vals = view.values("bits")
    assert vals[c.index[names[0]]] == 8.5
    win.undo_stack.undo()
    assert win.doc.assignment == before


def test_block_title_selects_the_block_and_totals_are_the_documents(window, qtbot):
    win = window
    win.tabs.setCurrentIndex(win.map_tab_index)
    c = win.model_map.canvas
    rect, block = next((r, b) for r, b in c.block_rects if b.key == "layer 2")
    qtbot.mouseClick(c, Qt.MouseButton.LeftButton, pos=QPoint(20, int(rect.center().y())))
    assert c.selected == set(block.names)
    nbytes = sum(win.doc.bytes_of(n) for n in block.names)
    from app.format import fmt_bytes
    assert fmt_bytes(nbytes) in c.block_text["layer 2"]


def test_overlays_colour_by_value_and_legend(window, qtbot):
    win = window
    view = win.model_map
    win.tabs.setCurrentIndex(win.map_tab_index)
    view.set_overlay("kurtosis")
    vals = view.values()
    ks = np.array([win.doc.stats[n].kurtosis for n in view.canvas.names])
    assert np.allclose(vals, ks)
    lo, hi = view.legend.lo, view.legend.hi
    assert lo == ks.min() and hi == ks.max()
    i_lo, i_hi = int(np.argmin(ks)), int(np.argmax(ks))
    assert not np.array_equal(view.canvas.colours[i_lo], view.canvas.colours[i_hi])
    view.set_overlay("sqnr")
    s = view.values()
    assert s[view.canvas.index[Q]] == win.doc.sqnr(Q)


def test_export_png_and_svg(window, tmp_path):
    view = window.model_map
    view.export_png(tmp_path / "map.png")
    view.export_svg(tmp_path / "map.svg")
    from PySide6.QtGui import QImage
    img = QImage(str(tmp_path / "map.png"))
    assert img.width() >= view.canvas.sizeHint().width() and img.height() > 100
    svg = (tmp_path / "map.svg").read_text()
    assert svg.startswith("<?xml") and "<svg" in svg and svg.count("<rect") + svg.count(
        "<path") > len(view.canvas.names)
    assert "block 0" in svg


def test_sensitivity_heat_map_has_its_colour_scale(qtbot):
    from app.sensitivity_view import HeatMap
    heat = HeatMap()
    qtbot.addWidget(heat)
    vals = np.array([[1e-3, 1e-1], [1e-2, 10.0]])
    heat.set_table(["a", "b"], ["q4_0", "q8_0"], vals)
    lo, hi = heat.colour_bar.levels()
    assert (lo, hi) == (-3.0, 1.0)
    assert heat.colour_bar.isVisible() or heat.colour_bar.scene() is heat.scene()


def test_report_has_the_map_and_a_comparison(tmp_path, capsys):
    from pathlib import Path
    from app.entry import main
    from workbench.export import export
    from workbench.formats.loaders import open_model
    from workbench.quant.plan import Plan
    from workbench.core.progress import run
    from apphelpers import DEMO
    plan_path = Path(DEMO).parents[1] / "demo_plan.json"
    gguf = tmp_path / "q8.gguf"
    run(export(open_model(DEMO), Plan(default="q8_0"), "gguf", gguf))
    out = tmp_path / "r.html"
    assert main(["report", str(DEMO), "--plan", str(plan_path), "--compare", str(gguf),
                 "-o", str(out)]) == 0
    text = out.read_text()
    assert "<h2>Model map</h2>" in text and 'alt="model map"' in text
    assert "Compared with" in text and "q8.gguf" in text
    # q_proj: int8-channel in the plan, Q8_0 in the GGUF: listed with both types
    section = text.split("Compared with")[1].split("<h2>")[0]
    row = section.split("model.layers.0.self_attn.q_proj.weight</td>")[1].split("</tr>")[0]
    assert "int8-channel" in row and "Q8_0" in row


def test_compare_tab_shows_the_diff_and_selects(window, qtbot, tmp_path):
    from workbench.export import export
    from workbench.quant.plan import Plan
    from workbench.core.progress import run
    win = window
    gguf = tmp_path / "q8.gguf"
    run(export(win.doc.model, Plan(default="q8_0"), "gguf", gguf))
    win.tabs.setCurrentIndex(win.diff_tab_index)
    view = win.diff_view
    view.compare(str(gguf))
    qtbot.waitUntil(lambda: view.result is not None, timeout=60000)
    # the default plan (int8-channel) against Q8_0: every weight matrix differs in type
    rows = {r["name"]: r for r in view.model.rows}
    assert rows[Q]["a"]["type"] == "int8-channel" and rows[Q]["b"]["type"] == "Q8_0"
    assert rows[Q]["b"]["name"] == "blk.0.attn_q.weight"
    assert 0 < rows[Q]["b"]["rel_rmse"] < 0.01
    i = [r["name"] for r in view.model.rows].index(DOWN1)
    view._clicked(view.proxy.mapFromSource(view.model.index(i, 0)))
    assert win.doc.current == DOWN1
    assert "Q8_0" not in view.summary.text() and "tensors in both" in view.summary.text()

"""Mixture of experts in the window: a layer's experts in one expandable row, the spread across
experts (per-expert |max|, std, kurtosis) when a group or a merged 3-D tensor is selected."""

import numpy as np
import pytest

from workbench.formats.loaders import open_model

from app.layer_tree import GROUP_ROLE, NAME_ROLE

from apphelpers import wait_idle


def all_rows(browser):
    """(depth, label, name, group) of every row, depth first."""
    out = []
    m = browser.proxy

    def walk(parent, depth):
        for r in range(m.rowCount(parent)):
            idx = m.index(r, 0, parent)
            out.append((depth, idx.data(), idx.data(NAME_ROLE), idx.data(GROUP_ROLE)))
            walk(idx, depth + 1)
    walk(browser.view.rootIndex(), 0)
    return out


def test_experts_grouped_and_spread(make_window, qtbot, tiny_arch):
    folder = tiny_arch("qwen3_moe")
    win = make_window(folder)
    model = win.doc.model
    rows = all_rows(win.browser)
    assert sorted(n for _d, _l, n, _g in rows if n) == sorted(model.tensors)
    # one expandable "experts" row per layer, one row per projection holding its 4 experts
    exp_rows = [(d, lbl) for d, lbl, n, g in rows if lbl.startswith("experts ×")]
    assert exp_rows == [(1, "experts ×4"), (1, "experts ×4")]
    groups = [(d, lbl, g) for d, lbl, n, g in rows if g and not n]
    assert [g for _d, _l, g in groups] == [f"layer {b} experts {p}" for b in (0, 1)
                                           for p in ("gate", "up", "down")]
    assert all(d == 2 and lbl.endswith("· 4 experts") for d, lbl, _g in groups)
    leaves = [(d, lbl) for d, lbl, n, g in rows if n and ".experts.3.down_proj" in n]
    assert leaves == [(3, "expert 3 · down_proj"), (3, "expert 3 · down_proj")]
    # the expert rows start closed, the router stays a plain row of its layer
    idx = win.browser.proxy.index(1, 0)     # layer 0
    labels = [win.browser.proxy.index(r, 0, idx).data() for r in range(
        win.browser.proxy.rowCount(idx))]
    assert "mlp.gate" in labels
    exp_idx = win.browser.proxy.index(labels.index("experts ×4"), 0, idx)
    assert not win.browser.view.isExpanded(exp_idx)

    # selecting the group row: the spread across its experts, computed off the GUI thread
    assert win.browser.show_group("layer 1 experts down")
    wait_idle(qtbot, win)
    plots = win.plots
    assert plots.group == "layer 1 experts down" and plots.spread.isVisibleTo(win)
    assert "layer 1 experts down" in plots.title.text()
    sp = plots.spread.spread
    assert sp is not None and sp.experts == [0, 1, 2, 3]
    m = open_model(folder)
    for e in range(4):
        w = m.read(f"model.layers.1.mlp.experts.{e}.down_proj.weight").astype(np.float64)
        assert sp.absmax[e] == pytest.approx(np.abs(w).max(), rel=1e-6)
        assert sp.std[e] == pytest.approx(w.std(), rel=1e-6)
        d = w - w.mean()
        assert sp.kurtosis[e] == pytest.approx((d ** 4).mean() / (d ** 2).mean() ** 2 - 3,
                                               rel=1e-5, abs=1e-6)
    x, y = plots.spread.absmax.getData()
    np.testing.assert_allclose(y, sp.absmax)
    # the group row stands for its experts: assigning the selection gives all four the scheme
    names = win.browser.selected_names()
    assert names == [f"model.layers.1.mlp.experts.{e}.down_proj.weight" for e in range(4)]
    from app import commands
    win.push(commands.assign(win.doc, names, "q8_0"))   # what "Assign to selection" pushes
    wait_idle(qtbot, win)
    assert {win.doc.scheme_of(n) for n in names} == {"q8_0"}
    assert win.doc.scheme_of("model.layers.0.mlp.experts.0.down_proj.weight") != "q8_0"
    assert "q8_0" in plots.summary.text()
    # a plain tensor brings the ordinary plots back
    win.browser.show_tensor("model.layers.1.self_attn.q_proj.weight")
    wait_idle(qtbot, win)
    assert plots.group is None and not plots.spread.isVisibleTo(win)


def test_merged_gguf_experts_spread(make_window, qtbot, tmp_path):
    pytest.importorskip("gguf")
    from tests.moe_gguf import write_moe_gguf
    path = tmp_path / "moe.gguf"
    write_moe_gguf(path)
    win = make_window(path)
    rows = all_rows(win.browser)
    merged = [(d, lbl, g) for d, lbl, n, g in rows if n and n.endswith("_exps.weight")]
    assert [(d, g) for d, _l, g in merged][:3] == [(2, "layer 0 experts gate"),
                                                   (2, "layer 0 experts up"),
                                                   (2, "layer 0 experts down")]
    name = "blk.1.ffn_down_exps.weight"
    win.browser.show_tensor(name)
    wait_idle(qtbot, win)
    plots = win.plots
    assert plots.name == name and plots.spread.isVisibleTo(win)
    assert plots.histogram.isVisibleTo(win)        # its own plots stay
    sp = plots.spread.spread
    assert sp is not None and sp.experts == [0, 1, 2, 3]
    # the file scales expert e by 1 + e
    np.testing.assert_allclose(sp.std / sp.std[0], [1, 2, 3, 4], rtol=0.03)
    # the per-channel ranges cover every expert's rows
    assert len(plots.ranges.ch_max) == 4 * 256


def test_filter_keeps_the_current_expert_open(make_window, qtbot, tiny_arch):
    """Typing and clearing a filter keeps the current tensor the browser's current row, its
    experts row open and in view (a reset model otherwise drops both): so the next selection
    of it opens nothing, and the filter tells the window nothing new."""
    win = make_window(tiny_arch("qwen3_moe"))
    b = win.browser
    name = "model.layers.1.mlp.experts.2.up_proj.weight"
    other = "model.layers.0.self_attn.q_proj.weight"
    win.select(name)
    wait_idle(qtbot, win)
    told = []
    b.activated.connect(told.append)
    b.groupActivated.connect(told.append)
    opened = []
    b.view.expanded.connect(lambda idx: opened.append(idx.data()))

    def current():
        return b.view.currentIndex().data(NAME_ROLE)

    def shown(idx):
        p = idx.parent()
        while p.isValid():
            if not b.view.isExpanded(p):
                return False
            p = p.parent()
        return b.view.visualRect(idx).intersects(b.view.viewport().rect())

    for text in ("experts.2", "up_proj", ""):
        b.filter_edit.setText(text)
        qtbot.wait(1)
        assert current() == name, text
        assert shown(b.view.currentIndex()), text
    assert told == []
    assert b.selected_names() == [name]
    # the experts row is open already: selecting away and back opens no row again
    opened.clear()
    win.select(other)
    win.select(name)
    assert current() == name and opened == []
    # a filter that hides the current tensor leaves no current row; clearing it brings it back
    told.clear()
    b.filter_edit.setText("self_attn")
    assert current() is None
    b.filter_edit.setText("")
    assert current() == name and told == []

"""Open a model, browse, plots get the tensor's data, failing loads keep the app up."""

import numpy as np
import pytest

from workbench.formats.loaders import open_model
from workbench.core.progress import run
from workbench.quant.stats import reference_stats, tensor_stats

from app import analysis
from app.layer_tree import NAME_ROLE

from apphelpers import DEMO, minilm_path, wait_idle


def leaf_names(browser):
    out = []
    m = browser.proxy
    for g in range(m.rowCount()):
        gi = m.index(g, 0)
        out += [m.index(r, 0, gi).data(NAME_ROLE) for r in range(m.rowCount(gi))]
    return out


def test_open_lists_every_tensor_grouped(window):
    model = window.doc.model
    assert model is not None and len(model.tensors) == 39
    assert sorted(leaf_names(window.browser)) == sorted(model.tensors)
    groups = [window.browser.proxy.index(g, 0).data() for g in range(window.browser.proxy.rowCount())]
    assert groups[0] == "embeddings" and groups[-1] == "head" and "layer 2" in groups
    # everything evaluated: totals known
    assert window.doc.totals().pending == 0


def test_filter_substring_and_regex(window, qtbot):
    window.browser.filter_edit.setText("down_proj")
    assert sorted(leaf_names(window.browser)) == [f"model.layers.{i}.mlp.down_proj.weight" for i in range(3)]
    window.browser.filter_edit.setText(r"re:layers\.1\..*_proj\.bias$")
    assert sorted(leaf_names(window.browser)) == [f"model.layers.1.self_attn.{k}_proj.bias" for k in "kqv"]
    window.browser.filter_edit.setText("re:([")
    assert window.browser.filter_error.isVisibleTo(window) and "bad regular expression" in window.browser.filter_error.text()


def test_select_layer_plots_its_statistics(window, qtbot):
    name = "model.layers.1.mlp.down_proj.weight"
    window.browser.show_tensor(name)
    assert window.doc.current == name
    wait_idle(qtbot, window)
    st = run(tensor_stats(open_model(DEMO), name))
    h = window.plots.histogram
    np.testing.assert_array_equal(h.counts, st.hist_counts)
    np.testing.assert_allclose(h.edges, st.hist_edges)
    x, y = h.bars.getData()
    assert y.sum() == st.count == 256 * 512
    r = window.plots.ranges
    np.testing.assert_allclose(r.ch_min, st.ch_min)
    np.testing.assert_allclose(r.ch_max, st.ch_max)
    np.testing.assert_allclose(r.ch_abs, st.ch_absmax)
    # the statistics agree with the numpy reference definition
    ref = reference_stats(open_model(DEMO).read(name))
    np.testing.assert_array_equal(h.counts, ref.hist_counts)
    # overlay: dequantized histogram under the assigned scheme, and its grid
    scheme = window.doc.scheme_of(name)
    expected = analysis.dequantized_histogram(open_model(DEMO), name, scheme, st.hist_edges)
    np.testing.assert_array_equal(h.deq_counts, expected)
    assert h.grid is not None and len(h.grid) > 100  # int8: ~255 levels
    # per-channel error plot shows the evaluation's per-channel error
    res = window.doc.result(name)
    np.testing.assert_allclose(window.plots.errors.err, res.error.channel_rel_err)
    assert name in window.plots.title.text()
    assert "SQNR" in window.plots.summary.text()


def test_sort_channels_by_range_and_outliers(window, qtbot):
    name = "model.embed_tokens.weight"
    window.select(name)
    wait_idle(qtbot, window)
    window.plots.sort_box.setChecked(True)
    r = window.plots.ranges
    rng = (r.ch_max - r.ch_min)[r.order]
    assert np.all(np.diff(rng) <= 0)
    assert r.outliers.dtype == bool and r.outliers.shape == r.ch_abs.shape
    x, y = r.out_points.getData()
    assert len(x) == int(r.outliers.sum())


def test_grid_levels_int_scheme():
    """Symmetric 4-bit: one evenly spaced grid through 0 (codes -8..7 at the searched scale)
    covering [-1, 1] to within a step; a group scheme too (each probe row's own searched
    scale had given 71 values)."""
    for name in ("int4-tensor", "int4-g128"):
        levels = analysis.grid_levels(name, -1.0, 1.0)
        step = np.diff(levels)
        assert 15 <= len(levels) <= 16, (name, levels)
        np.testing.assert_allclose(step, step[0], rtol=1e-3)
        assert np.min(np.abs(levels)) == 0.0
        assert 1.0 - step[0] <= levels[-1] <= 1.0 + 1e-6
        assert -1.0 - step[0] <= levels[0] <= -1.0 + step[0]
    assert analysis.grid_levels("keep", -1, 1) is None


def test_failing_load_shows_error_and_app_stays_up(window, qtbot, tmp_path):
    before = window.doc.model
    window.open_model(str(tmp_path / "missing.safetensors"))
    wait_idle(qtbot, window)
    assert window.messages.errors, "no error shown"
    title, text = window.messages.errors[-1]
    assert "missing.safetensors" in text and "not found" in text
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
    window.open_model(str(junk))
    wait_idle(qtbot, window)
    assert len(window.messages.errors) == 2 and "junk.safetensors" in window.messages.errors[-1][1]
    # still usable: same model, selection works
    assert window.doc.model is before
    window.select("lm_head.weight")
    wait_idle(qtbot, window)
    assert window.plots.histogram.counts.sum() > 0


def test_drop_file_onto_window_opens_it(window, qtbot):
    from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
    from PySide6.QtGui import QDropEvent
    path = minilm_path()
    if path is None:
        pytest.skip("MiniLM weights not installed")
    md = QMimeData()
    md.setUrls([QUrl.fromLocalFile(str(path))])
    ev = QDropEvent(QPointF(50, 50), Qt.DropAction.CopyAction, md, Qt.MouseButton.NoButton,
                    Qt.KeyboardModifier.NoModifier)
    window.dropEvent(ev)
    qtbot.waitUntil(lambda: window.doc.model is not None and len(window.doc.model.tensors) == 104,
                    timeout=30000)
    wait_idle(qtbot, window, 120000)
    name = "encoder.layer.0.attention.self.query.weight"
    window.select(name)
    wait_idle(qtbot, window)
    st = run(tensor_stats(open_model(path), name))
    np.testing.assert_array_equal(window.plots.histogram.counts, st.hist_counts)
    assert str(path.resolve()) in window.recent_files()

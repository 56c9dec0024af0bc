"""Tools > Compute on Cluster: the setting is validated, stored in the window's QSettings, kept
across windows, and reaches the jobs through the runner (app.cluster_setting)."""

from __future__ import annotations


def test_cluster_setting_from_the_tools_menu(make_window):
    from PySide6.QtGui import QAction
    win = make_window(path=None)
    labels = [a.text() for a in win.findChildren(QAction)]
    assert "Compute on C&luster…" in labels
    assert win.runner.cluster.spec == ""
    assert win.cluster_dialog("local:0") is None          # refused, nothing stored
    assert win.messages.errors[-1][0] == "Compute on cluster"
    assert "--cluster local:0" in win.messages.errors[-1][1]
    assert win.runner.cluster.spec == ""
    assert win.cluster_dialog(" tcp://127.0.0.1:8786 ") == "tcp://127.0.0.1:8786"
    assert win.settings.value("compute/cluster") == "tcp://127.0.0.1:8786"
    assert win.cluster_dialog("") == ""                   # back to this process
    assert win.runner.cluster.executor() is None


def test_scheme_comparison_runs_on_the_cluster(make_window, qtbot, tmp_path_factory):
    """With the setting on a running scheduler, the comparison tab's sweep of one tensor (a
    task per scheme) gives the in-process figures."""
    import pytest
    pytest.importorskip("distributed")
    from tests.app.apphelpers import wait_idle
    from tests.workbench.test_cluster import (_start_scheduler, _start_worker, _stop,
                                              _wait_workers)
    from workbench.quant.evaluate import DEFAULT_EVAL_CACHE, evaluate_tensor
    sched, address = _start_scheduler(tmp_path_factory.mktemp("dask"))
    worker = _start_worker(address)
    win = None
    try:
        _wait_workers(address, 1)
        win = make_window()
        name = "model.layers.1.mlp.up_proj.weight"
        schemes = ["q4_0", "q8_0", "int4-g128"]
        model = win.doc.model
        expected = {s: evaluate_tensor(model, name, s, None).to_dict() for s in schemes}
        DEFAULT_EVAL_CACHE.clear()
        for s in schemes:
            win.doc._results.pop((name, s), None)
        assert win.cluster_dialog(address) == address
        task = win.analyzer.compare(name, schemes)
        messages = []
        task.on_progress = lambda ev: messages.append(ev.message)
        wait_idle(qtbot, win, timeout=120000)
        assert task.state == "done"
        for s in schemes:
            assert win.doc.result_for(name, s).to_dict() == expected[s], s
        assert any(f"on {address}" in m for m in messages)
    finally:
        if win is not None:
            win.runner.cluster.close()
        _stop([worker, sched])

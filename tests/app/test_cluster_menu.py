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

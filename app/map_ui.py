"""Puts the model map and the file comparison (issue 23) into the main window: a "Model map"
tab, a "Compare files" tab and their menu entries.
Kept apart from main_window.py so the window itself changes by one call."""

from __future__ import annotations

from PySide6.QtGui import QAction, QKeySequence

from .model_map import ModelMapView

TAB_TITLE = "Model map"


def install(win) -> ModelMapView:
    view = ModelMapView(win.doc, win.push, win.select, getattr(win, "effects", None),
                        runner=win.runner)
    win.model_map = view
    win.map_tab_index = win.tabs.addTab(view, TAB_TITLE)
    menu = next((a.menu() for a in win.menuBar().actions()
                 if a.text().replace("&", "") == "View" and a.menu() is not None), None)
    if menu is not None:
        act = QAction("&Model Map", win)
        act.setShortcut(QKeySequence("Ctrl+6"))
        act.triggered.connect(lambda _c=False: win.tabs.setCurrentIndex(win.map_tab_index))
        menu.addAction(act)
    # the comparison with a second plan or quantized file
    from .diff_view import DiffView
    win.diff_view = DiffView(win.doc, win.runner, win.select)
    win.diff_tab_index = win.tabs.addTab(win.diff_view, "Compare files")
    file_menu = next((a.menu() for a in win.menuBar().actions()
                      if a.text().replace("&", "") == "File" and a.menu() is not None), None)
    if file_menu is not None:
        act = QAction("Compare &With…", win)
        act.triggered.connect(lambda _c=False: (win.tabs.setCurrentIndex(win.diff_tab_index),
                                                win.diff_view.choose()))
        file_menu.addAction(act)
    return view

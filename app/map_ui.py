"""Puts the model map (issue 23) into the main window: a "Model map" tab and its menu entry.
Kept apart from main_window.py so the window itself changes by one call."""

from __future__ import annotations

from PySide6.QtGui import QAction, QKeySequence

from .model_map import ModelMapView

TAB_TITLE = "Model map"


def install(win) -> ModelMapView:
    view = ModelMapView(win.doc, win.push, win.select, getattr(win, "effects", None))
    win.model_map = view
    win.map_tab_index = win.tabs.addTab(view, TAB_TITLE)
    menu = next((a.menu() for a in win.menuBar().actions()
                 if a.text().replace("&", "") == "View" and a.menu() is not None), None)
    if menu is not None:
        act = QAction("&Model Map", win)
        act.setShortcut(QKeySequence("Ctrl+6"))
        act.triggered.connect(lambda _c=False: win.tabs.setCurrentIndex(win.map_tab_index))
        menu.addAction(act)
    return view

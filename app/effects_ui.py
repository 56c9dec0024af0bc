"""Puts the plan-effects views (issue 11) into the main window: the end-to-end check beside the
totals, the selected tensor's sensitivity beside its plots, a "Sensitivity & Budget" tab, and an
Effects menu. Kept apart from main_window.py so the window itself changes by one call."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QHBoxLayout, QSplitter, QWidget

from .budget_view import BudgetPanel
from .check_panel import CheckPanel
from .effects import PlanEffects
from .sensitivity_view import SensitivityView, TensorSensitivity

TAB_TITLE = "Sensitivity && Budget"


def install(win) -> PlanEffects:
    fx = PlanEffects(win.doc, win.runner, win.settings, win.push, win)
    win.effects = fx

    # the check figures beside the totals
    win.check_panel = CheckPanel(fx)
    lay = win.centralWidget().layout()
    idx = lay.indexOf(win.totals)
    lay.removeWidget(win.totals)
    row = QWidget()
    h = QHBoxLayout(row)
    h.setContentsMargins(0, 0, 0, 0)
    h.setSpacing(6)
    h.addWidget(win.totals, 1)
    h.addWidget(win.check_panel, 1)
    lay.insertWidget(max(idx, 0), row)

    # the selected tensor's sensitivity beside its plots (a third pane of the plots' splitter,
    # under the tensor's title and summary line)
    win.tensor_sensitivity = TensorSensitivity(win.doc, fx)
    split = win.plots.splitter
    split.addWidget(win.tensor_sensitivity)
    split.setStretchFactor(2, 1)
    win.plots_split = split

    # the Sensitivity & Budget tab
    win.sensitivity_view = SensitivityView(win.doc, fx)
    win.budget_panel = BudgetPanel(win.doc, fx)
    tab = QSplitter(Qt.Orientation.Horizontal)
    tab.setObjectName("EffectsTab")
    tab.addWidget(win.sensitivity_view)
    tab.addWidget(win.budget_panel)
    tab.setStretchFactor(0, 2)
    tab.setStretchFactor(1, 3)
    win.effects_tab = tab
    win.effects_tab_index = win.tabs.addTab(tab, TAB_TITLE)

    def tab_shown(i: int) -> None:
        if i == win.effects_tab_index and win.doc.model is not None:
            fx.request_table()
    win.tabs.currentChanged.connect(tab_shown)
    win.doc.modelChanged.connect(lambda: tab_shown(win.tabs.currentIndex()))

    # menu
    m = QMenuHelper(win)
    m.action("&End-to-end Check", lambda: fx.set_check_enabled(not fx.check_enabled),
             "Ctrl+Shift+E", checkable=True, checked=fx.check_enabled, name="ToggleCheck")
    m.action("&Re-run Check Now", fx.check_now, "F5")
    m.action("&Calibration File…", win.check_panel.choose_calib)
    m.menu.addSeparator()
    m.action(f"&{TAB_TITLE}", lambda: win.tabs.setCurrentIndex(win.effects_tab_index), "Ctrl+4")
    m.action("Set &Budget", lambda: (win.tabs.setCurrentIndex(win.effects_tab_index),
                                     win.budget_panel.spin.setFocus(),
                                     win.budget_panel.spin.selectAll()), "Ctrl+B")
    m.action("&Pin / Unpin Current Tensor", lambda: fx.toggle_pin(win.doc.current), "Ctrl+K")
    toggle = m.actions["ToggleCheck"]
    fx.checkChanged.connect(lambda: toggle.setChecked(fx.check_enabled))
    return fx


class QMenuHelper:
    """An "Effects" menu inserted before Help."""

    def __init__(self, win):
        mb = win.menuBar()
        help_action = next((a for a in mb.actions() if a.text().replace("&", "") == "Help"), None)
        from PySide6.QtWidgets import QMenu
        self.menu = QMenu("Effe&cts", mb)
        if help_action is not None:
            mb.insertMenu(help_action, self.menu)
        else:
            mb.addMenu(self.menu)
        self.win = win
        self.actions: dict[str, QAction] = {}

    def action(self, text, slot, shortcut=None, checkable=False, checked=False, name=None):
        act = QAction(text, self.win)
        if shortcut:
            act.setShortcut(QKeySequence(shortcut))
        act.setCheckable(checkable)
        if checkable:
            act.setChecked(checked)
        act.triggered.connect(lambda _c=False: slot())
        self.menu.addAction(act)
        if name:
            self.actions[name] = act
        return act

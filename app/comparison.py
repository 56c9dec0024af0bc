"""Scheme and method comparison for the selected tensor: every eligible scheme side by side,
as a table beside a plot of bits per weight against SQNR (workbench.planning.scheme_choice: Pareto
points marked, the current scheme highlighted).

Rows and points fill in as the compute thread evaluates each scheme (results are cached, so
a scheme measured once is instant afterwards). Sortable; double-click a row (or Enter), or
click a point, to assign that scheme (one undoable edit).

Methods (issue 12): tick imatrix / gptq / awq and each scheme in scope (the RTN Pareto schemes
plus the current one, only the current one, or every quantizing scheme) gets a row per method
("q4_k · gptq"), computed off the GUI thread by ``workbench.running.methods_compare`` with the app's
calibration file (:mod:`app.method_compare`). Their layer output SQNR on the calibration inputs
(and RTN's, for the same schemes) fills the "Out SQNR" column, and the plot then shows that
figure with one series per method (its own colour and marker) and the Pareto front across all
of them. Clicking a point or activating a row assigns its scheme *and* method (one undoable
edit). Without a runnable model or calibration file the method boxes are disabled, and their
tooltip says why.

The table's columns, model and proxy, and MethodPoint, are in :mod:`app.comparison_model`.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (QAbstractItemView, QCheckBox, QComboBox, QHBoxLayout,
                               QHeaderView, QLabel, QPushButton, QSplitter, QTableView,
                               QVBoxLayout, QWidget)

from workbench.api.methods import applies

from .comparison_model import (C_BITS, C_BYTES, C_FAMILY, C_GBS, C_MAX, C_METHOD, C_OUT, C_REL,
                               C_SCHEME, C_SQNR, COLUMNS, SCOPES, SORT_ROLE, ComparisonModel,
                               ScopeProxy)
from .theme import mono_font
from .fit_label import FitLabel, never_widens


class ComparisonView(QWidget):
    def __init__(self, doc, analyzer, push, parent=None):
        super().__init__(parent)
        self.doc = doc
        self.analyzer = analyzer
        self.push = push
        self.task = None
        from .method_compare import CALIBRATED, MethodComparer
        self.comparer = MethodComparer(doc, analyzer.runner, self)
        self.model = ComparisonModel(doc, self.comparer, self)
        self.proxy = ScopeProxy(self)
        self.proxy.setSourceModel(self.model)
        self.proxy.setSortRole(SORT_ROLE)
        self.view = QTableView()
        self.view.setModel(self.proxy)
        self.view.setSortingEnabled(True)
        self.view.sortByColumn(C_BITS, Qt.SortOrder.DescendingOrder)
        self.view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.view.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.view.setAlternatingRowColors(True)
        self.view.verticalHeader().hide()
        self.view.verticalHeader().setDefaultSectionSize(19)
        self.view.setWordWrap(False)
        hdr = self.view.horizontalHeader()
        hdr.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        hdr.setStretchLastSection(True)
        hdr.setSectionsMovable(True)
        from PySide6.QtGui import QFontMetrics
        text, mono = self.view.fontMetrics(), QFontMetrics(mono_font())
        for col, sample in ((C_SCHEME, "● int8-g128-asym · imatrix"), (C_FAMILY, "GGML legacy"),
                            (C_BITS, "32.000"), (C_BYTES, "1023 KiB"), (C_REL, "1.234e-05"),
                            (C_SQNR, "166.44"), (C_MAX, "1.234e-05"), (C_GBS, "12.3"),
                            (C_METHOD, "imatrix"), (C_OUT, "166.44")):
            # + 40: the text stays centred clear of the sort arrow at the section's right
            head = hdr.fontMetrics().horizontalAdvance(COLUMNS[col]) + 40
            fm = text if col in (C_SCHEME, C_FAMILY, C_METHOD) else mono
            self.view.setColumnWidth(col, max(fm.horizontalAdvance(sample) + 16, head))
        # with methods on, Method and Out SQNR sit next to the scheme (seen in a narrow pane)
        hdr.moveSection(hdr.visualIndex(C_METHOD), 1)
        hdr.moveSection(hdr.visualIndex(C_OUT), 2)
        self.view.doubleClicked.connect(self._assign)
        self.view.activated.connect(self._assign)
        from .plots.scheme_points import SchemePointsPlot
        self.plot = SchemePointsPlot()
        self.plot.picked.connect(self.assign_scheme)
        self.plot.pickedMethod.connect(self.assign_pair)
        # a shorter form when narrow, never cut mid-word
        self.label = never_widens(FitLabel("Select a tensor to compare every scheme that can "
                                           "take it."))
        self.label.setObjectName("Muted")
        self.hover = QLabel(" ")
        self.hover.setObjectName("HoverReadout")
        never_widens(self.hover)
        self.plot.hovered.connect(self.hover.setText)
        self.run_button = QPushButton("Compare all schemes")
        self.run_button.clicked.connect(self.run)
        # methods: a box per calibrated method, and which schemes get method rows
        self.methods_label = QLabel("Methods:")
        self.method_boxes: dict[str, QCheckBox] = {}
        for m in CALIBRATED:
            box = QCheckBox(m)
            box.setObjectName(f"Method_{m}")
            box.toggled.connect(self._methods_changed)
            self.method_boxes[m] = box
        self.scope_combo = QComboBox()
        self.scope_combo.setObjectName("MethodScope")
        for key, text in SCOPES.items():
            self.scope_combo.addItem(text, key)
        self.scope_combo.setToolTip("which schemes get a row per method (the RTN Pareto schemes "
                                    "and the tensor's current scheme by default)")
        self.scope_combo.currentIndexChanged.connect(lambda _i: self._methods_changed())
        bar = QHBoxLayout()
        bar.addWidget(self.label, 1)
        bar.addWidget(self.methods_label)
        for box in self.method_boxes.values():
            bar.addWidget(box)
        bar.addWidget(self.scope_combo)
        bar.addWidget(self.run_button)
        self.split = QSplitter(Qt.Orientation.Horizontal)
        self.split.addWidget(self.view)
        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.setSpacing(2)
        rl.addWidget(self.plot, 1)
        rl.addWidget(self.hover)
        self.split.addWidget(right)
        self.split.setStretchFactor(0, 5)
        self.split.setStretchFactor(1, 4)
        # the table's first width: its key columns whole (Scheme to Rel. RMSE, what one
        # compares), the plot keeping at least PLOT_MIN; until the user moves the divider
        self._split_user = False
        self.split.splitterMoved.connect(lambda *_a: setattr(self, "_split_user", True))
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 4, 0, 0)
        lay.addLayout(bar)
        lay.addWidget(self.split, 1)
        self._pending: str | None = None
        self._methods_pending = False   # start the methods once the scheme comparison is done
        self._scope_key = None
        # points are redrawn at most every 150 ms while results stream in
        self._replot = QTimer(self, singleShot=True, interval=150)
        self._replot.timeout.connect(self.refresh_plot)
        doc.currentChanged.connect(self._current)
        doc.modelChanged.connect(lambda: self._current(""))
        doc.modelChanged.connect(self.update_method_boxes)
        doc.resultAdded.connect(self._result)
        doc.stateChanged.connect(self._state)
        self.comparer.resultAdded.connect(lambda n, _s, _m: self._result(n, _s))
        self.comparer.statsFailed.connect(self._stats_failed)
        self.comparer.nonLinear.connect(lambda _n: self._refresh_methods_ui())
        self.comparer.runnableKnown.connect(self.update_method_boxes)
        analyzer.runner.taskFinished.connect(self._task_finished)
        self._show_method_columns()
        self.update_method_boxes()

    # ---- methods -----------------------------------------------------------------------------
    def set_calib_source(self, fn) -> None:
        """Where the calibration file comes from (the window's PlanEffects.calib)."""
        self.comparer.calib_source = fn
        self.update_method_boxes()

    def selected_methods(self) -> list[str]:
        return [m for m, b in self.method_boxes.items() if b.isChecked() and b.isEnabled()]

    def set_methods(self, methods, scope: str | None = None) -> None:
        """Tick exactly `methods` (and choose the scope: pareto | current | all)."""
        if scope is not None:
            self.scope_combo.blockSignals(True)
            self.scope_combo.setCurrentIndex(list(SCOPES).index(scope))
            self.scope_combo.blockSignals(False)
        for m, b in self.method_boxes.items():
            b.blockSignals(True)
            b.setChecked(m in methods)
            b.blockSignals(False)
        self._methods_changed()

    def update_method_boxes(self) -> None:
        """Enable the method boxes where calibration can be collected; else say why."""
        why = self.comparer.unavailable() if self.doc.model is not None else "no model open"
        if why is None:
            why = self.comparer.tensor_unavailable(self.model.name) if self.model.name else None
        for m, b in self.method_boxes.items():
            b.setEnabled(why is None)
            from workbench.api.methods import get_method
            b.setToolTip(f"{get_method(m).description}. Needs calibration inputs: {why}"
                         if why else f"{get_method(m).description} (calibration: "
                         f"{self.comparer.calib()})")
        self.methods_label.setEnabled(why is None)
        self.scope_combo.setEnabled(why is None)
        self.methods_label.setToolTip(why or "")

    def _scope(self, methods=None) -> list[str]:
        """The schemes that get method rows: quantizing schemes some ticked method applies to,
        chosen by the scope box; it grows while the tensor stays selected (a scheme assigned
        meanwhile joins, the rows already made stay)."""
        name = self.model.name
        methods = list(self.model.methods if methods is None else methods)
        if not name or not methods:
            return []
        key = self.scope_combo.currentData()
        cur = self.doc.scheme_of(name)
        if key != "all":
            # the Pareto marks are refreshed with the plot (at most every 150 ms while results
            # stream in): from every result in hand, or the scope missed the last ones (a
            # scope of 30-49 of 51 Pareto schemes when the methods started at once)
            self.model.update_pareto()
        quantizing = [s for s in self.model.schemes
                      if any(applies(m, s) is None for m in methods)]
        if key == "all":
            out = quantizing
        else:
            want = {cur} if key == "current" else ({cur} | self.model.pareto)
            if self._scope_key == key:      # assigned since: earlier rows stay
                want |= set(self.model.scope)
            out = [s for s in quantizing if s in want]
        self._scope_key = key
        return out

    def _methods_changed(self, *_a) -> None:
        self.update_method_boxes()
        methods = self.selected_methods()
        self.model.set_methods(methods, self._scope(methods))
        self._show_method_columns()
        self._set_label()
        self.refresh_plot()
        self.run_methods()

    def _show_method_columns(self) -> None:
        on = self.model.methods_on
        self.view.setColumnHidden(C_METHOD, not on)
        self.view.setColumnHidden(C_OUT, not on)
        self._fit_split()

    def _refresh_methods_ui(self) -> None:
        self.update_method_boxes()
        if not self.selected_methods() and self.model.methods:
            self.model.set_methods([], [])
            self._show_method_columns()
            self.refresh_plot()

    def run_methods(self) -> None:
        """Compute the pairs in scope not computed yet (after the scheme comparison, whose
        Pareto points choose the default scope)."""
        name = self.model.name
        if not name or not self.model.methods_on or not self.isVisible():
            return
        if self.task is not None and not self.task.finished:
            self._methods_pending = True
            return
        if self._methods_pending:       # the Pareto points were partial until now: start
            self._scope_key = None      # the scope afresh from the complete comparison
        self._methods_pending = False
        scope = self._scope()
        if scope != self.model.scope:
            self.model.set_methods(self.model.methods, scope)
            self._set_label()
        self.comparer.request(name, self.model.pairs())

    def _task_finished(self, task) -> None:
        if task is self.task and self._methods_pending:
            self.run_methods()

    def _stats_failed(self, name: str, message: str) -> None:
        self._refresh_methods_ui()
        if self.analyzer.on_error is not None and name == self.model.name:
            self.analyzer.on_error("Method comparison", message)

    # ---- the tensor ----------------------------------------------------------------------
    def _current(self, name: str) -> None:
        if self.task is not None and not self.task.finished:
            self.task.cancel()
        self.comparer.cancel()
        self._pending = name or ""
        if self.isVisible() or not name:
            self._apply_pending()

    def _apply_pending(self) -> None:
        """Fill the table for the current tensor (deferred while the tab is hidden, so a
        selection does not pay for a table nobody sees)."""
        name, self._pending = self._pending, None
        if name is None:
            return
        self.model.set_tensor(name or None)
        self.update_method_boxes()
        methods = self.selected_methods()
        self._scope_key = None
        self.model.set_methods(methods, self._scope(methods))
        self._show_method_columns()
        self.refresh_plot()
        if name:
            self._set_label()
            if self.isVisible():
                self.run()

    def _set_label(self) -> None:
        self._label_text()
        self.label.setToolTip(self.label.text())

    def _label_text(self) -> None:
        name = self.model.name
        if not name:
            self.label.setText("Select a tensor to compare every scheme that can take it.")
        elif self.model.methods_on:
            n, ms = len(self.model.scope), ", ".join(self.model.methods)
            calib = Path(self.comparer.calib()).name
            self.label.set_forms([
                f"{name}: {n} schemes × rtn, {ms}; Out SQNR: layer output on {calib}; ◆ Pareto "
                "· ● current · click a point or double-click a row to assign scheme + method",
                f"{name}: {n} schemes × rtn, {ms}; Out SQNR: layer output on {calib}; "
                "◆ Pareto · ● current",
                f"{n} schemes × rtn, {ms}; Out SQNR on {calib}; ◆ Pareto · ● current",
                f"{n} schemes × {len(self.model.methods) + 1} methods · ◆ Pareto · ● current"])
        else:
            n = len(self.model.schemes)
            self.label.set_forms([
                f"{name}: all {n} eligible schemes; ◆ Pareto · ● current · double-click a row "
                "or click a point to assign",
                f"{name}: all {n} eligible schemes; ◆ Pareto · ● current",
                f"all {n} eligible schemes; ◆ Pareto · ● current · click a point to assign",
                f"{n} eligible schemes · ◆ Pareto · ● current"])

    PLOT_MIN = 380

    def table_want(self) -> int:
        """Width that shows the Scheme, Bits/w, SQNR and Rel. RMSE columns (and the Method
        columns when shown) whole, with the frame and the vertical scroll bar."""
        cols = [C_SCHEME, C_BITS, C_SQNR, C_REL] + (
            [C_METHOD, C_OUT] if self.model.methods_on else [])
        w = sum(self.view.columnWidth(c) for c in cols if not self.view.isColumnHidden(c))
        return w + 2 * self.view.frameWidth() + self.view.verticalScrollBar().sizeHint().width() + 2

    def _fit_split(self) -> None:
        total = self.split.width() - self.split.handleWidth()
        if self._split_user or total <= 0:
            return
        table = min(self.table_want(), max(total - self.PLOT_MIN, total // 2))
        self.split.setSizes([table, total - table])

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._fit_split()

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self._fit_split()
        self.update_method_boxes()
        if self._pending is not None:
            self._apply_pending()
        elif self.model.name and (self.task is None or self.task.finished):
            self.run()

    def run(self) -> None:
        if self.model.name:
            missing = [s for s in self.model.schemes
                       if self.doc.result_for(self.model.name, s) is None
                       or (self.model.name, s) not in self.doc.throughput]
            if missing:
                self.task = self.analyzer.compare(self.model.name, missing)
            self.run_methods()

    def _result(self, name: str, _scheme: str) -> None:
        if name == self.model.name and not self._replot.isActive():
            self._replot.start()

    def _state(self, names) -> None:
        name = self.model.name
        if name and self.model.methods_on and name not in names and \
                set(names) & set(self.comparer.peers(name)):
            # a fold peer's scheme or method changed: the pairs are measured again in that plan
            self.model.beginResetModel()
            self.model.endResetModel()
            self.refresh_plot()
            if self.isVisible():
                self.run_methods()
        if self.model.name in names:
            if self.model.methods_on and self.doc.scheme_of(self.model.name) not in \
                    self.model.scope and self.isVisible():
                self.run_methods()          # the new current scheme joins the scope
            self.plot.set_current(self._plot_current())

    def _plot_current(self):
        name = self.model.name
        if not name:
            return None
        if self.model.methods_on:
            return self.model.current_key()
        return self.doc.scheme_of(name)

    def plot_settled(self) -> bool:
        """No redraw of the points is waiting (results that arrived are on the plot)."""
        return not self._replot.isActive()

    def refresh_plot(self) -> None:
        """Points of every scheme (or, with methods, every pair) evaluated so far, Pareto
        marked."""
        self.model.update_pareto()
        self.plot.set_points(self.model.points(), self._plot_current(), self.model.methods_on)

    def _assign(self, index) -> None:
        scheme, method = self.model.rows[self.proxy.mapToSource(index).row()]
        if self.model.methods_on or method != "rtn":
            self.assign_pair(scheme, method)
        else:
            self.assign_scheme(scheme)

    def assign_scheme(self, scheme: str) -> None:
        """One undoable edit: the compared tensor gets `scheme`."""
        if not self.model.name or scheme == self.doc.scheme_of(self.model.name):
            return
        from .commands import assign
        self.push(assign(self.doc, [self.model.name], scheme))

    def assign_pair(self, scheme: str, method: str) -> None:
        """One undoable edit: the compared tensor gets `scheme` and `method`."""
        if not self.model.name:
            return
        from .commands import assign_with_method
        cmd = assign_with_method(self.doc, [self.model.name], scheme, method)
        if cmd is not None:
            self.push(cmd)

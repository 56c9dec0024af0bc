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
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QSortFilterProxyModel, Qt, QTimer
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (QAbstractItemView, QCheckBox, QComboBox, QHBoxLayout,
                               QHeaderView, QLabel, QPushButton, QSplitter, QTableView,
                               QVBoxLayout, QWidget)

from workbench.running.methods_compare import applies
from workbench.quant.plan import KEEP
from workbench.planning.scheme_choice import family_of, pareto_front, points_from_results

from .commands import schemes_for
from .format import fmt_bytes, fmt_db, fmt_float, fmt_gbs
from .theme import MUTED, mono_font, sqnr_colour

COLUMNS = ("Scheme", "Bits/w", "SQNR dB", "Rel. RMSE", "Bytes", "Max err", "GB/s", "Family",
           "Method", "Out SQNR dB")
(C_SCHEME, C_BITS, C_SQNR, C_REL, C_BYTES, C_MAX, C_GBS, C_FAMILY, C_METHOD,
 C_OUT) = range(len(COLUMNS))
SORT_ROLE = Qt.ItemDataRole.UserRole + 30
SCOPES = {"pareto": "Pareto schemes + current", "current": "current scheme",
          "all": "every quantizing scheme"}
HEADER_TIPS = {
    C_SQNR: "weight SQNR: 10·log10(‖W‖² / ‖W − Ŵ‖²)",
    C_OUT: "layer output SQNR on the calibration inputs X: −10·log10(‖X(W − Ŵ)ᵀ‖² / ‖XWᵀ‖²) "
           "(what GPTQ and AWQ minimise; computed for the schemes in the methods' scope)",
    C_METHOD: "quantization method (workbench.quant.methods): rtn is the scheme's own rounding"}


@dataclass(frozen=True)
class MethodPoint:
    """One (scheme, method) on the methods plot: bits per weight against layer output SQNR."""
    scheme: str
    method: str
    family: str
    bits_per_weight: float
    sqnr_db: float            # layer output SQNR (the plotted y)
    weight_sqnr_db: float
    rel_rmse: float
    bytes: int
    pareto: bool = False

    @property
    def label(self) -> str:
        return f"{self.scheme} · {self.method}"


class ComparisonModel(QAbstractTableModel):
    """Rows: one per eligible scheme (rtn, `schemes` order), then one per (scheme in `scope`,
    method in `methods`) the method applies to."""

    def __init__(self, doc, comparer=None, parent=None):
        super().__init__(parent)
        self.doc = doc
        self.comparer = comparer
        self.name: str | None = None
        self.schemes: list[str] = []
        self.methods: list[str] = []        # ticked methods besides rtn
        self.scope: list[str] = []          # schemes that get method rows (and Out SQNR)
        self.rows: list[tuple[str, str]] = []
        self.pareto: set[str] = set()       # rtn: schemes on the weight-SQNR front
        self.mpareto: set[tuple] = set()    # methods: (scheme, method) on the output front
        self._row: dict[tuple, int] = {}
        self._mono = mono_font()
        doc.resultAdded.connect(self._result)
        doc.throughputChanged.connect(self._gbs)
        doc.stateChanged.connect(self._state)
        if comparer is not None:
            comparer.resultAdded.connect(self._method_result)

    @property
    def methods_on(self) -> bool:
        return bool(self.methods and self.scope)

    def set_tensor(self, name: str | None) -> None:
        self.beginResetModel()
        self.name = name
        self.schemes = list(schemes_for(self.doc.model.info(name))) if name else []
        self.scope = []
        self._build_rows()
        self.pareto = {p.scheme for p in self._rtn_points() if p.pareto}
        self.mpareto = {(p.scheme, p.method) for p in self.method_points() if p.pareto}
        self.endResetModel()

    def set_methods(self, methods, scope) -> None:
        methods = [m for m in methods if m != "rtn"]
        scope = [s for s in scope if s in self.schemes] if self.name else []
        if methods == self.methods and scope == self.scope:
            return
        self.beginResetModel()
        self.methods, self.scope = list(methods), scope
        self._build_rows()
        self.mpareto = {(p.scheme, p.method) for p in self.method_points() if p.pareto}
        self.endResetModel()

    def _build_rows(self) -> None:
        rows = [(s, "rtn") for s in self.schemes]
        for s in self.scope if self.methods else []:
            rows += [(s, m) for m in self.methods if applies(m, s) is None]
        self.rows = rows
        self._row = {r: i for i, r in enumerate(rows)}

    def pairs(self) -> list[tuple[str, str]]:
        """The (scheme, method) pairs the methods view computes: rtn and each ticked method
        for every scheme in scope."""
        if not self.methods_on:
            return []
        return [(s, "rtn") for s in self.scope] + [r for r in self.rows if r[1] != "rtn"]

    def update_pareto(self) -> None:
        new = {p.scheme for p in self._rtn_points() if p.pareto}
        newm = {(p.scheme, p.method) for p in self.method_points() if p.pareto}
        if (new, newm) != (self.pareto, self.mpareto):
            self.pareto, self.mpareto = new, newm
            if self.rows:
                self.dataChanged.emit(self.index(0, 0), self.index(len(self.rows) - 1, 0))

    def _emit_row(self, key) -> None:
        r = self._row.get(key)
        if r is not None:
            self.dataChanged.emit(self.index(r, 0), self.index(r, len(COLUMNS) - 1))

    def _result(self, name: str, scheme: str) -> None:
        if name == self.name:
            self._emit_row((scheme, "rtn"))

    def _method_result(self, name: str, scheme: str, method: str) -> None:
        if name == self.name:
            self._emit_row((scheme, method))

    def _gbs(self, names) -> None:
        if self.name in names and self.rows:
            self.dataChanged.emit(self.index(0, C_GBS), self.index(len(self.rows) - 1, C_GBS))

    def _state(self, names) -> None:
        if self.name in names and self.rows:
            self.dataChanged.emit(self.index(0, 0), self.index(len(self.rows) - 1, 0))

    def rowCount(self, parent=QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent=QModelIndex()) -> int:
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section, orientation, role=Qt.ItemDataRole.DisplayRole):
        if orientation == Qt.Orientation.Horizontal:
            if role == Qt.ItemDataRole.DisplayRole:
                return COLUMNS[section]
            if role == Qt.ItemDataRole.ToolTipRole:
                return HEADER_TIPS.get(section)
        return None

    def method_result(self, scheme: str, method: str):
        """workbench.running.methods_compare.MethodResult of a pair (None: not computed; an exception:
        the pair could not be made)."""
        if self.comparer is None or not self.name:
            return None
        return self.comparer.get(self.name, scheme, method)

    def current_key(self) -> tuple[str, str] | None:
        """The row of the tensor's (scheme, method); its scheme's rtn row when the method has
        no row here."""
        if not self.name:
            return None
        key = (self.doc.scheme_of(self.name), self.doc.method_of(self.name))
        return key if key in self._row else (key[0], "rtn")

    def value(self, scheme: str, col: int, method: str = "rtn"):
        if col == C_SCHEME:
            return scheme
        if col == C_METHOD:
            return method
        if col == C_FAMILY:
            return family_of(scheme)
        if col == C_GBS:
            return self.doc.throughput.get((self.name, scheme))
        mr = self.method_result(scheme, method)
        if isinstance(mr, Exception):
            mr = None
        if col == C_OUT:
            return None if mr is None else mr.out_sqnr_db
        r = self.doc.result_for(self.name, scheme) if method == "rtn" else \
            (mr.result if mr is not None else None)
        if col in (C_BITS, C_BYTES):
            b = r.bytes if r is not None else self.doc.estimated_bytes(self.name, scheme)
            n = self.doc.model.info(self.name).numel
            return b if col == C_BYTES else (8.0 * b / n if n else 0.0)
        if r is None:
            return None
        return {C_REL: r.error.rel_rmse, C_SQNR: r.error.sqnr_db, C_MAX: r.error.max_abs_err}[col]

    def _rtn_points(self):
        if not self.name:
            return []
        info = self.doc.model.info(self.name)
        rs = [r for r in (self.doc.result_for(self.name, s) for s in self.schemes)
              if r is not None]
        return points_from_results(rs, info)

    def method_points(self) -> list[MethodPoint]:
        """MethodPoints of the pairs computed so far (Pareto across every method marked)."""
        if not self.name:
            return []
        n = self.doc.model.info(self.name).numel
        rows = []
        for s, m in self.pairs():
            mr = self.method_result(s, m)
            if mr is None or isinstance(mr, Exception) or mr.out_sqnr_db is None:
                continue
            r = mr.result
            rows.append((s, m, 8.0 * r.bytes / n if n else 0.0, mr.out_sqnr_db, r))
        front = pareto_front((f"{s} · {m}", b, q) for s, m, b, q, _r in rows)
        return [MethodPoint(s, m, family_of(s), b, q, r.error.sqnr_db, r.error.rel_rmse, r.bytes,
                            f"{s} · {m}" in front) for s, m, b, q, r in rows]

    def points(self):
        """The plotted points: with methods, the MethodPoints (layer output SQNR); else the
        workbench.planning.scheme_choice points of the schemes evaluated so far (Pareto marked)."""
        return self.method_points() if self.methods_on else self._rtn_points()

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        (scheme, method), col = self.rows[index.row()], index.column()
        v = self.value(scheme, col, method)
        mr = self.method_result(scheme, method) if col in (C_SCHEME, C_OUT) else None
        if role == Qt.ItemDataRole.DisplayRole:
            if col == C_SCHEME:
                current = self.current_key() == (scheme, method)
                pareto = (scheme, method) in self.mpareto if self.methods_on \
                    else (method == "rtn" and scheme in self.pareto)
                label = scheme if method == "rtn" else f"{scheme} · {method}"
                return f"{'● ' if current else ''}{label}{'  ◆' if pareto else ''}"
            if col in (C_FAMILY, C_METHOD):
                return v
            if v is None:
                if col == C_GBS and (self.name, scheme) in self.doc.throughput:
                    return "n/a"
                if col == C_OUT:
                    if isinstance(mr, Exception):
                        return "n/a"
                    return "…" if self.methods_on and scheme in self.scope else "—"
                if method != "rtn" and isinstance(self.method_result(scheme, method), Exception):
                    return "n/a"
                return "…"
            return {C_BITS: lambda x: f"{x:.3f}", C_BYTES: fmt_bytes, C_REL: fmt_float,
                    C_SQNR: fmt_db, C_MAX: fmt_float, C_GBS: fmt_gbs, C_OUT: fmt_db}[col](v)
        if role == Qt.ItemDataRole.ToolTipRole and col in (C_SCHEME, C_OUT):
            tips = []
            if isinstance(mr, Exception):
                tips.append(f"{scheme} · {method} could not be made: {mr}")
            elif mr is not None and mr.notes:
                tips += mr.notes
            if col == C_SCHEME and ((scheme, method) in self.mpareto if self.methods_on
                                    else (method == "rtn" and scheme in self.pareto)):
                tips.insert(0, "◆ Pareto point: no other row has as few bits per weight and as "
                               "high an SQNR" + (" (layer output)" if self.methods_on else ""))
            return "\n".join(tips) or None
        if role == SORT_ROLE:
            if col in (C_SCHEME, C_FAMILY, C_METHOD):
                return {C_SCHEME: f"{scheme} {method}", C_FAMILY: f"{v} {scheme} {method}",
                        C_METHOD: f"{method} {scheme}"}[col]
            if v is None:
                return -math.inf
            return 1e300 if isinstance(v, float) and math.isinf(v) else v
        if role == Qt.ItemDataRole.FontRole and col not in (C_SCHEME, C_FAMILY, C_METHOD):
            return self._mono
        if role == Qt.ItemDataRole.TextAlignmentRole and col not in (C_SCHEME, C_FAMILY,
                                                                     C_METHOD):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == Qt.ItemDataRole.ForegroundRole:
            if col == C_FAMILY:
                from .plots.scheme_points import FAMILY_COLOURS
                return QBrush(QColor(FAMILY_COLOURS.get(v, "#c9ced8")))
            if col == C_METHOD:
                from .plots.scheme_points import METHOD_COLOURS
                return QBrush(QColor(METHOD_COLOURS.get(v, "#c9ced8")))
            if col in (C_SQNR, C_OUT) and v is not None:
                c = sqnr_colour(v)
                return QBrush(c) if c is not None else None
            if v is None:
                return QBrush(QColor(MUTED))
        return None


class ScopeProxy(QSortFilterProxyModel):
    """Sorts; with methods on, shows only the schemes in the methods' scope (their rtn row and
    a row per method), the set the plot shows."""

    def filterAcceptsRow(self, row, parent) -> bool:
        m = self.sourceModel()
        if not m.methods_on:
            return True
        return m.rows[row][0] in m.scope


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
        from .fit_label import FitLabel     # a shorter form when narrow, never cut mid-word
        self.label = FitLabel("Select a tensor to compare every scheme that can take it.")
        self.label.setObjectName("Muted")
        self.label.setMinimumWidth(1)
        from PySide6.QtWidgets import QSizePolicy
        self.label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.hover = QLabel(" ")
        self.hover.setObjectName("HoverReadout")
        self.hover.setMinimumWidth(1)
        self.hover.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
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
            from workbench.quant.methods import get_method
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

"""The data behind the scheme comparison (:mod:`app.comparison`): its columns, the table model
(a row per eligible scheme, and per (scheme, method) with methods ticked, filled from the
document's cached results and the method comparer's), the proxy that sorts it and keeps the
methods' scope, and MethodPoint, a (scheme, method) on the methods plot."""

from __future__ import annotations

import math
from dataclasses import dataclass

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QSortFilterProxyModel, Qt
from PySide6.QtGui import QBrush, QColor

from workbench.api.methods import applies
from workbench.api.choices import family_of, pareto_front, points_from_results

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

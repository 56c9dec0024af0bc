"""The always-visible totals: size before/after, bits per weight, model SQNR, kernel backend."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QSizePolicy, QVBoxLayout

from .fit_label import FitLabel
from .format import db_text, fmt_bytes, fmt_gbs, plural
from .theme import MUTED, sqnr_colour


def _style(widget, css: str) -> None:
    """Set a widget's style sheet only when it changes: setting one, even the same text,
    re-polishes the widget and lays the bar out again (a few ms on every refresh)."""
    if widget.styleSheet() != css:
        widget.setStyleSheet(css)


def _text(widget, text: str) -> None:
    if widget.text() != text:
        widget.setText(text)


def _tip(widget, text: str) -> None:
    if widget.toolTip() != text:
        widget.setToolTip(text)


class _Stat(QFrame):
    def __init__(self, caption: str, name: str):
        super().__init__()
        self.setObjectName("TotalsCell")
        self.value = QLabel("—")
        self.value.setObjectName(name)
        self.value.setProperty("role", "value")
        self.caption = QLabel(caption)
        self.caption.setProperty("role", "caption")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(12, 4, 12, 4)
        lay.setSpacing(0)
        lay.addWidget(self.caption)
        lay.addWidget(self.value)


class TotalsBar(QFrame):
    def __init__(self, doc, parent=None):
        super().__init__(parent)
        self.doc = doc
        self.setObjectName("TotalsBar")
        self.size = _Stat("MODEL SIZE  before → after", "TotalSize")
        self.ratio = _Stat("COMPRESSION", "TotalRatio")
        self.bits = _Stat("AVG BITS / WEIGHT", "TotalBits")
        self.sqnr = _Stat("MODEL SQNR", "TotalSqnr")
        self.backend = _Stat("KERNELS  backend · dequant", "TotalBackend")
        self.status = FitLabel("")
        self.status.setObjectName("Muted")
        self.status.setMinimumWidth(1)
        self.status.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.status.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        # the one-line fallback summary (workbench.quant.runtimes.FallbackSummary, as `evaluate`
        # prints it): how many tensors and what share of parameters fell back or were kept
        self.fallbacks = FitLabel("")
        self.fallbacks.setObjectName("FallbackSummary")
        self.fallbacks.setMinimumWidth(1)
        self.fallbacks.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.fallbacks.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(6, 4, 6, 4)
        lay.setSpacing(2)
        for w in (self.size, self.ratio, self.bits, self.sqnr, self.backend):
            lay.addWidget(w)
        side = QVBoxLayout()
        side.setSpacing(0)
        side.addWidget(self.status)
        side.addWidget(self.fallbacks)
        lay.addLayout(side, 1)
        self.last = None
        self.runner = None     # app.workers.Runner (set by the window): what a figure waits for
        self._status: list[str] = [""]
        self._fallbacks: list[str] = [""]
        for sig in (doc.modelChanged, doc.backendChanged):
            sig.connect(lambda *_: self.refresh())
        for sig in (doc.stateChanged, doc.resultsChanged, doc.throughputChanged,
                    doc.estimatesChanged):
            sig.connect(lambda *_: self.refresh())

    def _job(self, prefix: str, what: str) -> str | None:
        from .work_queue import waiting_text
        return waiting_text(self.runner, prefix, what)

    def _fit(self) -> None:
        """The longest form of the status and fallback lines that fits (a narrow window, or
        the end-to-end check beside the bar, clipped them at the left: "nsors · 39 tensors")."""
        self.status.set_forms(self._status)
        self.fallbacks.set_forms(self._fallbacks)

    def refresh(self) -> None:
        t = self.doc.totals()
        self.last = t
        if self.doc.model is None:
            return
        _text(self.size.value, f"{fmt_bytes(t.bytes_before)} → {fmt_bytes(t.bytes_after)}")
        _text(self.ratio.value, f"{t.compression:.2f}×")
        _text(self.bits.value, f"{t.bits_per_weight:.3f}")
        if t.sqnr_db is None and t.sqnr_estimate_db is not None:
            # large tensors just edited: their sampled-rows estimate until the exact error
            _text(self.sqnr.value, f"≈{db_text(t.sqnr_estimate_db)}")
            c = sqnr_colour(t.sqnr_estimate_db)
            _style(self.sqnr.value, f"color: {c.name()};" if c is not None else "")
            _tip(self.sqnr.value,
                 f"Estimated: {plural(t.estimated, 'large tensor')} measured on evenly spaced "
                 "rows so far (workbench.planning.estimate); the exact figure follows.")
            self._status = [f"evaluating error of {t.pending} tensor(s)… (≈: sampled rows)",
                            f"evaluating error of {t.pending} tensor(s)…",
                            f"evaluating {t.pending}…", ""]
        elif t.sqnr_db is None:
            # not a bare "…": how far the evaluation is and what it waits for (issue 33)
            n = len(self.doc.model.tensors)
            measured = f"{n - t.pending}/{n} measured"
            _text(self.sqnr.value, measured)
            _style(self.sqnr.value, f"color: {MUTED}; font-size: 10pt;")
            job = self._job("Evaluating error", "the error evaluation") or \
                self._job("Analysing ", "the selected tensor's analysis") or \
                "the error evaluation starts"
            _tip(self.sqnr.value, f"Model SQNR: {measured} tensors so far; {job}")
            self._status = [f"error: {measured} · {job}", f"error: {measured}", ""]
        else:
            _text(self.sqnr.value, db_text(t.sqnr_db))
            _tip(self.sqnr.value, "")
            c = sqnr_colour(t.sqnr_db)
            _style(self.sqnr.value, f"color: {c.name()};" if c is not None else "")
            n = len(self.doc.model.tensors)
            self._status = [f"{self.doc.model.format} · {n} tensors", f"{n} tensors", ""]
        gbs = throughput_text(self.doc, t)
        if gbs == "GB/s pending":   # say what measures it and whether it runs yet
            from .work_queue import find
            hit = find(self.runner, "Analysing ") if self.runner is not None else None
            gbs = "GB/s: queued" if hit is not None and hit[1] != "running" else \
                "GB/s: measuring"
            _tip(self.backend, self._job("Analysing ", "the throughput measurement") or "")
        backend = self.doc.backend.upper() if self.doc.backend != "…" else "finding backend"
        _text(self.backend.value, f"{backend} · {gbs}")
        fs = self.doc.fallback_summary()
        self._fallbacks = [short_summary(fs), short_summary(fs, compact=True), ""]
        self._fit()
        _tip(self.fallbacks, f"What the plan's schemes become (workbench.quant.runtimes, as "
                             f"`evaluate` reports it):\n{fs.line()}")
        _style(self.fallbacks, "color: #d29922;" if fs.changed else "")
        _tip(self.backend.value,
             "Dequantize throughput of the kernels, warm runs only (JIT compilation excluded): "
             "float32 GB/s written, the size-weighted mean over the tensors measured so far "
             "(each tensor's best timed run); (N/M): N of the M weight matrices measured. "
             "Tools > Measure Dequant Throughput measures every tensor.")


def throughput_text(doc, t) -> str:
    """'13.1 GB/s warm (5/22)': the mean over 5 of 22 matrices / 'pending' / 'n/a'."""
    if t.throughput_gbs:
        total = doc.matrix_count() if doc.model is not None else t.measured
        return f"{fmt_gbs(t.throughput_gbs)} GB/s warm ({t.measured}/{max(total, t.measured)})"
    if doc.model is not None and doc.current and (doc.current, doc.scheme_of(doc.current)) \
            not in doc.throughput:
        return "GB/s pending"
    return "GB/s n/a"


def short_summary(fs, compact: bool = False) -> str:
    """'fell back: 34 tensors (84.3% of params) · kept: 64 (0.1%)' from a FallbackSummary;
    `compact`: 'fell back: 34 (84.3%) · kept: 64 (0.1%)' (a narrow window)."""
    parts = []
    tensors, params = ("", "") if compact else (" tensors", " of params")
    if fs.tensors["fallback"]:
        parts.append(f"fell back: {fs.tensors['fallback']}{tensors} "
                     f"({100 * fs.share('fallback'):.1f}%{params})")
    if fs.tensors["skipped"]:
        parts.append(f"rules skipped: {fs.tensors['skipped']} "
                     f"({100 * fs.share('skipped'):.1f}%)")
    parts.append(f"kept: {fs.tensors['kept']}{tensors} ({100 * fs.share('kept'):.1f}%{params})")
    return " · ".join(parts)

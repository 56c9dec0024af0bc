"""The plots panel of the selected tensor: summary line, histogram, channel ranges and error."""

from __future__ import annotations

from PySide6.QtWidgets import QCheckBox, QHBoxLayout, QLabel, QSplitter, QVBoxLayout, QWidget
from PySide6.QtCore import QEvent, QObject, Qt

from ..format import db_text, fmt_count, fmt_float, fmt_shape
from ..theme import sqnr_colour
from .channel_error import ChannelErrorPlot
from .channels import ChannelRangePlot
from .expert_spread import ExpertSpreadPlot
from .histogram import HistogramPlot
from ..fit_label import never_widens


class _Waiting(QObject):
    """A label over a plot while it has no data: what the plot waits for and how far that is
    (issue 33: empty axes read as a stalled window). It covers the whole plot, so no empty
    axes show; hidden as soon as the data is drawn."""

    def __init__(self, plot):
        super().__init__(plot)
        self.plot = plot
        self.label = QLabel(plot)
        self.label.setObjectName("PlotWaiting")
        self.label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.label.setWordWrap(True)
        self.label.setStyleSheet("background: #171a20; color: #8a92a3; padding: 12px;")
        self.label.hide()
        plot.installEventFilter(self)

    def eventFilter(self, obj, ev) -> bool:
        if ev.type() == QEvent.Type.Resize and self.label.isVisible():
            self.label.setGeometry(self.plot.rect())
        return False

    def show(self, text: str | None) -> None:
        if not text:
            if self.label.isVisible():
                self.label.hide()
            return
        if self.label.text() != text:
            self.label.setText(text)
        if not self.label.isVisible():
            self.label.setGeometry(self.plot.rect())
            self.label.show()
            self.label.raise_()


class PlotsPanel(QWidget):
    def __init__(self, doc, parent=None):
        super().__init__(parent)
        self.doc = doc
        self.name: str | None = None
        self._defer_flush = False
        self.title = QLabel("Select a tensor")
        self.title.setObjectName("TensorTitle")
        self.summary = QLabel("")
        self.summary.setObjectName("TensorSummary")
        self.summary.setTextFormat(Qt.TextFormat.RichText)
        # a narrow window wraps the figures (never clips them); its height follows the panel's
        # width only, so selecting another tensor never re-lays out (and repaints) the plots
        self.summary.setWordWrap(True)
        self.log_box = QCheckBox("log count")
        self.sort_box = QCheckBox("sort channels by range")
        self.grid_label = QLabel("")
        self.grid_label.setObjectName("Muted")
        self.hover = QLabel(" ")
        self.hover.setObjectName("HoverReadout")
        for label in (self.title, self.summary, self.grid_label, self.hover):
            never_widens(label)
        self.histogram = HistogramPlot()
        self.ranges = ChannelRangePlot()
        self.errors = ChannelErrorPlot()
        self.spread = ExpertSpreadPlot()
        self.spread.hide()
        #: set by the main window: the compute thread's runner (spreads are computed there)
        self._runner = None
        self.group: str | None = None          # the expert group shown (None: a tensor)
        self._spreads: dict = {}               # group key -> workbench.running.moe.ExpertSpread
        self._spread_pending: set = set()
        for p in (self.histogram, self.ranges, self.errors, self.spread):
            p.hovered.connect(self.hover.setText)
        # what an empty plot waits for (the statistics, the error), in place of empty axes
        self.waiting = {p: _Waiting(p) for p in (self.histogram, self.ranges, self.errors)}

        head = QHBoxLayout()
        head.addWidget(self.title, 1)
        head.addWidget(self.log_box)
        head.addWidget(self.sort_box)
        right = QSplitter(Qt.Orientation.Vertical)
        right.addWidget(self.ranges)
        right.addWidget(self.errors)
        right.addWidget(self.spread)
        self.right_split = right
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.addWidget(self.histogram)
        self.splitter.addWidget(right)
        self.splitter.setStretchFactor(0, 3)
        self.splitter.setStretchFactor(1, 2)
        foot = QHBoxLayout()
        foot.addWidget(self.hover, 1)
        foot.addWidget(self.grid_label)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(3)
        lay.addLayout(head)
        lay.addWidget(self.summary)
        lay.addWidget(self.splitter, 1)
        lay.addLayout(foot)

        self.log_box.toggled.connect(self.histogram.set_log)
        self.sort_box.toggled.connect(self._sort)
        doc.currentChanged.connect(self._current_changed)
        doc.currentSettled.connect(lambda _n: self._flush_scenes())
        doc.statsChanged.connect(self._maybe)
        doc.resultsChanged.connect(self._maybe)
        doc.stateChanged.connect(self._maybe)
        doc.detailChanged.connect(lambda n: self._maybe([n]))
        doc.modelChanged.connect(self._model_changed)

    @property
    def runner(self):
        return self._runner

    @runner.setter
    def runner(self, runner) -> None:
        """The compute thread's runner: its jobs' moves update what the waiting plots say."""
        self._runner = runner
        if runner is not None:
            for sig in (runner.taskStarted, runner.taskProgress, runner.taskFinished):
                sig.connect(self.waiting_changed)

    def _model_changed(self) -> None:
        self._spreads.clear()
        self._spread_pending.clear()
        self.show_tensor("")

    def resizeEvent(self, ev) -> None:
        super().resizeEvent(ev)
        lines = 1 if self.width() >= 1500 else 2
        h = lines * self.summary.fontMetrics().lineSpacing() + 4
        if self.summary.height() != h:
            self.summary.setFixedHeight(h)

    def _maybe(self, names) -> None:
        if self.name and self.name in names:
            self.refresh()
        elif self.group is not None and self.doc.model is not None:
            from workbench.api.models import expert_groups
            if set(names) & set(expert_groups(self.doc.model).get(self.group, [])):
                self.refresh()

    def _sort(self, on: bool) -> None:
        self.ranges.set_sorted(on)
        self._draw_error()

    def show_tensor(self, name: str) -> None:
        self.name = name or None
        self.group = None
        self.refresh()

    def _current_changed(self, name: str) -> None:
        # the scenes are flushed once the other views have taken the selection too
        # (doc.currentSettled): flushing them paints the window at once, and flushed here,
        # before the scheme table and the rest had moved, a selection painted the window twice
        self._defer_flush = True
        try:
            self.show_tensor(name)
        finally:
            self._defer_flush = False

    # ---- mixture of experts --------------------------------------------------------------------
    def show_expert_group(self, key: str) -> None:
        """Show the spread across the experts of group `key` ('layer 5 experts down'); a merged
        tensor's group shows beside its own plots."""
        doc = self.doc
        if doc.model is None or not key:
            return
        from workbench.api.models import expert_groups
        names = expert_groups(doc.model).get(key, [])
        if not names:
            return
        if len(names) == 1 and doc.model.info(names[0]).merged_experts:
            if self.name != names[0]:
                self.name = names[0]
            self.group = None
            self.refresh()
            return
        self.name = None
        self.group = key
        self._refresh_group(names)

    def _refresh_group(self, names) -> None:
        doc = self.doc
        infos = [doc.model.info(n) for n in names]
        schemes = sorted({doc.scheme_of(n) for n in names})
        self.title.setText(f"{self.group} — {len(names)} experts")
        parts = [f"{len(names)} × {fmt_shape(infos[0].shape)}",
                 f"{fmt_count(sum(i.numel for i in infos))} params", infos[0].display_dtype,
                 "expert", "<b>" + ", ".join(schemes) + "</b>",
                 "one llama.cpp tensor (blk.N.ffn_*_exps)"]
        self.summary.setText("  ·  ".join(parts))
        self.histogram.clear_data()
        self.ranges.set_data([], [], [])
        self.errors.set_data(None)
        self.grid_label.setText("")
        self.splitter.widget(0).hide()
        self.ranges.hide()
        self.errors.hide()
        self.spread.show()
        self._show_spread(self.group, names)

    def _show_spread(self, key: str, names) -> None:
        sp = self._spreads.get(key)
        self.spread.set_spread(sp)
        if sp is not None or key in self._spread_pending:
            return
        if self.runner is None:
            return
        from ..workers import INTERACTIVE
        from workbench.api.models import expert_spread
        model = self.doc.model
        self._spread_pending.add(key)

        def done(result, key=key, model=model):
            self._spread_pending.discard(key)
            if self.doc.model is not model:
                return
            self._spreads[key] = result
            if self.group == key or (self.name and self.doc.model.info(self.name).expert_group
                                     == key and self.doc.model.info(self.name).merged_experts):
                self.spread.set_spread(result)

        def failed(*_a, key=key):
            self._spread_pending.discard(key)
        self.runner.submit(lambda: expert_spread(model, key, list(names)),
                           f"expert spread {key}", INTERACTIVE, on_done=done, on_error=failed)

    def spread_of(self, key: str):
        """The ExpertSpread computed for `key` (None until its task is done)."""
        return self._spreads.get(key)

    def refresh(self) -> None:
        """Draw what is known about the current tensor (cheap: only cached arrays)."""
        name, doc = self.name, self.doc
        if self.group is not None and doc.model is not None:
            from workbench.api.models import expert_groups
            names = expert_groups(doc.model).get(self.group, [])
            if names:
                self._refresh_group(names)
                return
        if not name or doc.model is None:
            self.spread.hide()
            self.title.setText("Select a tensor")
            self.summary.setText("")
            self.histogram.clear_data()
            self.ranges.set_data([], [], [])
            self.errors.set_data(None)
            for w in self.waiting.values():
                w.show("select a tensor" if doc.model is not None else "no model open")
            return
        info = doc.model.info(name)
        scheme = doc.scheme_of(name)
        self.splitter.widget(0).show()
        self.ranges.show()
        self.errors.show()
        if info.merged_experts:
            if not self.spread.isVisible():   # three plots share the column evenly
                self.spread.show()
                h = max(self.right_split.height(), 300)
                self.right_split.setSizes([h // 3] * 3)
            self._show_spread(info.expert_group, [name])
        else:
            self.spread.hide()
        self.title.setText(f"{name}")
        st = doc.stats.get(name)
        r = doc.result(name)
        parts = [f"{fmt_shape(info.shape)}", f"{fmt_count(info.numel)} params",
                 info.display_dtype, info.role, f"<b>{scheme}</b>"]
        if st is not None and st.count:
            parts += [f"mean {fmt_float(st.mean)}", f"std {fmt_float(st.std)}",
                      f"|max| {fmt_float(st.absmax)}", f"kurtosis {st.kurtosis:.2f}",
                      f"outliers {100 * st.outlier_frac:.3f}%"]
            if st.nan or st.inf:
                parts.append(f"<span style='color:#f85149'>{st.nan} NaN, {st.inf} Inf</span>")
        elif st is None:   # what the statistics wait for (issue 33), not a bare "…"
            parts.append(self._stats_wait(name))
        if r is not None:
            c = sqnr_colour(r.error.sqnr_db)
            col = c.name() if c is not None else "#c9ced8"
            parts.append(f"<span style='color:{col}'>SQNR {db_text(r.error.sqnr_db)}</span>")
            if r.note:
                parts.append(f"<span style='color:#d29922'>{r.requested} not applied: {r.note}</span>")
        self.summary.setText("  ·  ".join(parts))
        if st is not None:
            det = doc.details.get((name, scheme))
            self.histogram.set_data(st.hist_edges, st.hist_counts,
                                    det.deq_counts if det else None,
                                    det.grid if det else None, scheme)
            self.grid_label.setText(self.histogram.grid_text() if det else
                                    f"quantization grid of {scheme}: being computed")
            self.ranges.set_data(st.ch_min, st.ch_max, st.ch_absmax)
            for p in (self.histogram, self.ranges):
                self.waiting[p].show(None if st.count else "no finite values in this tensor")
        else:
            self.histogram.clear_data()
            self.ranges.set_data([], [], [])
            self.grid_label.setText("")
            text = self._stats_wait(name)
            for p in (self.histogram, self.ranges):
                self.waiting[p].show(text)
        self._draw_error()
        self._flush_scenes()

    def _flush_scenes(self) -> None:
        """Fast path (app.perf): let each plot's scene process its changed items now, so the
        next paint draws the final picture (Qt queues that processing; a paint before it ran
        painted the plots a second time)."""
        from .. import perf
        if not perf.FAST or self._defer_flush:
            return
        from PySide6.QtCore import QCoreApplication, QEvent
        for p in (self.histogram, self.ranges, self.errors):
            QCoreApplication.sendPostedEvents(p.scene(), QEvent.Type.MetaCall)

    def _stats_wait(self, name: str) -> str:
        from ..work_queue import waiting_text
        return (waiting_text(self.runner, f"Analysing {name}", "statistics")
                or waiting_text(self.runner, "Computing statistics", "statistics")
                or "statistics: queued")

    def _error_wait(self, name: str) -> str:
        from ..work_queue import waiting_text
        return (waiting_text(self.runner, f"Analysing {name}", "the error under "
                             f"{self.doc.scheme_of(name)}")
                or waiting_text(self.runner, "Evaluating error", "the error evaluation")
                or f"the error under {self.doc.scheme_of(name)}: queued")

    def waiting_changed(self, _task=None) -> None:
        """A job started, moved or finished: the waiting plots say so (cheap: only when one
        shows its label)."""
        if not self.name or self.doc.model is None or self.group is not None:
            return
        if self.waiting[self.histogram].label.isVisible() and self.name not in self.doc.stats:
            text = self._stats_wait(self.name)
            for p in (self.histogram, self.ranges):
                self.waiting[p].show(text)
        if self.waiting[self.errors].label.isVisible() and self.doc.result(self.name) is None:
            self.waiting[self.errors].show(self._error_wait(self.name))

    def _draw_error(self) -> None:
        r = self.doc.result(self.name) if self.name else None
        if r is None:
            self.errors.set_data(None)
            if self.name:
                self.waiting[self.errors].show(self._error_wait(self.name))
            return
        self.waiting[self.errors].show(None)
        self.errors.set_data(r.error.channel_rel_err,
                             self.ranges.order if self.ranges.sort_by_range else None, r.scheme)

    def state(self) -> dict:
        return {"log": self.log_box.isChecked(), "sort_channels": self.sort_box.isChecked()}

    def restore(self, state: dict) -> None:
        self.log_box.setChecked(bool(state.get("log", False)))
        self.sort_box.setChecked(bool(state.get("sort_channels", False)))

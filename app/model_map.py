"""The "Model map" tab (issue 23): the network as its blocks, every tensor a cell coloured by an
overlay — scheme / bits per weight, SQNR, sensitivity, measured output change, kurtosis or
outlier fraction — with a legend, per-block totals (bytes, bits per weight), click to select
everywhere, rubber-band or block selection plus a scheme as one undoable edit, and PNG / SVG
export. Every number comes from `workbench.planning.model_map` and the document (`quant-workbench map`
prints the same blocks and totals)."""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import QRectF, QSize, QTimer
from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import (QComboBox, QFileDialog, QHBoxLayout, QLabel, QPushButton,
                               QScrollArea, QVBoxLayout, QWidget)

from workbench.core.atomic import atomic_write
from workbench.core.errors import WorkbenchError
from workbench.api.choices import (HIGHER_IS_BETTER, OVERLAY_TEXT, OVERLAYS, list_measures,
                                  colour_range, layout, layout_job, normalise, overlay_values)
from workbench.core.progress import Progress, run
from workbench.api.plans import KEEP

from . import commands
from .colour_scale import ColourLegend, rgb
from .format import fmt_bytes, fmt_float
from .map_canvas import MapCanvas, map_geometry
from .theme import BACKGROUND

#: the measure the "output" overlay shows: the one measured directly, not predicted
MEASURED = next(m.name for m in list_measures() if m.measured)

LEGEND_H = 50


class ModelMapView(QWidget):
    def __init__(self, doc, push, select, fx=None, parent=None, runner=None):
        super().__init__(parent)
        self.setObjectName("ModelMap")
        self.doc, self.push, self.select_tensor, self.fx = doc, push, select, fx
        # the compute thread lays the map out as soon as a model opens (a 100,000-tensor
        # catalog takes a second or more in Python): the first show only colours it
        self.runner = runner
        self._prepared = None       # (model, blocks, geometry, params, is_float)
        self._preparing = None
        self.overlay = "bits"
        self.canvas = MapCanvas()
        self.canvas.tooltip = self._tooltip
        self.scroll = QScrollArea()
        self.scroll.setWidget(self.canvas)
        self.scroll.setWidgetResizable(True)
        self.legend = ColourLegend()

        self.overlay_combo = QComboBox()
        self.overlay_combo.setObjectName("MapOverlay")
        for key in OVERLAYS:
            self.overlay_combo.addItem(OVERLAY_TEXT[key], key)
        self.overlay_combo.currentIndexChanged.connect(
            lambda _i: self.set_overlay(self.overlay_combo.currentData()))
        from workbench.api.plans import list_schemes
        from .scheme_picker import fill
        self.scheme_combo = QComboBox()
        self.scheme_combo.setObjectName("MapScheme")
        fill(self.scheme_combo, [KEEP] + list_schemes())
        i = self.scheme_combo.findText("q4_k")
        if i >= 0:
            self.scheme_combo.setCurrentIndex(i)
        self.assign_button = QPushButton("Assign to selection")
        self.assign_button.setObjectName("MapAssign")
        self.assign_button.clicked.connect(self.assign_selection)
        png = QPushButton("PNG…")
        png.clicked.connect(lambda: self._export_dialog("png"))
        svg = QPushButton("SVG…")
        svg.clicked.connect(lambda: self._export_dialog("svg"))
        self.status = QLabel("")
        self.status.setObjectName("MapStatus")
        bar = QHBoxLayout()
        bar.setContentsMargins(0, 0, 0, 0)
        bar.addWidget(QLabel("Colour:"))
        bar.addWidget(self.overlay_combo)
        bar.addSpacing(12)
        bar.addWidget(self.scheme_combo)
        bar.addWidget(self.assign_button)
        bar.addWidget(self.status, 1)
        bar.addWidget(png)
        bar.addWidget(svg)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.setSpacing(4)
        lay.addLayout(bar)
        lay.addWidget(self.legend)
        lay.addWidget(self.scroll, 1)

        self.canvas.cellClicked.connect(self.select_tensor)
        self.canvas.selectionChanged.connect(self._selection_changed)
        self.canvas.hovered.connect(self._hovered)
        self._stale = True
        doc.modelChanged.connect(self._model_changed)
        doc.currentChanged.connect(self._current)
        # values change as edits and results arrive: only the changed tensors are re-read,
        # then the colours and block totals are recomputed (numpy) at most every 100 ms, and
        # only while the map is shown (a 100,000-tensor catalog streams statistics for minutes)
        self._dirty: set[str] = set()
        self._all_dirty = True
        self._recolour = QTimer(self, singleShot=True, interval=100)
        self._recolour.timeout.connect(self._flush)
        doc.stateChanged.connect(lambda names: self._mark(names, sizes=True))
        for sig in (doc.resultsChanged, doc.statsChanged, doc.estimatesChanged):
            sig.connect(self._mark)
        if fx is not None:
            fx.tableChanged.connect(lambda *_: self._mark(None))
        self.current_values = np.zeros(0)
        self.nbytes = self.params = np.zeros(0)
        self.is_float = np.zeros(0, bool)
        self._model_changed()

    # ---- data ------------------------------------------------------------------------------
    def _model_changed(self) -> None:
        """A new model: laid out now when the map is shown, else on the compute thread (or, if
        that has not finished, when it is first shown)."""
        self._stale = True
        self._prepared = None
        if self._preparing is not None:
            self._preparing.cancel()
            self._preparing = None
        if self.isVisible():
            self.rebuild()
        elif self.runner is not None and self.doc.model is not None:
            model = self.doc.model
            from .workers import BACKGROUND

            def done(result):
                if result is not None and result[0] is self.doc.model:
                    self._prepared = result
                self._preparing = None
            # above the whole-model sweep (BACKGROUND), below anything the user asked for
            self._preparing = self.runner.submit(lambda: _prepare_job(model),
                                                 "laying out the model map", BACKGROUND + 5,
                                                 on_done=done)

    def ensure_built(self) -> None:
        if self._stale:
            self.rebuild()

    def rebuild(self) -> None:
        self._stale = False
        model = self.doc.model
        prep = self._prepared
        if model is None:
            prep = (None, [], None, np.zeros(0), np.zeros(0, bool))
        elif prep is None or prep[0] is not model:
            if self._preparing is not None:     # shown before the compute thread finished
                self._preparing.cancel()
                self._preparing = None
            prep = run(_prepare_job(model))
        self._prepared = None
        _m, self.blocks, geometry, self.params, self.is_float = prep
        self.canvas.set_blocks(self.blocks, geometry)
        self.canvas.set_current(self.doc.current)
        names = self.canvas.names
        self.block_of = np.repeat(np.arange(len(self.blocks)),
                                  [len(b.names) for b in self.blocks]).astype(np.int64)
        self.nbytes = np.array(self.doc.sizes(names), np.float64) if names else np.zeros(0)
        self.current_values = self.values()
        self._dirty.clear()
        self._all_dirty = False
        self.refresh()

    def _mark(self, names, sizes: bool = False) -> None:
        """Tensors whose overlay value (and, after an edit, size) may have changed."""
        if self._stale:
            return
        if names is None:
            self._all_dirty = True
        else:
            self._dirty.update(names)
        if sizes and names:
            idx = [self.canvas.index[n] for n in names if n in self.canvas.index]
            for i in idx:
                self.nbytes[i] = self.doc.bytes_of(self.canvas.names[i])
            self._all_dirty = self._all_dirty or self.overlay == "sensitivity"
        if self.isVisible() and not self._recolour.isActive():
            self._recolour.start()

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if self._stale:
            self.rebuild()
        elif self._all_dirty or self._dirty:
            self._flush()

    def _flush(self) -> None:
        if self._all_dirty:
            self.current_values = self.values()
        elif self._dirty:
            names = [n for n in self._dirty if n in self.canvas.index]
            idx = np.array([self.canvas.index[n] for n in names], np.int64)
            if idx.size:
                self.nbytes[idx] = [self.doc.bytes_of(n) for n in names]
                self.current_values[idx] = self.values(names=names)
        self._dirty.clear()
        self._all_dirty = False
        self.refresh()

    def values(self, overlay: str | None = None, names=None) -> np.ndarray:
        """The overlay's value of `names` (default: every cell), NaN where not known yet."""
        doc, fx = self.doc, self.fx
        overlay = overlay or self.overlay
        if overlay == "bits" and names is None and len(self.nbytes) == len(self.canvas.names):
            # every cell: from the held sizes (numpy), not a call per tensor
            with np.errstate(divide="ignore", invalid="ignore"):
                return np.where(self.is_float & (self.params > 0),
                                8.0 * self.nbytes / np.where(self.params > 0, self.params, 1),
                                np.nan)
        names = self.canvas.names if names is None else names
        if doc.model is None:
            return np.zeros(0)
        tensors = doc.model.tensors

        def sens(measure):
            table = fx.table(measure) if fx is not None else None
            if table is None:
                return None
            return lambda n: table.value(n, doc.scheme_of(n))
        return overlay_values(
            names, overlay, bytes_of=doc.bytes_of,
            params=lambda n: tensors[n].numel if tensors[n].is_float else 0,
            sqnr=doc.sqnr, stats=doc.stats,
            sensitivity=sens(fx.measure) if fx is not None and overlay == "sensitivity" else None,
            output=sens(MEASURED) if overlay == "output" else None)

    def refresh(self) -> None:
        """Colours, legend and block totals from the held values and sizes (numpy only)."""
        vals = self.current_values
        lo, hi, log = colour_range(vals, self.overlay)
        reverse = self.overlay in HIGHER_IS_BETTER
        t = normalise(vals, lo, hi, log)
        self.canvas.set_colours(rgb(t, reverse))
        known = int(np.isfinite(vals).sum() + np.isposinf(vals).sum())
        note = f"{known}/{len(vals)} tensors known" if known < len(vals) \
            and self.overlay != "bits" else ""
        if self.overlay in ("sensitivity", "output") and known == 0:
            note = "computed in the Sensitivity & Budget tab" if self.overlay == "sensitivity" \
                else f"needs the {MEASURED} measure in the Sensitivity & Budget tab"
        self.legend.set_scale(OVERLAY_TEXT[self.overlay], lo, hi, log, reverse, note)
        nb = len(self.blocks)
        bsum = np.bincount(self.block_of, self.nbytes, nb) if nb else np.zeros(0)
        psum = np.bincount(self.block_of, self.params, nb) if nb else np.zeros(0)
        cnt = np.bincount(self.block_of, minlength=nb) if nb else np.zeros(0)
        self.block_totals = {b.key: (int(cnt[k]), int(psum[k]), int(bsum[k]))
                             for k, b in enumerate(self.blocks)}
        self.canvas.set_block_text({
            b.key: f"{int(cnt[k])} tensors\n{fmt_bytes(bsum[k])} · "
                   f"{8 * bsum[k] / psum[k] if psum[k] else 0:.2f} b/w"
            for k, b in enumerate(self.blocks)})
        self._selection_changed()

    def set_overlay(self, overlay: str) -> None:
        self.ensure_built()
        if overlay not in OVERLAYS:
            raise WorkbenchError(f"unknown overlay '{overlay}' (choose from {', '.join(OVERLAYS)})")
        self.overlay = overlay
        i = self.overlay_combo.findData(overlay)
        if i != self.overlay_combo.currentIndex():
            self.overlay_combo.blockSignals(True)
            self.overlay_combo.setCurrentIndex(i)
            self.overlay_combo.blockSignals(False)
        if self.fx is not None and self.doc.model is not None:
            if overlay == "sensitivity":
                self.fx.request_table()
        self.current_values = self.values()
        self.refresh()

    # ---- selection and edits ---------------------------------------------------------------
    def _current(self, name: str) -> None:
        self.canvas.set_current(name or None)
        r = self.canvas.cell_rect(name) if name else None
        if r is not None:
            self.scroll.ensureVisible(int(r.center().x()), int(r.center().y()), 60, 40)

    def _selection_changed(self) -> None:
        sel = self.canvas.selected
        if not sel:
            self.status.setText("click a cell, drag a rectangle or click a block's title to select")
            self.assign_button.setEnabled(False)
            return
        nbytes = sum(self.doc.bytes_of(n) for n in sel)
        params = sum(self.doc.model.tensors[n].numel for n in sel)
        self.status.setText(f"{len(sel)} selected · {fmt_bytes(nbytes)} · "
                            f"{8 * nbytes / params if params else 0:.2f} b/w")
        self.assign_button.setEnabled(True)

    def selected_names(self) -> list[str]:
        self.ensure_built()
        return [n for n in self.canvas.names if n in self.canvas.selected]

    def assign_selection(self, scheme: str | None = None) -> bool:
        """Assign the scheme to every selected tensor: one undoable edit."""
        names = self.selected_names()
        scheme = scheme or self.scheme_combo.currentText()
        if not names:
            return False
        cmd = commands.assign(self.doc, names, scheme)
        return bool(cmd is not None and self.push(cmd))

    def _hovered(self, name: str) -> None:
        pass

    def _tooltip(self, name: str) -> str:
        i = self.canvas.index.get(name)
        v = self.current_values[i] if i is not None and i < len(self.current_values) else None
        info = self.doc.model.tensors[name]
        return (f"{name}\n{self.doc.scheme_of(name)} · {info.display_dtype} "
                f"{'×'.join(map(str, info.shape))}\n{OVERLAY_TEXT[self.overlay]}: "
                f"{fmt_float(None if v is None or np.isnan(v) else float(v))}")

    # ---- export ----------------------------------------------------------------------------
    def render(self, painter: QPainter, width: int) -> None:
        """The whole map with its legend, for PNG and SVG."""
        painter.fillRect(QRectF(0, 0, width, self.export_size().height()), QColor(BACKGROUND))
        self.legend.paint_into(painter, QRectF(8, 4, min(width - 16, 640), LEGEND_H - 6))
        painter.translate(0, LEGEND_H)
        self.canvas.paint_into(painter, QRectF(0, 0, width, self.canvas.sizeHint().height()))
        painter.translate(0, -LEGEND_H)

    def export_size(self) -> QSize:
        self.ensure_built()
        s = self.canvas.sizeHint()
        return QSize(max(s.width(), 660), s.height() + LEGEND_H)

    def export_png(self, path) -> None:
        from PySide6.QtCore import QBuffer, QIODevice
        from PySide6.QtGui import QImage
        size = self.export_size()
        img = QImage(size, QImage.Format.Format_ARGB32)
        p = QPainter(img)
        p.setRenderHint(QPainter.RenderHint.Antialiasing, False)
        self.render(p, size.width())
        p.end()
        buf = QBuffer()
        buf.open(QIODevice.OpenModeFlag.WriteOnly)
        if not img.save(buf, "PNG"):
            raise WorkbenchError("could not encode the map as PNG", path=str(path))
        with atomic_write(path, "wb") as fh:
            fh.write(bytes(buf.data()))

    def export_svg(self, path) -> None:
        from PySide6.QtCore import QBuffer, QIODevice
        from PySide6.QtSvg import QSvgGenerator
        size = self.export_size()
        buf = QBuffer()
        buf.open(QIODevice.OpenModeFlag.WriteOnly)
        gen = QSvgGenerator()
        gen.setOutputDevice(buf)
        gen.setSize(size)
        gen.setViewBox(QRectF(0, 0, size.width(), size.height()))
        gen.setTitle("Quant Workbench model map")
        p = QPainter(gen)
        self.render(p, size.width())
        p.end()
        with atomic_write(path, "wb") as fh:
            fh.write(bytes(buf.data()))

    def _export_dialog(self, kind: str) -> None:
        path, _ = QFileDialog.getSaveFileName(self, f"Export the model map as {kind.upper()}",
                                              f"model-map.{kind}", f"{kind.upper()} (*.{kind})")
        if path:
            try:
                (self.export_png if kind == "png" else self.export_svg)(path)
            except (WorkbenchError, OSError) as exc:
                self.status.setText(f"cannot export: {exc}")
            else:
                self.status.setText(f"map saved to {path}")


def _prepare_job(model):
    """The map of `model` laid out (a workbench.core.progress job, run on the compute thread):
    (model, blocks, geometry, params per cell, is-float per cell)."""
    blocks = yield from layout_job(model)
    yield Progress(len(model.tensors), len(model.tensors), "placing the model map's cells")
    geometry = map_geometry(blocks)
    names = geometry[0]
    tensors = model.tensors
    params = np.fromiter((tensors[n].numel for n in names), np.float64, len(names))
    is_float = np.fromiter((tensors[n].is_float for n in names), bool, len(names))
    return model, blocks, geometry, params, is_float


def render_map_png(model, plan, bits_of=None, width: int = 1100) -> bytes:
    """The map of `model` under `plan` (bits per weight overlay, block totals) as PNG bytes,
    without a window: for `report`. `bits_of(name)` -> (bytes, params) overrides the plan's
    size formula (the report passes its evaluated sizes)."""
    from PySide6.QtCore import QBuffer, QIODevice
    from PySide6.QtGui import QImage
    from workbench.api.choices import plan_bytes_of
    bytes_of, _ = plan_bytes_of(model, plan)
    if bits_of is not None:
        bytes_of = bits_of
    canvas = MapCanvas()
    legend = ColourLegend()
    blocks = layout(model)
    canvas.set_blocks(blocks)
    names = canvas.names
    tensors = model.tensors
    vals = overlay_values(names, "bits", bytes_of=bytes_of,
                          params=lambda n: tensors[n].numel if tensors[n].is_float else 0)
    lo, hi, log = colour_range(vals, "bits")
    canvas.set_colours(rgb(normalise(vals, lo, hi, log), True))
    legend.set_scale(OVERLAY_TEXT["bits"], lo, hi, log, True)
    text = {}
    for b in blocks:
        nb = sum(bytes_of(n) for n in b.names)
        pa = sum(tensors[n].numel for n in b.names)
        text[b.key] = f"{len(b.names)} tensors\n{fmt_bytes(nb)} · {8 * nb / pa if pa else 0:.2f} b/w"
    canvas.set_block_text(text)
    h = canvas.sizeHint().height() + LEGEND_H
    w = max(width, canvas.sizeHint().width())
    img = QImage(w, h, QImage.Format.Format_ARGB32)
    p = QPainter(img)
    p.fillRect(QRectF(0, 0, w, h), QColor(BACKGROUND))
    legend.paint_into(p, QRectF(8, 4, min(w - 16, 640), LEGEND_H - 6))
    p.translate(0, LEGEND_H)
    canvas.paint_into(p, QRectF(0, 0, w, canvas.sizeHint().height()))
    p.end()
    canvas.deleteLater()
    legend.deleteLater()
    buf = QBuffer()
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    img.save(buf, "PNG")
    return bytes(buf.data())

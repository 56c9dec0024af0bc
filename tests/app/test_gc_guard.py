"""app/gc_guard.py: the app's cyclic garbage is collected in the GUI thread only."""

import gc

from app import gc_guard


class _Cycle:
    def __init__(self):
        self.me = self


def test_install_moves_collection_to_the_gui_thread_timer(qapp):
    import weakref
    assert gc.isenabled()
    try:
        gc_guard.install(qapp, interval_ms=10)
        assert not gc.isenabled() and gc_guard._timer.isActive()
        gc_guard.install(qapp)                      # once per process
        gc.collect()
        probe = _Cycle()
        ref = weakref.ref(probe)
        del probe
        for _ in range(gc.get_threshold()[0] + 10):  # past generation 0's threshold
            _Cycle()
        assert ref() is not None                    # nothing collects it on its own now
        gc_guard.collect()                          # the timer's call, in this (GUI) thread
        assert ref() is None
    finally:
        if gc_guard._timer is not None:
            gc_guard._timer.stop()
            gc_guard._timer.deleteLater()
            gc_guard._timer = None
        gc.enable()

"""pytest-qt fixtures: offscreen Qt, settings and app data isolated in a temporary folder."""

import gc
import os
import tempfile

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("QT_LOGGING_RULES", "qt.qpa.*=false")
_TMP = tempfile.mkdtemp(prefix="qwb-app-tests-")
os.environ["XDG_CONFIG_HOME"] = os.path.join(_TMP, "config")
os.environ["XDG_DATA_HOME"] = os.path.join(_TMP, "data")

import pytest  # noqa: E402

pytest.importorskip("PySide6.QtWidgets")
pytest.importorskip("pyqtgraph")

from apphelpers import DEMO, wait_idle  # noqa: E402,F401


@pytest.fixture(scope="session")
def qapp_args():
    return ["quant-workbench-tests"]


@pytest.fixture(scope="session", autouse=True)
def _themed(qapp):
    from app import theme
    qapp.setOrganizationName("QuantWorkbenchTests")
    qapp.setApplicationName("Quant Workbench Tests")
    theme.apply(qapp)
    yield


@pytest.fixture(autouse=True)
def _qt_garbage_collected_in_the_gui_thread():
    """After each test (and after qtbot closed its widgets: autouse fixtures are torn down
    last), collect the test's Qt garbage here, in the GUI thread. Left for later, a worker
    thread's automatic collection would destroy those QObjects outside the GUI thread and
    deadlock with it (app/gc_guard.py says how; the app itself collects on a GUI-thread timer).

    What survives is then frozen (gc.freeze: left out of later collections), so that the next
    test's collection scans what that test made, not the whole worker's heap again: a full
    collection took 0.45 s after each of 175 app tests, 79 s of the suite's CPU (py-spy, 3 Dec
    2026). The end of each module unfreezes and collects everything (`_unfrozen_after`)."""
    yield
    gc.collect()
    gc.freeze()


@pytest.fixture(scope="module", autouse=True)
def _unfrozen_after():
    """Nothing stays frozen past an app test file: garbage among what its tests froze is
    collected here, in the GUI thread, with the rest."""
    yield
    gc.unfreeze()
    gc.collect()


@pytest.fixture
def make_window(qtbot, tmp_path, request):
    """Windows on isolated settings. The end-to-end check (default-on for users) starts off here
    unless the test module sets ``WINDOW_CHECK = True`` or a test passes ``check=True``: on two
    cores a background model run behind every edit makes unrelated waits for idle slow."""
    from PySide6.QtCore import QSettings
    from app.main_window import MainWindow
    from app.messages import RecordedMessages
    made = []

    def make(path=DEMO, answer=False, autosave=False, check=None, values=None):
        settings = QSettings(str(tmp_path / f"settings{len(made)}.ini"), QSettings.Format.IniFormat)
        for k, v in (values or {}).items():      # settings the window starts from
            settings.setValue(k, v)
        if check is None:
            check = bool(getattr(request.module, "WINDOW_CHECK", False))
        settings.setValue("effects/check_enabled", bool(check))
        win = MainWindow(messages=RecordedMessages(answer), settings=settings, autosave=autosave)
        qtbot.addWidget(win)
        win.resize(1400, 900)
        win.show()
        made.append(win)
        if path is not None:
            win.open_model(str(path))
            wait_idle(qtbot, win, 600000)     # a hang guard: MiniLM's statistics at load ~20
        return win

    yield make
    for w in made:
        w.runner.shutdown()


@pytest.fixture
def window(make_window):
    return make_window()

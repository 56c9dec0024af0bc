"""The app's "Compute on cluster" preference: where the sweeps (sensitivity tables, exports)
run — in this process (empty), a local Dask cluster (`local`, `local:N`) or a running
scheduler (`tcp://HOST:PORT`). Stored in QSettings under ``compute/cluster``; the executor
(workbench.jobs.cluster) is opened by the first job that needs it, on the compute thread, and kept
until the setting changes or the window closes."""

from __future__ import annotations

import threading

KEY = "compute/cluster"


class ClusterSetting:
    def __init__(self, settings):
        self.settings = settings
        self._lock = threading.Lock()
        self._executor = None
        self._opened_for = None

    @property
    def spec(self) -> str:
        return str(self.settings.value(KEY, "") or "") if self.settings is not None else ""

    def set_spec(self, text: str) -> str:
        """Store a new spec (validated: a WorkbenchError for bad text, nothing stored);
        the executor of the old one is closed."""
        from workbench.api.tensors import parse_spec
        kind, _ = parse_spec(text)
        text = "" if kind == "none" else text.strip()
        if self.settings is not None:
            self.settings.setValue(KEY, text)
        self.close()
        return text

    def executor(self):
        """The executor for the current spec (None: in process), opened on first use."""
        spec = self.spec
        if not spec:
            return None
        with self._lock:
            if self._executor is None or self._opened_for != spec:
                if self._executor is not None:
                    self._executor.close()
                from workbench.api.tensors import open_executor
                self._executor, self._opened_for = open_executor(spec), spec
            return self._executor

    def close(self) -> None:
        with self._lock:
            if self._executor is not None:
                self._executor.close()
            self._executor, self._opened_for = None, None


def executor_of(runner):
    """The cluster executor a job on `runner` should use (None: in process)."""
    setting = getattr(runner, "cluster", None)
    return setting.executor() if setting is not None else None

"""What every part of the API shares: the callable types, AUTO, how a call runs its jobs
(progress shown by default), the input checks made before any network is built."""

from __future__ import annotations

import os
from typing import Any, Callable, Union

from workbench.core.progress import Job, Progress
from workbench.quant.plan import Plan

ProgressCallback = Callable[[Progress], None]
CancelCheck = Callable[[], bool]
#: runs one progress job to its result (workbench.core.progress.run with a callback, or the CLI's bar)
Driver = Callable[[Job], Any]
PlanLike = Union[Plan, str]

#: "auto": the target runtime's candidate schemes, or the best measure the inputs allow
AUTO = "auto"
#: the `sensitivity` command's candidate schemes
DEFAULT_SCHEMES = "q3_k,q4_0,q4_k,q5_0,q5_k,q6_k,q8_0"
#: samples the automatic fisher measure reads unless `samples` says otherwise: an encoder 64
#: (MiniLM: rank correlation 0.99 with the output change), a causal LM 32 (docs/vs-llama.md)
AUTO_FISHER_SAMPLES, AUTO_FISHER_SAMPLES_LM = 64, 32


def _driver(progress: ProgressCallback | None | bool, cancel: CancelCheck | None,
            driver: Driver | None) -> Driver:
    """How a call runs its jobs: `driver` when given; else with `progress` (a callback; None:
    shown by default, a line updated in place on a terminal or in Jupyter; False: nothing)
    and `cancel`."""
    if driver is not None:
        return driver
    from workbench.core.progress import default_progress, run

    def drive(job):
        if progress is False:
            return run(job, None, cancel)
        if progress is not None:
            return run(job, progress, cancel)
        shown = default_progress()
        try:
            return run(job, shown, cancel)
        finally:
            shown.close()
    return drive


def _check_inputs(*args, **kw) -> None:
    """The calibration, held-out and imatrix files checked before any network is built
    (workbench.running.inputs)."""
    from workbench.running.inputs import validate_calibration_inputs
    validate_calibration_inputs(*args, **kw)


def _file_inputs(**named) -> dict:
    """{parameter: path} of the arguments that name files (str / os.PathLike): the inputs an
    output is compared with (workbench.core.outputs.check_output)."""
    return {k: os.fspath(v) for k, v in named.items()
            if isinstance(v, (str, os.PathLike)) and os.fspath(v)}

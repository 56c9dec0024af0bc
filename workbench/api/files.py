"""The API's file jobs: an imatrix from calibration, two quantizations side by side, a GGUF
as a float model."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from workbench.api._common import (CancelCheck, Driver, ProgressCallback, _check_inputs,
                                   _driver, _file_inputs)

if TYPE_CHECKING:
    from workbench.formats.model import Model


def calibrate(model: "Model", output: str | os.PathLike, *, calib=None,
              samples: int | None = None, progress: ProgressCallback | None = None,
              cancel: CancelCheck | None = None, driver: Driver | None = None) -> dict:
    """Activation statistics of `model` on `calib` (text / JSONL / token ids; default the
    shipped calibration text), written to `output` as a llama.cpp imatrix GGUF (what
    `llama-imatrix` writes and `--imatrix` reads), as `calibrate` does. `output` is checked
    before the pass. Returns {"output", "tensors", "samples"}."""
    from workbench.core.outputs import check_output
    from workbench.running.calibration import DEFAULT_CALIB
    from workbench.running.imatrix import collect, write_imatrix_gguf
    text = calib if calib is not None else DEFAULT_CALIB
    out = check_output(output, model=model, inputs=_file_inputs(calib=text))
    _check_inputs(model, calib)       # before the network is built
    stats, n, longest = _driver(progress, cancel, driver)(collect(model, calib, samples))
    write_imatrix_gguf(model, stats, out, os.path.basename(os.fspath(text)) if isinstance(
        text, (str, os.PathLike)) else "calibration", n, longest)
    return {"output": str(out), "tensors": len(stats), "samples": n}


# ---- diff, convert ----------------------------------------------------------------------------
def diff_quantizations(a, b, *, source=None, check: bool = True, calib=None,
                       samples: int | None = None, progress: ProgressCallback | None = None,
                       cancel: CancelCheck | None = None, driver: Driver | None = None) -> dict:
    """Two quantizations (plan JSON files or quantized files: GGUF, quantized safetensors,
    compressed-tensors) side by side per tensor, against the float `source` when given (a path
    or an opened model; and, when it runs, the model-level figures of `check` for both unless
    `check` is False). The dict is `diff --json`'s."""
    from workbench.planning.diff import diff
    src = source if source is None or not isinstance(source, os.PathLike) else str(source)
    return _driver(progress, cancel, driver)(diff(str(a), str(b), src, check=check,
                                                  calib=calib, samples=samples))


def convert_gguf(source, to: str, output, *, dtype: str | None = None,
                 off_grid: int | None = None, progress: ProgressCallback | None = None,
                 cancel: CancelCheck | None = None, driver: Driver | None = None) -> dict:
    """A (quantized) GGUF as a float model: ``to="hf"`` a Hugging Face folder every
    model-level function runs, ``to="gguf"`` an F16/BF16 GGUF. `off_grid` (a seed): take the
    weights off the grid they were quantized to with an exact reparametrisation
    (docs/real-models.md). An mlx-lm folder (any mode, mixed) converts to a float Hugging Face
    folder (``to="hf"``; `dtype` None: the folder's own float dtype). The dict is
    `convert --json`'s."""
    from workbench.export.convert import convert
    source = source if isinstance(source, (str, os.PathLike)) else source.path   # a Model: its file
    return _driver(progress, cancel, driver)(convert(str(source), to, str(output), dtype,
                                                     off_grid))

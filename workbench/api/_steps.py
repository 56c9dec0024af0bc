"""Steps of the API's jobs kept out of workbench/api/__init__.py (its public functions): the
runtime "mlx" of check_plan, and allocate_plan's cost lines and the GPTQ fits it keeps for
check and export. They call back into the package's public functions, imported when they run.
"""

from __future__ import annotations

from typing import Callable

from workbench.core.errors import WorkbenchError


def _check_runtime_options(runtime, target, *, mlx_folder=None, save_gguf=None,
                           accuracy_level=None, save_onnx=None, activations=None) -> str:
    """check_plan's options that belong to one runtime, refused on another before any work
    (none is dropped), then the rules `runtime` runs (workbench.api.runtime_target)."""
    from workbench.api import runtime_target
    if mlx_folder is not None and runtime != "mlx":
        raise WorkbenchError("mlx_folder= needs runtime='mlx'", params=("mlx_folder", "runtime"))
    if save_gguf is not None and runtime != "llama.cpp":
        raise WorkbenchError("save_gguf= needs runtime='llama.cpp'",
                             params=("save_gguf", "runtime"))
    target = runtime_target(runtime, target)
    if runtime != "onnxruntime" and (accuracy_level is not None or save_onnx is not None
                                     or activations):
        raise WorkbenchError("accuracy_level=, activations= and save_onnx= need "
                             "runtime='onnxruntime'",
                             params=("accuracy_level", "activations", "save_onnx", "runtime"))
    return target


def _check_mlx(model, plan, text, *, ctx, chunks, mlx_folder, mlx_chunks, mlx_ctx, target,
               quantize_all, convention, method, calib, imatrix, use_cache, drive, say) -> dict:
    """check_plan's runtime "mlx" (workbench.export.mlx_check)."""
    from workbench.export.mlx_check import check_folder, check_float_model, check_mlx
    from workbench.running.calibration import DEFAULT_CALIB
    from workbench.running.runner_config import model_kind, read_config
    from workbench.api import _resolve_plan, with_methods
    kind = model_kind(read_config(model))
    if kind != "causal-lm":
        raise WorkbenchError(f"runtime 'mlx' measures next-token KL divergence: a causal LM, "
                             f"not a {kind}", path=model.path)
    check_float_model(model)
    conv, mm = None, None
    if mlx_folder is not None:
        check_folder(mlx_folder)
        if plan is not None or method:
            raise WorkbenchError("mlx_folder is the quantized model: give no plan or method "
                                 "with it")
    else:
        if plan is None:
            raise WorkbenchError("runtime 'mlx' judges a plan (exported to an mlx-lm folder) "
                                 "or an mlx_folder: give one")
        plan, conv = _resolve_plan(model, plan, target, quantize_all, convention)
        plan, mm = with_methods(model, plan, method=method, calib=calib, imatrix=imatrix,
                                target=target, driver=drive, say=say, use_cache=use_cache)
    res = drive(check_mlx(model, plan, text or DEFAULT_CALIB, ctx, chunks=chunks,
                          folder=mlx_folder, mlx_chunks=mlx_chunks, mlx_ctx=mlx_ctx,
                          quant_model=mm,
                          use_cache=use_cache))
    if conv is not None:
        res = {**res, "convention": conv.to_dict()}
    return res


def _fit_for_later(model, plan, calib, imatrix, target, drive, say) -> None:
    """The plan's kept fits (GPTQ's; imatrix's on MLX schemes) on the whole calibration text,
    made now and kept in the fit cache, so `check` and `export` of this plan (the same
    calibration input) read them and run no calibration pass (workbench.running.method_fits).
    allocate's own fits judged the methods (half the samples, a sample of rows): not these."""
    from workbench.api import with_methods
    from workbench.running.methods_apply import fit_kept, kept_tensors
    kept = {plan.method_for(n) for n, _s in kept_tensors(model, plan, target)}
    if not kept:
        return
    _plan, mm = with_methods(model, plan, calib=calib, imatrix=imatrix, target=target,
                             driver=drive)
    n = drive(fit_kept(mm, _plan, target))
    if say and n:
        say(f"methods: {', '.join(sorted(kept))} fitted on the whole calibration text for "
            f"{n} tensors and kept: `check` and `export` of this plan read them")


def _cost_lines(model, names, measure, calib, imatrix, samples, methods,
                busy: bool, target: str = "any") -> list[str]:
    """allocate's lines on what the allocation will cost (workbench.planning.allocate_cost),
    with `busy` the line that corrects the estimate for a busy machine (a progress line)."""
    from workbench.api import resolve_measure
    from workbench.planning.allocate_cost import allocation_cost, busy_line, lines, machine_load
    choice = resolve_measure(model, measure, calib, imatrix, samples)
    now, faster = allocation_cost(model, names, choice.measure, choice.samples, methods, calib,
                                  imatrix, target=target)
    out = lines(now, faster)
    late = busy_line(now, machine_load()) if busy else None
    return [f"allocate: {line}" for line in out + ([late] if late else [])]


def _said_first(drive: Callable, say: Callable[[str], None], lines: list[str]) -> Callable:
    """`drive`, saying `lines` as it starts the first job (after the measure's line)."""
    def first(job):
        while lines:
            say(lines.pop(0))
        return drive(job)
    return first

"""The workbench as a Python library: ``import workbench as qw`` (docs/api.md).

The same work as the command line, as functions with plain typed parameters: open a model, its
statistics, evaluate / check / export a plan, the sensitivity table, allocate a plan to a
:class:`Budget`, the frontier, diff two quantizations, convert a GGUF. The CLI commands call these
functions (or the domain functions they name) with their flags translated.

Long work runs the project's progress jobs (workbench.core.progress): every long function takes
``progress`` (a callable given each :class:`Progress`: ``done``, ``total``, ``message``,
``fraction``) and ``cancel`` (a callable; once it returns True the work stops between two progress
events and :class:`Cancelled` is raised). ``driver`` (advanced) replaces both: a callable that runs
each stage's job and returns its result, as the CLI's text bar does.

A plan argument is a :class:`Plan` or a scheme name; a scheme name is the uniform plan of
``--scheme``, following the target runtime's convention for the embeddings and the output head
unless ``quantize_all`` (workbench.planning.conventions).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

from workbench import _API
# the public names this package re-exports (workbench.__init__'s _API): the types and
# errors a script meets, the results, the file jobs
from workbench.api._common import (AUTO, AUTO_FISHER_SAMPLES, AUTO_FISHER_SAMPLES_LM,  # noqa: F401
                                   DEFAULT_SCHEMES, CancelCheck, Driver, PlanLike,
                                   ProgressCallback, _check_inputs, _driver, _file_inputs)
from workbench.api.files import calibrate, convert_gguf, diff_quantizations  # noqa: F401
from workbench.api.maps import map_model  # noqa: F401
from workbench.api.results import Allocation, Frontier, MeasureChoice
from workbench.api._steps import (_check_mlx, _check_runtime_options, _cost_lines, _fit_for_later,
                                  _said_first)
from workbench.core.errors import Cancelled, WorkbenchError  # noqa: F401
from workbench.core.progress import Progress  # noqa: F401
from workbench.planning.budget import Budget
from workbench.quant.plan import Plan, Rule

if TYPE_CHECKING:   # the heavy types, for annotations only
    from workbench.formats.model import Model
    from workbench.planning.sensitivity import SensitivityTable
    from workbench.quant.evaluate import Evaluation
    from workbench.quant.stats import TensorStats

#: the public names; workbench/__init__.py lists them (it re-exports them without importing this)
__all__ = sorted(_API)

# ---- models, statistics, plans ----------------------------------------------------------------
def demo_model_path() -> Path:
    """The bundled demo model (resources/demo_model/model.safetensors)."""
    return Path(__file__).resolve().parents[2] / "resources" / "demo_model" / "model.safetensors"


def open_model(path: str | os.PathLike | None = None, *, device: str | None = None) -> "Model":
    """Open a checkpoint (safetensors file or folder, PyTorch, GGUF, compressed-tensors): headers
    only, tensors are read on demand. None: the bundled demo model. `device` ("cpu", "cuda"):
    where model-level work (check, calibration, fisher, GPTQ) runs; default cuda when torch
    sees a GPU."""
    from workbench.formats.loaders import open_model as _open
    if device:
        from workbench.running.runner_config import set_device
        set_device(device)
    return _open(str(path) if path is not None else str(demo_model_path()))


def statistics(model: "Model", names: Iterable[str] | None = None, *, executor=None,
               progress: ProgressCallback | None = None, cancel: CancelCheck | None = None,
               driver: Driver | None = None) -> dict[str, "TensorStats"]:
    """{tensor: TensorStats} (absmax, std, kurtosis, outlier fraction, NaN/Inf counts,
    histogram, per-channel ranges) for `names` (default every tensor), as `inspect` lists
    them. `executor`: a workbench.jobs.cluster executor the per-tensor work runs on."""
    from workbench.quant.stats import model_stats
    return _driver(progress, cancel, driver)(
        model_stats(model, list(names) if names is not None else None, executor=executor))


def make_plan(scheme: str | None = None, *, path: str | os.PathLike | None = None,
              plan: Plan | None = None, rules: Sequence[Rule | tuple[str, str]] = ()) -> Plan:
    """A plan: one `scheme` for every weight matrix, the plan file at `path` or a `plan`, with
    `rules` ((MATCH, SCHEME) or Rule: an exact name, ``re:PATTERN`` or a ``moe:`` selector)
    ahead of its own (the first match wins)."""
    if sum(x is not None for x in (scheme, path, plan)) != 1:
        raise WorkbenchError("give one of a scheme, a plan file or a plan")
    if path is not None:
        plan = Plan.load(str(path))
    elif isinstance(plan, Mapping):         # a plan document (export --format plan's JSON)
        plan = Plan.from_dict(dict(plan), path="plan")
    elif scheme is not None:
        from workbench.schemes import get_scheme
        plan = Plan(default=get_scheme(scheme).name)   # unknown names: a clear error
    extra = [r if isinstance(r, Rule) else Rule(str(r[0]), str(r[1])) for r in rules]
    return plan._copy(rules=extra + list(plan.rules)) if extra else plan


def list_schemes(variants: bool = False) -> list[str]:
    """The scheme names a plan takes (canonical; with `variants`, also the @clip/@pot ones)."""
    from workbench.schemes import list_schemes as _list
    return _list(variants=variants)


def get_scheme(name: str):
    """The scheme called `name` (its facts: ``bits_per_weight()``, ``nominal_bits``,
    ``ineligible_reason(shape)``, ...); an unknown name is a WorkbenchError listing the known."""
    from workbench.schemes import get_scheme as _get
    return _get(name)


def _resolve_plan(model, plan: PlanLike, target: str, quantize_all: bool = False,
                  convention: str | None = None):
    """(Plan, Convention or None): a scheme name is the uniform plan; it (or `convention`, the
    scheme of a uniform plan given as a Plan) follows `target`'s convention for the embeddings
    and the output head unless `quantize_all`."""
    if not isinstance(plan, Plan):
        convention = str(plan)
        plan = make_plan(convention)
    if convention is None or quantize_all:
        return plan, None
    from workbench.planning.conventions import apply
    return apply(plan, model, convention, target)


def runtime_target(runtime: str, target: str | None) -> str:
    """The rules a `check` on `runtime` runs: onnxruntime's and llama.cpp's own (another
    `target` is an error), `target` (default any) for torch."""
    if runtime not in ("torch", "onnxruntime", "llama.cpp", "mlx"):
        raise WorkbenchError(f"runtime {runtime!r}: choose torch, onnxruntime, llama.cpp or "
                             "mlx")
    if runtime != "torch" and target not in (None, runtime):
        raise WorkbenchError(f"runtime={runtime!r} runs the rules of target={runtime!r}, "
                             f"not {target}", params=("runtime", "target"))
    return runtime if runtime != "torch" else (target or "any")


def with_methods(model: "Model", plan: Plan, *, method: str | None = None, calib=None,
                 imatrix=None, target: str = "any", progress: ProgressCallback | None = None,
                 cancel: CancelCheck | None = None, driver: Driver | None = None,
                 say: Callable[[str], None] | None = None, use_cache: bool = True):
    """(plan with `method` on the tensors whose rule names none, the model to quantize): the
    model itself when every tensor uses rtn, else a MethodModel holding each tensor's imatrix
    / GPTQ / AWQ result, fitted on `calib` (text / JSONL / token ids; default the shipped
    calibration text) or an `imatrix` file. `say(line)` gets the methods' notes. A GPTQ fit
    made before for the same inputs is read from the fit cache (workbench.running.method_fits;
    `use_cache` False: neither read nor written)."""
    from workbench.running.methods_apply import importance_for_lattice, prepare
    plan = importance_for_lattice(model, plan.with_method(method) if method else plan, target,
                                  imatrix, say, switch=method != "rtn")
    if plan.methods_used() == {"rtn"}:
        if imatrix:
            raise WorkbenchError("imatrix= needs a method that reads it: method='imatrix'",
                                 params=("imatrix", "method"))
        return plan, model
    mm = _driver(progress, cancel, driver)(prepare(model, plan, calib, imatrix, target,
                                                   use_cache=use_cache))
    for note in getattr(mm, "notes", []) if say else ():
        say(f"note: {note}")
    return plan, mm


# ---- evaluate, check, export ------------------------------------------------------------------
def evaluate_plan(model: "Model", plan: PlanLike, *, target: str = "any", strict: bool = False,
                  quantize_all: bool = False, convention: str | None = None, method: str | None = None, calib=None,
                  imatrix=None, executor=None, progress: ProgressCallback | None = None,
                  cancel: CancelCheck | None = None,
                  driver: Driver | None = None) -> "Evaluation":
    """Quantize every tensor as `plan` says under `target`'s rules (fallbacks, tensors kept)
    and measure it: an Evaluation with ``tensors`` (per tensor: scheme, method, bits per
    weight, bytes, errors) and ``totals`` (bytes before / after, bits per weight, SQNR), as
    `evaluate` prints them. `strict`: a fallback is an error."""
    from workbench.quant.evaluate import evaluate
    _check_inputs(model, calib, imatrix=imatrix)
    drive = _driver(progress, cancel, driver)
    plan, _conv = _resolve_plan(model, plan, target, quantize_all, convention)
    plan, qmodel = with_methods(model, plan, method=method, calib=calib, imatrix=imatrix,
                                target=target, driver=drive)
    return drive(evaluate(qmodel, plan, runtime=target, strict=strict, executor=executor))


def check_plan(model: "Model", plan: PlanLike, *, calib=None, held_out=None,
               samples: int | None = None, target: str | None = None, runtime: str = "torch",
               scoring: str = "chunks", ctx: int | None = None, chunks: int | None = None,
               quantize_all: bool = False, convention: str | None = None,
               method: str | None = None, imatrix=None, activations: str | None = None,
               act_method: str = "minmax", accuracy_level: int | None = None, save_onnx=None,
               save_gguf=None, kld_exact: bool = False, use_cache: bool = True,
               emulate: str | None = "auto", mlx_folder=None, mlx_chunks: int = 1,
               mlx_ctx: int | None = None,
               progress: ProgressCallback | None = None, cancel: CancelCheck | None = None,
               driver: Driver | None = None, kld_driver: Driver | None = None,
               say: Callable[[str], None] | None = None) -> dict:
    """Run the original and the quantized model on text and compare their outputs, as `check`
    does: sentence-embedding cosine for encoders; for causal LMs llama-perplexity's KL
    divergence figures (``scoring="chunks"``: the "kld" key) or per-line KL / top-1 /
    perplexity (``"lines"``). Measured on `held_out` (default `calib`, default the shipped
    calibration text); a method calibrates on `calib`. `runtime`: "torch" (the transformers
    model with dequantized weights), "onnxruntime" (the exported ONNX file; `activations`
    "int8" for W8A8 calibrated with `act_method`) or "llama.cpp" (the exported GGUF in
    llama-perplexity against an F16 GGUF). The dict is `check --json`'s, with "convention"
    when the plan followed one. `kld_driver` runs the chunked KL-divergence job (default
    `driver`). `emulate` "llama.cpp" (torch runtime, either scoring): the quantized model's
    Linear inputs rounded as llama.cpp's CPU dot products round them (docs/vs-llama.md);
    "auto" (the default): so when `target` is llama.cpp; None: never. `runtime` "mlx": the
    plan exported with ``export --format mlx`` (or the mlx-lm folder `mlx_folder`, then `plan`
    may be None) judged in torch on the text and in mlx-lm on its first `mlx_chunks` chunks
    of `mlx_ctx` tokens (default `ctx`; workbench.export.mlx_check; the "mlx" key)."""
    from workbench.running.runner_config import model_kind, read_config
    from workbench.core.outputs import check_output
    drive = _driver(progress, cancel, driver)
    target = _check_runtime_options(runtime, target, mlx_folder=mlx_folder, save_gguf=save_gguf,
                                    accuracy_level=accuracy_level, save_onnx=save_onnx,
                                    activations=activations)
    _check_inputs(model, calib, held_out, imatrix, say=say,
                  check=(runtime, "chunks" if runtime == "mlx" else scoring))
    text = held_out or calib
    if runtime == "mlx":
        return _check_mlx(model, plan, text, ctx=ctx, chunks=chunks or samples,
                          mlx_folder=mlx_folder, mlx_chunks=mlx_chunks, mlx_ctx=mlx_ctx,
                          target=target,
                          quantize_all=quantize_all, convention=convention, method=method,
                          calib=calib, imatrix=imatrix, use_cache=use_cache, drive=drive,
                          say=say)
    for label, out in (("save_gguf", save_gguf), ("save_onnx", save_onnx)):
        if out is not None:     # before any work: never an input, its folder writable
            check_output(out, model=model, label=label, inputs=_file_inputs(
                calib=calib, held_out=held_out, imatrix=imatrix))
    if runtime == "llama.cpp":
        from workbench.export.llama_kld import DEFAULT_CTX
        ctx, chunks = ctx or DEFAULT_CTX, chunks or samples
        kind = model_kind(read_config(model))
        if kind != "causal-lm":
            raise WorkbenchError(f"runtime='llama.cpp' measures next-token KL divergence: a "
                                 f"causal LM, not a {kind}", path=model.path,
                                 params=("runtime",))
    plan, conv = _resolve_plan(model, plan, target, quantize_all, convention)
    if activations:
        from workbench.running.methods_apply import activation_ranges
        from workbench.quant.runtimes import plan_decisions
        quantized = {n for n, d in plan_decisions(model, plan, target).items()
                     if d.applied != "keep"}
        plan = plan.with_activations(drive(activation_ranges(model, quantized, calib,
                                                             act_method, 8, "int")))
    plan, mm = with_methods(model, plan, method=method, calib=calib, imatrix=imatrix,
                            target=target, driver=drive, say=say, use_cache=use_cache)
    if runtime == "llama.cpp":
        from workbench.running.calibration import DEFAULT_CALIB
        from workbench.export.llama_kld import check_llama
        res = drive(check_llama(model, plan, text or DEFAULT_CALIB, ctx, chunks=chunks,
                                keep_path=save_gguf, quant_model=mm, use_cache=use_cache))
    elif runtime == "onnxruntime":
        from workbench.export.onnx_check import check_onnx
        res = drive(check_onnx(mm, plan, text, samples, accuracy_level=accuracy_level,
                               keep_path=save_onnx))
    else:
        weights = None
        if mm is not model or method or target != "any":   # (method rtn: same fallbacks)
            from workbench.running.methods_apply import runner_weights
            weights = runner_weights(mm, plan, target)
        from workbench.running.runner_jobs import check
        emul = ("llama.cpp" if target == "llama.cpp" else None) if emulate == "auto" \
            else emulate
        if scoring == "chunks" and model_kind(read_config(model)) == "causal-lm":
            from workbench.running.kld import kld_check
            res = (kld_driver or drive)(kld_check(
                model, plan, text, ctx=ctx, chunks=chunks or samples, weights=weights,
                use_cache=use_cache, exact=kld_exact, emulate=emul))
        else:
            res = drive(check(model, plan, text, samples, weights=weights, emulate=emul))
    if conv is not None:
        res = {**res, "convention": conv.to_dict()}
    return res


def export_formats() -> list[str]:
    """The formats :func:`export_plan` writes (gguf, compressed-tensors, onnx, safetensors,
    plan, ...)."""
    from workbench.export import list_exporters
    return [e.name for e in list_exporters()]


#: the runtime whose rules each format's export follows
FORMAT_RUNTIME = {"gguf": "llama.cpp", "compressed-tensors": "vllm", "onnx": "onnxruntime",
                  "mlx": "mlx"}


def format_runtime(fmt: str, target: str | None = None) -> str:
    """The runtime whose rules an export to `fmt` follows: the format's own, or `target` for
    formats that take any (a `target` other than a format's own runtime is an error)."""
    own = FORMAT_RUNTIME.get(fmt)
    if target and own and target != own:
        raise WorkbenchError(f"fmt={fmt!r} writes for target={own!r}, not {target}",
                             params=("fmt", "target"))
    return own or target or "any"


def export_plan(model: "Model", plan: PlanLike, fmt: str, output: str | os.PathLike, *,
                target: str | None = None, strict: bool = False, quantize_all: bool = False,
                convention: str | None = None, method: str | None = None, calib=None, imatrix=None,
                activations: str | None = None, act_method: str = "minmax", act_bits: int = 8,
                act_type: str = "int", accuracy_level: int | None = None,
                overwrite: bool = False, executor=None,
                progress: ProgressCallback | None = None, cancel: CancelCheck | None = None,
                driver: Driver | None = None, say: Callable[[str], None] | None = None,
                use_cache: bool = True) -> dict:
    """Write `plan` quantized in format `fmt` (:func:`export_formats`) to `output`, following
    the format's runtime rules (gguf: llama.cpp, compressed-tensors: vLLM, onnx: ONNX Runtime;
    the others `target`'s). `activations`: a calibration method (minmax, percentile, mse, kl)
    for a static range of every quantized Linear's input (`act_bits`, `act_type` int or
    float), or "int8" (8-bit integers calibrated with `act_method`). Returns `export --json`'s dict
    (notes, fallbacks, "convention" when a scheme name followed one). Writes are atomic and
    never replace a file the model is read from. `output` is checked before any work
    (workbench.core.outputs.check_output): a folder format (compressed-tensors) replaces an
    existing non-empty folder only with `overwrite`, and never one holding an input."""
    from workbench.core.outputs import check_output
    from workbench.export import get_exporter
    check_output(output, kind=get_exporter(fmt).kind, model=model,
                 inputs=_file_inputs(calib=calib, imatrix=imatrix), overwrite=overwrite)
    drive = _driver(progress, cancel, driver)
    runtime = format_runtime(fmt, target)
    _check_inputs(model, calib, imatrix=imatrix, say=say)
    plan, conv = _resolve_plan(model, plan, runtime, quantize_all, convention)
    if accuracy_level is not None and fmt != "onnx":
        raise WorkbenchError("accuracy_level= is an onnx option (MatMulNBits accuracy_level)",
                             params=("accuracy_level",))
    if activations and not get_exporter(fmt).activations:
        from workbench.export import list_exporters
        raise WorkbenchError(f"activations={activations!r}: the {fmt} format stores no "
                             "activation ranges (" + ", ".join(
                                 e.name for e in list_exporters() if e.activations) + " do)")
    if activations == "int8":
        activations, act_bits, act_type = act_method, 8, "int"
    if activations:
        from workbench.running.methods_apply import activation_ranges
        from workbench.quant.plan import KEEP
        from workbench.quant.runtimes import plan_decisions
        quantized = {n for n, d in plan_decisions(model, plan, runtime).items()
                     if d.applied != KEEP}
        plan = plan.with_activations(drive(activation_ranges(model, quantized, calib,
                                                             activations, act_bits, act_type)))
    qmodel = model
    if fmt != "plan":
        plan, qmodel = with_methods(model, plan, method=method, calib=calib, imatrix=imatrix,
                                    target=runtime, driver=drive, say=say, use_cache=use_cache)
    elif method:
        plan = plan.with_method(method)
    options: dict[str, Any] = {"strict": True} if strict else {}
    if executor is not None:
        options["executor"] = executor
    if accuracy_level is not None:
        options["accuracy_level"] = accuracy_level
    from workbench.export import export
    info = drive(export(qmodel, plan, fmt, str(output), overwrite=overwrite, **options))
    if conv is not None:
        info["convention"] = conv.to_dict()
    return info


# ---- sensitivity, allocation, frontier --------------------------------------------------------
def parse_schemes(text: str | Sequence[str], target: str = "any") -> list[str]:
    """Scheme names, as a list or comma-separated text (aliases resolved, repeats dropped, an
    unknown name a WorkbenchError), or "auto": every scheme `target` runs and exports
    (workbench.quant.runtimes.candidate_schemes)."""
    from workbench.quant.runtimes import candidate_schemes
    from workbench.schemes import get_scheme
    if not isinstance(text, str):
        text = ",".join(text)
    if text == "auto":
        return candidate_schemes(target)
    out = [get_scheme(s.strip()).name for s in text.split(",") if s.strip()]
    return list(dict.fromkeys(out))


def resolve_measure(model: "Model", measure: str = AUTO, calib=None, imatrix=None,
                    samples: int | None = None) -> MeasureChoice:
    """"auto": fisher when the model is runnable (on AUTO_FISHER_SAMPLES samples unless
    `samples`), activation with an imatrix, weight otherwise; an explicit measure as given."""
    if measure != AUTO:
        return MeasureChoice(measure, samples, "given")
    from workbench.planning.sensitivity import best_measure
    m, why = best_measure(model, calib, imatrix)
    from workbench.planning.measures import get_measure
    if get_measure(m).needs_model and samples is None:       # (fisher: a pass per sample)
        from workbench.planning.allocate_methods import _kind
        samples = AUTO_FISHER_SAMPLES_LM if _kind(model) == "causal-lm" else AUTO_FISHER_SAMPLES
        why += f"; the first {samples} calibration samples (--samples)"
    return MeasureChoice(m, samples, why, auto=True)


def measure_sensitivity(model: "Model", schemes: str | Sequence[str] = DEFAULT_SCHEMES, *,
                        measure: str = AUTO, calib=None, imatrix=None,
                        samples: int | None = None, target: str = "any",
                        pins: Mapping[str, str] | None = None, extra: Sequence[str] = (),
                        executor=None, progress: ProgressCallback | None = None,
                        cancel: CancelCheck | None = None, driver: Driver | None = None,
                        say: Callable[[str], None] | None = None,
                        use_cache: bool = True) -> "SensitivityTable":
    """Per tensor and candidate scheme: how much quantizing it hurts, and the bytes `evaluate`
    counts for `target` (a SensitivityTable: ``values[(tensor, scheme)]``, ``bytes``,
    ``rows()`` most sensitive first, ``to_dict()``). `measure`: weight (squared weight error),
    activation (imatrix-weighted), fisher (a second-order estimate of the output change from
    one calibration pass), output (measured, one tensor at a time) or auto
    (:func:`resolve_measure`). The table also carries ``measure_reason`` and ``samples`` (the
    calibration samples read). `say(line)` gets the chosen measure's line when auto.
    `use_cache` False: the output measure's cache is neither read nor written."""
    from workbench.planning.sensitivity import sensitivity_table_job
    names = parse_schemes(schemes, target)
    _check_inputs(model, calib, imatrix=imatrix, say=say)
    choice = resolve_measure(model, measure, calib, imatrix, samples)
    if choice.auto and say is not None:
        say(f"measure: {choice.measure} ({choice.reason}); {len(names)} candidate schemes for "
            f"target {target}")
    from workbench.planning.measures import get_measure
    refused = get_measure(choice.measure).refusal(calib, imatrix)
    if refused:
        raise refused
    table = _driver(progress, cancel, driver)(sensitivity_table_job(
        model, names, choice.measure, calib, imatrix, choice.samples, target,
        dict(pins) if pins else None, list(extra), executor=executor, use_cache=use_cache))
    table.measure_reason = choice.reason
    table.samples = choice.samples
    return table


def allocate_plan(model: "Model", budget: Budget, *, schemes: str | Sequence[str] = AUTO,
                  measure: str = AUTO, calib=None, imatrix=None, samples: int | None = None,
                  target: str = "any", pins: Mapping[str, str] | None = None,
                  methods: str = AUTO, table: "SensitivityTable | None" = None,
                  output: str | os.PathLike | None = None, executor=None, progress: ProgressCallback | None = None, cancel: CancelCheck | None = None,
                  driver: Driver | None = None, say: Callable[[str], None] | None = None,
                  notes: bool = True, use_cache: bool = True, estimate: bool = False) -> Allocation:
    """The plan with the least total sensitivity within `budget` (:class:`Budget`), over the
    candidate `schemes` ("auto": every scheme `target` runs), with `pins` ({tensor or moe:
    selector: scheme}) fixed and `methods` ("auto", "rtn" or e.g. "rtn,imatrix,gptq") weighed
    per tensor and scheme (docs/methods.md). `table`: a table :func:`measure_sensitivity`
    measured for the same `target` and `pins`, used instead of measuring one (its schemes are
    the candidates; it is left as it was). An impossible budget is refused from the shapes
    alone, before anything is measured. `output`: the plan JSON is written there as soon as it
    is solved; it is checked before any work (never a file of the model or of `calib` /
    `imatrix`, its folder writable). A config.json the weights contradict is refused first.
    `say(line)` gets `allocate`'s notes: the measure chosen, with `notes` the methods weighed,
    and with `estimate` the expected time and the options that cut it (named by the CLI's
    flags, as `allocate` prints them), said as the first job starts. With `use_cache`, the
    plan's GPTQ tensors are fitted on the whole calibration text once it is solved and the fits
    kept (workbench.running.method_fits): `check_plan` and `export_plan` of this plan with the
    same `calib` read them, with no calibration pass; `use_cache` False: the measure's and the
    fits' caches are neither read nor written."""
    from workbench.core.outputs import check_output
    from workbench.formats.config_check import check_model_config
    if output is not None:
        output = check_output(output, model=model, inputs=_file_inputs(calib=calib,
                                                                         imatrix=imatrix))
    check_model_config(model)   # a config.json its weights contradict: refused, not worked around
    from workbench.planning import budget as budgets
    from workbench.planning.allocate_methods import parse_methods, plan_with_methods, weigh_methods
    from workbench.quant.evaluate import evaluate
    from workbench.running.moe import expand_pins
    from workbench.core.progress import run as run_job
    from workbench.planning.sizes import below_smallest_message, budget_candidates, size_floor
    drive = _driver(progress, cancel, driver)
    budget = budgets.for_target(budget, target)     # a file budget: the target's file
    target = budgets.file_target(budget, target)
    _check_inputs(model, calib, imatrix=imatrix if table is not None else None, say=say)
    if table is not None:
        if table.runtime != target:
            raise WorkbenchError(f"the sensitivity table was measured for target "
                                 f"{table.runtime}, not {target}")
        schemes = table.schemes
    names = parse_schemes(schemes, target)
    parse_methods(methods)          # a bad methods text is refused before anything is measured
    pins = expand_pins(model, pins or {})   # moe: selectors, names checked
    cheapest, params = size_floor(model, names, target, pins)
    want = int(budget.value) if budget.kind == "bytes" else int(budget.value * params / 8.0 + 1e-9)
    if (budget.kind == "bytes" or (budget.kind == "bpw" and budget.over == "all")) \
            and cheapest > want:
        raise WorkbenchError(below_smallest_message(model, want, cheapest, params, names,
                                                    target), path=model.path)
    if table is None and schemes == AUTO:      # schemes far below the budget: never chosen
        names = budget_candidates(model, names, budget, target, pins, say)
    if estimate and say is not None and table is None:
        drive = _said_first(drive, say, _cost_lines(model, names, measure, calib, imatrix,
                                                    samples, methods, busy=notes,
                                                    target=target))
    budgets.prefetch_file(model, budget) if table is None else None   # while the pass runs
    t0 = time.perf_counter()
    if table is None:
        table = measure_sensitivity(model, names, measure=measure, calib=calib,
                                    imatrix=imatrix, samples=samples, target=target, pins=pins,
                                    executor=executor, driver=drive, say=say,
                                    use_cache=use_cache)
    else:                         # weighing the methods rescales values: on a copy
        table = table.copy()
    t1 = time.perf_counter()
    weighed = weigh_methods(model, table, methods, table.measure, calib, imatrix,
                            getattr(table, "samples", samples),
                            target, drive=drive, say=say if notes else None,
                            solve=lambda t: t.assignment_of(
                                budgets.solve(model, t, budget, pins)[0], model))
    t1m = time.perf_counter()     # the solve is timed from here
    plan, sol, cap = budgets.solve(model, table, budget, pins,
                                   finish=lambda p: plan_with_methods(p, table, model))
    t2 = time.perf_counter()
    if output is not None:
        plan.save(str(output))
    if use_cache:
        _fit_for_later(model, plan, calib, imatrix, target, drive, say)
    ev = (driver or (lambda job: run_job(job, None, cancel)))(evaluate(model, plan,
                                                                       runtime=target))
    return Allocation(plan=plan, table=table, budget=budget, budget_bytes=cap, solution=sol,
                      evaluation=ev, accounting=budgets.accounting(model, ev, target, plan),
                      methods_weighed=weighed, candidates=names, target=target,
                      seconds={"sensitivity": t1 - t0, "solve": t2 - t1m}, model=model)


def compute_frontier(model: "Model", *, from_bpw: float | None = None,
                     to_bpw: float | None = None, points: int = 8,
                     recipes: Sequence[str] = ("Q4_K_M", "Q5_K_M"), check: int = 0,
                     check_samples: int | None = None, held_out=None,
                     schemes: str | Sequence[str] = AUTO, measure: str = AUTO, calib=None,
                     imatrix=None, samples: int | None = None, target: str = "any",
                     executor=None, progress: ProgressCallback | None = None,
                     cancel: CancelCheck | None = None, driver: Driver | None = None,
                     say: Callable[[str], None] | None = None,
                     use_cache: bool = True) -> Frontier:
    """`points` allocated plans evenly spaced from `from_bpw` to `to_bpw` bits per weight
    (default: the cheapest to the largest uniform plan), every uniform plan and the llama.cpp
    `recipes`; `check` > 0 measures that many allocated points and every uniform / recipe
    point end to end (`check`, on `held_out` or the calibration inputs)."""
    import numpy as np

    from workbench.planning.frontier import check_points_job, frontier, recipe_points, recipe_types, uniform_points
    recipes = [r.strip() for r in recipes if r.strip()]
    names = parse_schemes(schemes, target)
    _check_inputs(model, calib, held_out)       # (imatrix: measure_sensitivity's own check)
    extra = recipe_types(recipes) if recipes else []
    from workbench.quant.runtimes import get_runtime
    rt = get_runtime(target)
    if extra and not rt.keeps_unsupported and any(rt.unsupported(t) for t in extra):
        if say:                   # llama.cpp's recipes are GGML types (mlx has none)
            say(f"the llama.cpp recipes are left out: target {target} runs no GGML types")
        recipes, extra = [], []
    t0 = time.perf_counter()
    table = measure_sensitivity(model, names, measure=measure, calib=calib, imatrix=imatrix,
                                samples=samples, target=target, extra=extra, executor=executor,
                                progress=progress, cancel=cancel, driver=driver, say=say,
                                use_cache=use_cache)
    t1 = time.perf_counter()
    uni = uniform_points(model, table)
    rec, why = [], None
    if recipes:
        try:
            rec = recipe_points(model, recipes, table)
        except WorkbenchError as exc:
            why = str(exc)
    lo = from_bpw if from_bpw is not None else min(p.bits_per_weight for p in uni)
    hi = to_bpw if to_bpw is not None else max(p.bits_per_weight for p in uni)
    if hi < lo:   # (to_bpw and from_bpw both given are compared before any work: api.args)
        raise WorkbenchError(f"the range is empty: to_bpw {hi:g} is below from_bpw {lo:g}")
    bpws = [float(b) for b in np.linspace(lo, hi, points)] if points > 1 else [lo]
    t2 = time.perf_counter()
    alloc = frontier(model, None, table, bpws)
    t3 = time.perf_counter()
    if check:
        k = min(check, len(alloc))
        idx = sorted({int(round(i)) for i in np.linspace(0, len(alloc) - 1, k)}) if k else []
        targets = [alloc[i] for i in idx] + uni + rec
        text, n = (held_out, check_samples) if held_out else (calib,
                                                              check_samples or table.samples)
        _driver(progress, cancel, driver)(check_points_job(model, targets, text, n,
                                                           runtime=table.runtime))
    t4 = time.perf_counter()
    return Frontier(table, alloc, uni, rec, why,
                    {"sensitivity": t1 - t0, "allocate": t3 - t2, "check": t4 - t3}, names)


from workbench.api.args import check_all  # noqa: E402 - every public function checks its arguments
check_all(globals(), _API)                #   by their names before it works (api.args.RULES)

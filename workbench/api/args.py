"""The Python API's argument checks (docs/api.md, "Arguments"): every public function of
:mod:`workbench.api` is wrapped in :func:`checked`, which checks each argument it is given by the
parameter's name before the function does any work, so a script, the app and the CLI meet the
same refusal: a :class:`workbench.core.checks.ArgumentError` (a ``WorkbenchError``, and a
``TypeError`` for a wrong type, a ``ValueError`` for a bad value) whose message starts with the
parameter's name and gives the bounds or the choices. The CLI prints it under its flag.

A parameter means the same in every function (``samples``, ``target``, ``model``, ...);
:data:`RULES` holds one check per name, :data:`PER_FUNCTION` the few that differ by function
(``check``: a count in compute_frontier, a bool in diff_quantizations). A public function's
parameter without a rule is an error at import (tests/workbench/test_api_arguments.py).
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Mapping

from workbench.core import checks as c
from workbench.core.checks import ArgumentTypeError

#: bounds of the numeric arguments (in the messages; docs/api.md)
MAX_SAMPLES, MIN_CTX, MAX_CTX, MAX_CHUNKS = c.MAX_SAMPLES, c.MIN_CTX, c.MAX_CTX, c.MAX_CHUNKS
MAX_POINTS = 256                      # frontier points (each is one allocation)
MAX_BPW = 1024.0                      # bits per weight (allocate's --budget-bpw takes as much)
MAX_SEED = (1 << 63) - 1

BUDGET_HINT = ("build one with qw.Budget.bits_per_weight(4.5), qw.Budget.tensor_bytes(N), "
               "qw.Budget.file_bytes(N) or qw.Budget.of_file(path)")


def _model(name, v):
    from workbench.formats.model import Model
    from workbench.running.methods_apply import MethodModel
    hint = (f"open it first: qw.open_model({os.fspath(v)!r})"
            if isinstance(v, (str, os.PathLike)) else "qw.open_model(path)")
    c.check_type(name, v, (Model, MethodModel), "an opened model", hint=hint)


def _plan_like(name, v):
    from workbench.quant.plan import Plan
    c.check_type(name, v, (Plan, str), "a Plan or a scheme name",
                 hint="qw.make_plan('q4_k') or qw.make_plan(path='plan.json')")
    if isinstance(v, str) and not v:
        raise c.ArgumentError(name, "is empty: give a Plan or a scheme name")


def _plan_type():
    from workbench.quant.plan import Plan
    return Plan


def _plan(name, v):
    from workbench.quant.plan import Plan
    c.check_type(name, v, Plan, "a Plan", hint="qw.make_plan(...)")


def _budget(name, v):
    from workbench.planning.budget import Budget
    c.check_type(name, v, Budget, "a Budget", hint=BUDGET_HINT)


def _pins(name, v):
    if v is None:
        return
    if not isinstance(v, Mapping):
        raise ArgumentTypeError(name, "must be a dict {tensor name or moe: selector: scheme}, "
                                      f"not {c._what(v)}")
    for k, s in v.items():
        if not isinstance(k, str) or not isinstance(s, str) or not k or not s:
            raise ArgumentTypeError(name, "must map tensor names (text) to scheme names "
                                          f"(text), and holds {k!r}: {s!r}")


def _rules(name, v):
    from workbench.quant.plan import Rule
    if isinstance(v, (str, bytes, Mapping)) or not hasattr(v, "__iter__"):
        raise ArgumentTypeError(name, f"must be a list of Rule or (MATCH, SCHEME) pairs, "
                                      f"not {c._what(v)}")
    for r in v:
        if isinstance(r, Rule):
            continue
        if (isinstance(r, (str, bytes)) or not isinstance(r, (tuple, list)) or len(r) != 2
                or not all(isinstance(x, str) and x for x in r)):
            raise ArgumentTypeError(name, "must hold Rule or (MATCH, SCHEME) pairs of text, "
                                          f"and holds {c._what(r)}")


def _schemes(name, v):
    if isinstance(v, str):
        if not v.strip():
            raise c.ArgumentError(name, "is empty: give scheme names or 'auto'")
        return
    if not c.check_names(name, v, what="scheme names"):
        raise c.ArgumentError(name, "is empty: give scheme names or 'auto'")


def _recipes(name, v):
    c.check_names(name, v, what="llama.cpp recipe names (['Q4_K_M', ...])")


def _table(name, v):
    from workbench.planning.sensitivity import SensitivityTable
    c.check_type(name, v, SensitivityTable, "a SensitivityTable", none=True,
                 hint="qw.measure_sensitivity(...)")


def _executor(name, v):
    if v is not None and not callable(getattr(v, "takes", None)):
        raise ArgumentTypeError(name, "must be a workbench.jobs.cluster executor or None, "
                                      f"not {c._what(v)}")


def _source_model_or_path(name, v):
    from workbench.formats.model import Model
    if v is not None and not isinstance(v, Model):
        c.check_path(name, v)


def _choice(*choices, none=False):
    return lambda n, v: c.check_choice(n, v, choices, none=none)


def _choices_of(get, none=False):
    return lambda n, v: c.check_choice(n, v, get(), none=none)


def _runtimes():
    from workbench.quant.runtimes import RUNTIMES
    return list(RUNTIMES)


def _measures():
    from workbench.planning.measures import measure_names
    return ["auto", *measure_names()]


def _formats():
    from workbench.export import list_exporters
    return [e.name for e in list_exporters()]


def _act_methods():
    from workbench.quant.methods.activations import METHODS
    return list(METHODS)


def _map_overlays():
    from workbench.planning.model_map import MAP_OVERLAYS
    return list(MAP_OVERLAYS)


def _path(none=False):
    return lambda n, v: c.check_path(n, v, none=none)


def _text(none=False):
    def check(n, v):
        if v is None and none:
            return
        if not isinstance(v, str) or not v:
            raise ArgumentTypeError(n, f"must be non-empty text{' or None' if none else ''}, "
                                       f"not {c._what(v)}")
    return check


def _int(lo, hi, none=True):
    return lambda n, v: c.check_int(n, v, lo, hi, none=none)


def _progress(name, v):
    if v is not False and v is not None and not callable(v):   # False: nothing shown
        raise ArgumentTypeError(name, f"must be a callable, None (a progress line) or False "
                                      f"(nothing shown), not {c._what(v)}")


_BOOL = c.check_bool
_CALLABLE = c.check_callable
_METHOD = _choice("rtn", "imatrix", "gptq", "awq", none=True)

#: the check of each parameter name, in every public function
RULES = {
    "model": _model, "plan": _plan_like, "budget": _budget, "table": _table,
    "path": _path(none=True), "device": _choice("cpu", "cuda", none=True),
    "names": lambda n, v: c.check_names(n, v, none=True, what="tensor names"),
    "scheme": _text(none=True), "rules": _rules, "pins": _pins,
    "extra": lambda n, v: c.check_names(n, v, what="scheme names"),
    "schemes": _schemes, "text": _schemes, "recipes": _recipes,
    "target": _choices_of(_runtimes), "runtime": _choice("torch", "onnxruntime", "llama.cpp",
                                                             "mlx"),
    "scoring": _choice("chunks", "lines"), "measure": _choices_of(_measures),
    "emulate": _choice("auto", "llama.cpp", none=True),
    "method": _METHOD, "methods": _text(), "convention": _text(none=True),
    "fmt": _choices_of(_formats), "to": _choice("hf", "gguf"),
    "dtype": _text(none=True), "act_method": _choices_of(_act_methods),
    "act_type": _choice("int", "float"), "act_bits": _int(2, 16, none=False),
    "accuracy_level": _int(0, 4),
    "calib": _path(none=True), "held_out": _path(none=True), "imatrix": _path(none=True),
    "output": _path(), "save_onnx": _path(none=True), "save_gguf": _path(none=True),
    "a": _path(), "b": _path(), "source": _source_model_or_path,
    "samples": _int(1, MAX_SAMPLES), "check_samples": _int(1, MAX_SAMPLES),
    "ctx": _int(MIN_CTX, MAX_CTX), "chunks": _int(1, MAX_CHUNKS),
    "mlx_folder": _path(none=True), "mlx_chunks": _int(1, MAX_CHUNKS, none=False),
    "mlx_ctx": _int(MIN_CTX, MAX_CTX),
    "points": _int(1, MAX_POINTS, none=False), "off_grid": _int(0, MAX_SEED),
    "from_bpw": lambda n, v: c.check_float(n, v, 0.0, MAX_BPW, none=True, lo_open=True),
    "to_bpw": lambda n, v: c.check_float(n, v, 0.0, MAX_BPW, none=True, lo_open=True),
    "strict": _BOOL, "quantize_all": _BOOL, "kld_exact": _BOOL, "use_cache": _BOOL,
    "estimate": _BOOL,
    "notes": _BOOL, "overwrite": _BOOL, "executor": _executor,
    "progress": _progress, "cancel": _CALLABLE, "driver": _CALLABLE, "kld_driver": _CALLABLE,
    "say": _CALLABLE, "variants": _BOOL, "name": _text(), "overlay": _choices_of(_map_overlays),
}

#: where a name means something else in one function
PER_FUNCTION = {
    "make_plan": {"plan": lambda n, v: c.check_type(   # a plan document: make_plan parses it
        n, v, (_plan_type(), Mapping), "a Plan or a plan document (dict)", none=True)},
    "with_methods": {"plan": _plan},
    "allocate_plan": {"output": _path(none=True)},
    "compute_frontier": {"check": _int(0, MAX_POINTS, none=False)},
    "diff_quantizations": {"check": _BOOL},
    "check_plan": {"activations": _choice("int8", none=True),
                   "plan": lambda n, v: None if v is None else _plan_like(n, v),   # mlx_folder
                   "target": _choices_of(_runtimes, none=True)},
    "export_plan": {"activations": lambda n, v: c.check_choice(
        n, v, ["int8", *_act_methods()], none=True), "target": _choices_of(_runtimes, none=True)},
    "map_model": {"plan": lambda n, v: None if v is None else _plan_like(n, v)},
    "convert_gguf": {"source": lambda n, v: _source_model_or_path(n, v) if v is not None
                     else c.check_path(n, v)},      # a GGUF's Model: its file
}


def _bpw_range(args):
    lo, hi = args.get("from_bpw"), args.get("to_bpw")
    if lo is not None and hi is not None and hi < lo:
        raise c.ArgumentError("to_bpw", f"is {hi:g}: give at least the start of the range, {lo:g}")


#: checks of two arguments together, per function
TOGETHER = {"compute_frontier": _bpw_range}


def check_all(namespace: dict, names) -> None:
    """Wrap each function of `namespace` named in `names` (the API's public names) in
    :func:`checked`, in place."""
    for name in names:
        fn = namespace.get(name)
        if inspect.isfunction(fn) and not hasattr(fn, "checks"):
            namespace[name] = checked(fn)


def checked(fn):
    """`fn` with every argument checked by its parameter's rule before it runs."""
    sig = inspect.signature(fn)
    own = PER_FUNCTION.get(fn.__name__, {})
    rules = {}
    for name in sig.parameters:
        rule = own.get(name, RULES.get(name))
        if rule is None:
            raise RuntimeError(f"workbench.api.{fn.__name__}: no argument check for {name!r} "
                               "(add one to workbench.api.args.RULES)")
        rules[name] = rule

    both = TOGETHER.get(fn.__name__)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{fn.__name__}(): {exc}") from None
        for name, value in bound.arguments.items():
            rules[name](name, value)
        if both is not None:
            both(bound.arguments)
        return fn(*args, **kwargs)
    wrapper.checks = rules
    return wrapper

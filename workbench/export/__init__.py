"""Exporters: one module per format, registered by name.

An exporter is a generator function ``export_X(model, plan, out_path) -> Job`` that yields
:class:`~workbench.core.progress.Progress` and returns a small dict describing what it wrote.
It must write atomically (``workbench.core.atomic.atomic_write``). The CLI's
``export --format`` choices and the GUI's Export dialog both come from :data:`EXPORTERS`.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable

from workbench.core.errors import WorkbenchError


@dataclass(frozen=True)
class Exporter:
    name: str
    func: Callable
    suffix: str
    description: str
    #: what the output path names: "file", or "folder" (written whole; an existing non-empty
    #: folder is replaced only with overwrite)
    kind: str = "file"
    #: writes the plan's static activation ranges (export's `activations`); a format that
    #: does not is refused them, not handed ranges it would drop
    activations: bool = False


EXPORTERS: dict[str, Exporter] = {}


def register_exporter(name: str, suffix: str, description: str, kind: str = "file",
                      activations: bool = False):
    def deco(func):
        EXPORTERS[name] = Exporter(name, func, suffix, description, kind, activations)
        return func
    return deco


def _load_all() -> None:
    for mod in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{mod.name}")


def list_exporters() -> list[Exporter]:
    _load_all()
    return list(EXPORTERS.values())


def get_exporter(name: str) -> Exporter:
    _load_all()
    try:
        return EXPORTERS[name]
    except KeyError:
        raise WorkbenchError(f"unknown export format '{name}' "
                             f"(choose from {', '.join(EXPORTERS)})") from None


def export(model, plan, fmt: str, out_path, *, overwrite: bool = False, **options):
    """The export job for format `fmt` (a generator; drive it with progress.run). `options`
    (e.g. ``strict=True``) go to the exporters that take them; one a format does not take is
    an error. The output is checked first (workbench.core.outputs.check_output: never an
    input, its folder writable, an existing non-empty folder replaced only with `overwrite`)."""
    import inspect

    from workbench.core.outputs import check_output
    exporter = get_exporter(fmt)
    check_output(out_path, kind=exporter.kind, model=model, overwrite=overwrite)
    params = inspect.signature(exporter.func).parameters
    if "executor" not in params:     # where per-tensor work runs: a format with none runs here
        options.pop("executor", None)
    unknown = sorted(k for k in options if k not in params)
    if unknown:
        raise WorkbenchError(f"the {fmt} format takes no option {', '.join(unknown)} (it "
                             f"takes {', '.join(list(params)[3:]) or 'none'})")
    job = exporter.func(model, plan, str(out_path), **options)
    return _named_errors(job, model.path)


def _named_errors(job, path):
    """Drive `job`, re-raising its WorkbenchErrors with the model's file where they lack one
    (a tensor a scheme refuses, a NaN/Inf refusal, a tensor GGUF cannot take)."""
    from workbench.core.errors import context
    with context(path):
        return (yield from job)

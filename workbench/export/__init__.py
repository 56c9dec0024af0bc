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


EXPORTERS: dict[str, Exporter] = {}


def register_exporter(name: str, suffix: str, description: str):
    def deco(func):
        EXPORTERS[name] = Exporter(name, func, suffix, description)
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


def export(model, plan, fmt: str, out_path, **options):
    """The export job for format `fmt` (a generator; drive it with progress.run). `options`
    (e.g. ``strict=True``) go to the exporters that take them."""
    import inspect

    from workbench.core.atomic import refuse_overwriting_inputs
    refuse_overwriting_inputs(model, out_path)
    func = get_exporter(fmt).func
    params = inspect.signature(func).parameters
    job = func(model, plan, out_path, **{k: v for k, v in options.items() if k in params})
    return _named_errors(job, model.path)


def _named_errors(job, path):
    """Drive `job`, re-raising its WorkbenchErrors with the model's file where they lack one
    (a tensor a scheme refuses, a NaN/Inf refusal, a tensor GGUF cannot take)."""
    from workbench.core.errors import context
    with context(path):
        return (yield from job)

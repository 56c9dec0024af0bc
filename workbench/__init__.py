"""Quant Workbench domain layer: loading, statistics, schemes, metrics, plans, export.

Pure Python + numpy/torch/safetensors/gguf. Never imports Qt.

``import workbench as qw`` gives the Python API (workbench.api, docs/api.md): ``qw.open_model``,
``qw.statistics``, ``qw.evaluate_plan``, ``qw.check_plan``, ``qw.measure_sensitivity``,
``qw.allocate_plan`` with a ``qw.Budget``, ``qw.compute_frontier``, ``qw.export_plan``,
``qw.diff_quantizations``, ``qw.convert_gguf``. Its names are loaded on first use: importing
``workbench`` stays cheap (no numpy, torch or numba).
"""

__version__ = "0.1.0"

#: the public API's names (workbench.api.__all__), none of them a submodule's name
_API = frozenset({
    "AUTO", "AUTO_FISHER_SAMPLES", "AUTO_FISHER_SAMPLES_LM", "Allocation", "Budget",
    "Cancelled", "DEFAULT_SCHEMES", "Frontier", "MeasureChoice", "Plan", "Progress", "Rule", "WorkbenchError",
    "allocate_plan", "calibrate", "check_plan", "compute_frontier", "convert_gguf", "demo_model_path",
    "diff_quantizations", "evaluate_plan", "export_formats", "export_plan", "get_scheme",
    "list_schemes", "make_plan", "map_model",
    "measure_sensitivity", "open_model", "parse_schemes", "resolve_measure", "statistics",
    "with_methods",
})


def __getattr__(name):
    if name in _API:
        from workbench import api
        value = getattr(api, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | _API)

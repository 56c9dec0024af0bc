"""Optional dependencies, imported in one place: a missing one is a one-line WorkbenchError
(exit 2) that names the extra to install, never a ModuleNotFoundError (exit 3).

    transformers = require("transformers", "model")
    QuantizationArgs = require("compressed_tensors.quantization", "vllm").QuantizationArgs

Extras (pyproject.toml ``[project.optional-dependencies]``): ``model`` (transformers,
tokenizers), ``vllm`` (compressed-tensors), ``onnx`` (onnx, onnxruntime), ``cluster``
(dask distributed).
"""

from __future__ import annotations

import importlib

from workbench.core.errors import WorkbenchError

# top-level module -> (extra, pip distribution), for the message
EXTRAS = {
    "transformers": ("model", "transformers"),
    "tokenizers": ("model", "tokenizers"),
    "compressed_tensors": ("vllm", "compressed-tensors"),
    "onnx": ("onnx", "onnx"),
    "onnxruntime": ("onnx", "onnxruntime"),
    "distributed": ("cluster", "distributed"),
    "dask": ("cluster", "dask"),
}


def missing_message(module: str, extra: str | None = None, why: str = "") -> str:
    top = module.split(".")[0]
    extra = extra or EXTRAS.get(top, (None, None))[0]
    dist = EXTRAS.get(top, (None, top))[1]
    what = f"the optional package '{dist}' is not installed{f' ({why})' if why else ''}"
    if extra:
        return f"{what}: install the extra: pip install \"quant-workbench[{extra}]\" " \
               f"(from a checkout: pip install -e \".[{extra}]\")"
    return f"{what}: pip install {dist}"


def require(module: str, extra: str | None = None):
    """Import `module` (dotted names allowed); a WorkbenchError naming the extra when it or a
    package it needs is missing or broken (an ImportError while importing it)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        why = ""
        missing = getattr(exc, "name", None)
        if missing and missing.split(".")[0] != module.split(".")[0]:
            why = f"it needs '{missing}'"
        raise WorkbenchError(missing_message(module, extra, why)) from None


def available(module: str) -> bool:
    """Whether `module` imports (no error either way)."""
    try:
        importlib.import_module(module)
        return True
    except ImportError:
        return False


def missing_from(exc: BaseException) -> str | None:
    """The one-line message for an ImportError (anywhere in `exc`'s cause/context chain) of a
    module that belongs to an extra: a library such as transformers failing deep inside
    because one of *its* optional packages is missing. None when none is found."""
    seen = set()
    e = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, ImportError):
            name = getattr(e, "name", None) or ""
            if name.split(".")[0] in EXTRAS:
                return missing_message(name)
        e = e.__cause__ or e.__context__
    return None

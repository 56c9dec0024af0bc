"""Fitted methods kept on disk: a GPTQ fit of a tensor (and an imatrix fit under an MLX
scheme: `keeps_fit`) is made once for a given input and reused by every later `allocate`,
`check`, `export` and app job that asks for the same one.

A fit's key (workbench.core.cache's rule: content, never paths or mtimes) holds everything the
result depends on, and nothing that takes a calibration pass to know, so a hit needs none
(``methods_apply.prepare`` probes the keys first and runs the pass only for a miss):

* the method, its options, the scheme, and the code version (:func:`code_version`: the
  content of the methods, schemes, kernels and statistics-pass source files, numpy's,
  torch's and transformers' versions);
* the weight matrix handed to the method (its bytes: the model's tensor after any fold or an
  exporter's row order) and the tensor's name;
* where the statistics come from (``MethodModel.source``): the model's files (``model_key``),
  the calibration input's content, the samples and the context length, and an imatrix
  file's content: the statistics are a function of these and of the code. Statistics given
  without a source (e.g. ``methods_compare``'s own pass) enter by their bytes (GPTQ: the
  Hessian H) and their count instead.

The entry is the QuantizedTensor as an ``.npz`` (no pickles) holding its key, verified on read
(the cache's checksum, then the key, scheme and shape inside); anything else is a miss and
the method fits again. At most FIT_KEEP entries and FIT_BYTES bytes stay, least recently used
evicted. ``use_cache=False`` (``check --no-cache``, ``export --no-cache``): nothing is read or
written.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import zipfile
from pathlib import Path

import numpy as np

from workbench.core.cache import Cache, file_key, make_key

#: the methods whose fits may be kept (`keeps_fit` says on which schemes): GPTQ's on every
#: scheme; imatrix's on the MLX schemes (its search tries 98 candidates a group: 20-30 s for
#: SmolLM2's Linear weights on 2 busy cores in its numba kernel, besides the calibration pass
#: its statistics need), not on the others, whose searches refit in milliseconds
CACHED_METHODS = ("gptq", "imatrix")
FIT_KEEP = 8192
FIT_BYTES = 8 << 30
FIT_FORMAT = "quant-workbench-method-fit"


def keeps_fit(method_name: str, scheme_name: str) -> bool:
    """Whether a fit of `method_name` under `scheme_name` is kept (CACHED_METHODS)."""
    if method_name == "gptq":
        return True
    if method_name != "imatrix":
        return False
    from workbench.core.errors import WorkbenchError
    from workbench.schemes import get_scheme
    from workbench.schemes.mlx import MLXScheme
    try:
        return isinstance(get_scheme(scheme_name), MLXScheme)
    except WorkbenchError:
        return False


def fit_cache() -> Cache:
    return Cache("method-fits", ".npz", FIT_KEEP, max_bytes=FIT_BYTES)


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """The content of every source file a fit's numbers come from (the methods, the schemes,
    the kernels, the quant helpers), with numpy's and torch's versions."""
    root = Path(__file__).resolve().parents[1]          # the workbench package
    files = [*sorted((root / "quant" / "methods").glob("*.py")),
             *sorted((root / "schemes").rglob("*.py")),
             *sorted(root.parent.joinpath("kernels").glob("*.py")),
             *sorted((root / "quant").glob("*.py")),
             # the statistics pass: the calibration samples, the runner, its hooks
             *[root / "running" / f for f in STATS_SOURCES]]
    return make_key([[f.relative_to(root.parent).as_posix(), file_key(f)] for f in files],
                    ) + f"/np{np.__version__}/torch{_version('torch')}" \
        f"/transformers{_version('transformers')}"


#: the files of workbench/running the calibration statistics come from
STATS_SOURCES = ("calibration.py", "inputs.py", "runner.py", "runner_config.py",
                 "runner_jobs.py", "runner_mapping.py", "runner_passes.py", "methods_apply.py",
                 "imatrix.py", "moe.py")


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(package)
    except PackageNotFoundError:    # pragma: no cover - both are dependencies of the methods
        return None


def _array_hash(a) -> list | None:
    if a is None:
        return None
    a = np.ascontiguousarray(a)
    return [str(a.dtype), list(a.shape), hashlib.sha256(memoryview(a).cast("B")).hexdigest()]


def fit_key(method, scheme_name: str, w: np.ndarray, stats, tensor: str, opts: dict,
            source) -> str:
    """The key of one fit (module doc): by `source` where the statistics have one (`stats`
    is then not read: it may be a callable that makes them), else by the statistics' bytes."""
    if source is not None:
        st = ["source", source]
    else:
        stats = stats() if callable(stats) else stats
        st = ["stats", {f: _array_hash(getattr(stats, f, None))
                        for f in sorted(getattr(method, "needs", ()))}, getattr(stats, "n", None)]
    return make_key([FIT_FORMAT, 2, code_version(), method.name, scheme_name, tensor,
                     sorted((str(k), repr(v)) for k, v in opts.items()), _array_hash(w), st])


#: what :func:`kept_fit` returns for a tensor the method found no statistics for (not the input
#: of a Linear: it is rounded to nearest), remembered so a later probe needs no pass either
NOT_FITTED = "not fitted"


def _dump(qt, key: str) -> bytes | None:
    head = {"format": FIT_FORMAT, "key": key, "scheme": qt.scheme,
            "shape": [int(s) for s in qt.shape], "arrays": sorted(qt.arrays)}
    try:
        head["meta"] = json.loads(json.dumps(qt.meta))     # JSON-able meta only
    except (TypeError, ValueError):
        return None
    buf = io.BytesIO()
    arrays = {f"a{i}": np.ascontiguousarray(qt.arrays[k]) for i, k in enumerate(head["arrays"])}
    if any(a.dtype.hasobject for a in arrays.values()):
        return None
    np.savez(buf, head=np.frombuffer(json.dumps(head).encode(), np.uint8), **arrays)
    return buf.getvalue()


def _load(data: bytes, key: str, scheme_name: str, shape):
    """The QuantizedTensor of an entry, None where it is not this key's (a foreign or damaged
    file that still passed the checksum, e.g. written by another version)."""
    from workbench.schemes.base import QuantizedTensor
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            head = json.loads(bytes(z["head"]).decode())
            if not (isinstance(head, dict) and head.get("format") == FIT_FORMAT
                    and head.get("key") == key and head.get("scheme") == scheme_name
                    and tuple(head.get("shape", ())) == tuple(shape)):
                return None
            if head.get("unfitted") is True and not head["arrays"]:
                return NOT_FITTED
            arrays = {k: np.array(z[f"a{i}"]) for i, k in enumerate(head["arrays"])}
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile):
        return None
    return QuantizedTensor(scheme_name, tuple(shape), arrays, dict(head.get("meta") or {}))


def _read(cache: Cache, key: str, scheme_name: str, shape):
    data = cache.get_bytes(key)
    if data is None:
        return None
    qt = _load(data, key, scheme_name, shape)
    if qt is None:
        cache.remove(key)
    return qt


def kept_fit(method_name: str, w: np.ndarray, scheme_name: str, *, tensor: str, source,
             **opts):
    """The QuantizedTensor :func:`fitted` with this `source` would read from the cache (kept
    and verified), NOT_FITTED where the method found no statistics for the tensor last time,
    None where it would fit: known without the statistics."""
    from workbench.quant.methods.base import get_method
    method = get_method(method_name)
    if not keeps_fit(method.name, scheme_name) or source is None:
        return None
    w = np.ascontiguousarray(np.asarray(w, np.float32))
    key = fit_key(method, scheme_name, w, None, tensor, opts, source)
    return _read(fit_cache(), key, scheme_name, w.shape)


def fitted(method_name: str, w: np.ndarray, scheme_name: str, stats, *, tensor: str,
           source=None, use_cache: bool = True, **opts):
    """``get_method(method_name).quantize(w, scheme_name, stats, tensor=..., **opts)``, read
    from the fit cache when this exact fit was made before (module doc) and stored there once
    made. `source`: what the statistics came from (a JSON-able list; None: only their
    bytes); `stats` may be a callable giving them, called only for a fit that is made."""
    from workbench.quant.methods.base import get_method
    method = get_method(method_name)
    if not use_cache or not keeps_fit(method.name, scheme_name):
        return method.quantize(w, scheme_name, stats() if callable(stats) else stats,
                               tensor=tensor, **opts)
    w = np.ascontiguousarray(np.asarray(w, np.float32))
    key = fit_key(method, scheme_name, w, stats, tensor, opts, source)
    cache = fit_cache()
    shape = w.shape
    qt = _read(cache, key, scheme_name, shape)
    if qt is not None and qt is not NOT_FITTED:
        return qt
    qt = method.quantize(w, scheme_name, stats() if callable(stats) else stats, tensor=tensor,
                         **opts)
    if tuple(qt.shape) == tuple(shape):
        blob = _dump(qt, key)
        if blob is not None:
            with contextlib.suppress(OSError):
                cache.put_bytes(key, blob)
    return qt


def remember_unfitted(method_name: str, w: np.ndarray, scheme_name: str, *, tensor: str,
                      source, **opts) -> None:
    """Keep, under the key of this fit, that the method had no statistics for the tensor (it
    is rounded to nearest): :func:`kept_fit` then answers NOT_FITTED without a pass."""
    from workbench.quant.methods.base import get_method
    method = get_method(method_name)
    if not keeps_fit(method.name, scheme_name) or source is None:
        return
    w = np.ascontiguousarray(np.asarray(w, np.float32))
    key = fit_key(method, scheme_name, w, None, tensor, opts, source)
    head = {"format": FIT_FORMAT, "key": key, "scheme": scheme_name,
            "shape": [int(s) for s in w.shape], "arrays": [], "unfitted": True}
    buf = io.BytesIO()
    np.savez(buf, head=np.frombuffer(json.dumps(head).encode(), np.uint8))
    with contextlib.suppress(OSError):
        fit_cache().put_bytes(key, buf.getvalue())


def calib_source(calib, samples, max_len) -> list:
    """What calibration statistics were collected from, for a key: the calibration file's
    content (default the shipped text), or the given text / token ids themselves."""
    from workbench.running.calibration import DEFAULT_CALIB
    src = DEFAULT_CALIB if calib is None else calib
    is_file = False
    if isinstance(src, (str, Path)):
        with contextlib.suppress(OSError, ValueError):
            is_file = Path(src).is_file()
    if is_file:
        what = ["file", file_key(src)]
    elif isinstance(src, np.ndarray):
        what = ["array", _array_hash(src)]
    else:                   # text, or a list of token ids / texts
        what = ["value", type(src).__name__, make_key([src])]
    return [what, samples, max_len]

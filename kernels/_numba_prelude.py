"""Imported first by every module that defines numba kernels: makes numba's start cheaper.

numba's CPU target, when it first compiles or loads a cached kernel, imports
``numba.np.arraymath``, which checks for BLAS with ``import scipy.linalg.cython_blas``. That
import runs ``scipy/linalg/__init__.py`` first (0.3-0.5 s here: scipy's array-API layer,
numpy.f2py, charset_normalizer, ...) although the kernels never call BLAS. Loading the
``cython_blas`` extension module itself, under its own name, gives numba the very module it
would get, in about a third of the time; ``scipy.linalg`` is imported normally if anything
asks for it later. Any failure here changes nothing (numba then imports scipy.linalg itself).

Loading a kernel from numba's on-disk cache (``cache=True``) first calls the CPU target
context's ``refresh()``, which imports and installs every typing and lowering registry of
numba (unicode, charseq, cffi, linalg, random, polynomial, ...): 0.2-0.3 s of CPU in each
new process, needed to *compile* a function, not to load machine code that is already
compiled. ``_cheaper_cache_loads`` makes a cache load on the CPU target initialize only
numba's runtime (NRT, whose symbols the loaded code links against) and then load. A cache
miss still compiles through numba's compiler, which refreshes the contexts itself; any other
target (CUDA), or a load that fails for any reason, goes through numba's own method
unchanged. The machine code run is the same either way (tests/kernels/test_numba_start.py).

``_package_stamps`` makes every cached kernel of this package stale when *any* module of the
package changes. numba stamps a cache entry with its own source file only, but the kernels
inline helpers from other modules (``cpu_common._acc_row``, ``_encode_row``, ...): an edit of
a helper alone left the kernels that inline it loading their old machine code from the cache
(a developer's ``git pull`` of an editable install, silently). The stamp is a digest of the
contents of every ``*.py`` file of ``kernels/`` (re-read when one's size or mtime changes),
taken by subclasses of numba's own cache locators that apply to this folder only.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

_NAME = "scipy.linalg.cython_blas"


def _preload_cython_blas() -> None:
    if _NAME in sys.modules or "numba.np.arraymath" in sys.modules:
        return
    try:
        spec = importlib.util.find_spec("scipy")     # locates the package, imports nothing
        if spec is None or not spec.submodule_search_locations:
            return
        folder = os.path.join(list(spec.submodule_search_locations)[0], "linalg")
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(folder, "cython_blas" + suffix)
            if os.path.isfile(path):
                break
        else:
            return
        loader = importlib.machinery.ExtensionFileLoader(_NAME, path)
        mspec = importlib.util.spec_from_file_location(_NAME, path, loader=loader)
        module = importlib.util.module_from_spec(mspec)
        sys.modules[_NAME] = module
        try:
            loader.exec_module(module)
        except BaseException:
            sys.modules.pop(_NAME, None)
            raise
    except Exception:  # noqa: BLE001 - an optimisation only: numba imports scipy itself
        return


def _cheaper_cache_loads() -> None:
    try:
        from numba.core import caching
        from numba.core.cpu import CPUContext
        from numba.core.runtime import rtsys
    except Exception:  # noqa: BLE001 - an optimisation only
        return
    cls = caching.Cache
    own = cls.__dict__.get("load_overload")
    if (own is None or getattr(own, "_skips_refresh", False)
            or not hasattr(cls, "_load_overload")
            or not hasattr(cls, "_guard_against_spurious_io_errors")
            or not hasattr(rtsys, "initialize")):
        return  # not the numba this was written for, or done already

    def load_overload(self, sig, target_context):
        if type(target_context) is not CPUContext:
            return own(self, sig, target_context)
        try:
            rtsys.initialize(target_context)
            with self._guard_against_spurious_io_errors():
                return self._load_overload(sig, target_context)
        except Exception:  # noqa: BLE001 - numba's own path: refresh, then load
            return own(self, sig, target_context)

    load_overload._skips_refresh = True
    load_overload.__doc__ = own.__doc__
    load_overload.__wrapped__ = own
    cls.load_overload = load_overload


_HERE = os.path.dirname(os.path.abspath(__file__))


def package_digest(folder: str = _HERE) -> bytes:
    """sha256 over the names and contents of the ``*.py`` files of `folder` (sorted)."""
    names = sorted(n for n in os.listdir(folder) if n.endswith(".py"))
    stats = [os.stat(os.path.join(folder, n)) for n in names]
    key = tuple((n, st.st_mtime_ns, st.st_size) for n, st in zip(names, stats))
    return _digest(folder, key)


def _digest(folder: str, key: tuple) -> bytes:
    hit = _DIGESTS.get((folder, key))
    if hit is None:
        import hashlib
        h = hashlib.sha256()
        for name, _mtime, _size in key:
            with open(os.path.join(folder, name), "rb") as f:
                data = f.read()
            h.update(name.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
        hit = _DIGESTS[(folder, key)] = h.digest()
    return hit


_DIGESTS: dict = {}


def _package_stamps() -> None:
    try:
        from numba.core import caching
        impl = caching.CacheImpl
        originals = list(impl._locator_classes)
    except Exception:  # noqa: BLE001 - not the numba this was written for: its own stamps
        return
    if any(getattr(c, "_whole_package", False) for c in originals):
        return

    def make(orig):
        def from_function(cls, py_func, py_file):
            if os.path.dirname(os.path.abspath(py_file)) != _HERE:
                return None                  # not a kernel of this package: numba's own
            return orig.from_function.__func__(cls, py_func, py_file)

        def get_source_stamp(self):
            return package_digest()
        return type(f"WholePackage{orig.__name__}", (orig,),
                    {"from_function": classmethod(from_function),
                     "get_source_stamp": get_source_stamp, "_whole_package": True,
                     "__doc__": f"{orig.__name__} stamped by every module of kernels/"})
    mine = []
    for orig in originals:
        try:
            mine.append(make(orig))
        except Exception:  # noqa: BLE001 - a locator we cannot wrap: left to numba
            continue
    impl._locator_classes = mine + originals


_preload_cython_blas()
_cheaper_cache_loads()
_package_stamps()

"""Imported first by every module that defines numba kernels: makes numba's start cheaper.

numba's CPU target, when it first compiles or loads a cached kernel, imports
``numba.np.arraymath``, which checks for BLAS with ``import scipy.linalg.cython_blas``. That
import runs ``scipy/linalg/__init__.py`` first (0.3-0.5 s here: scipy's array-API layer,
numpy.f2py, charset_normalizer, ...) although the kernels never call BLAS. Loading the
``cython_blas`` extension module itself, under its own name, gives numba the very module it
would get, in about a third of the time; ``scipy.linalg`` is imported normally if anything
asks for it later. Any failure here changes nothing (numba then imports scipy.linalg itself).
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


_preload_cython_blas()

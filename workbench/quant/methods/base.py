"""The method base class and the registry (one method = one small class, registered once)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from workbench.core.errors import WorkbenchError

METHOD_NAMES = ("rtn", "imatrix", "gptq", "awq")


class Method:
    """Base of every method. Subclasses set ``name``/``needs`` and implement ``_quantize``."""

    name: ClassVar[str] = ""
    #: which LayerStats fields the method reads ("d", "H", "X", "mean_abs")
    needs: ClassVar[tuple[str, ...]] = ()
    description: ClassVar[str] = ""
    # rows of the weight quantized independently given the statistics (a row-local scheme's
    # result for a block of rows equals those rows of the whole result): a tensor too big to
    # hold whole may then be quantized in row chunks (workbench.quant.streaming.measure_rows_method)
    row_local: ClassVar[bool] = False

    _registry: ClassVar[dict[str, type]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("name"):
            Method._registry[cls.name] = cls

    def supports(self, scheme) -> str | None:
        """None when this method can quantize with `scheme`, else why not."""
        return None

    def quantize(self, w: np.ndarray, scheme, stats=None, *, tensor: str | None = None, **opts):
        """QuantizedTensor of the 2-D float32 matrix `w` under `scheme` (a Scheme object)."""
        if isinstance(scheme, str):
            from workbench.schemes import get_scheme
            scheme = get_scheme(scheme)
        w = np.ascontiguousarray(np.asarray(w, dtype=np.float32))
        if w.ndim != 2:
            raise WorkbenchError(f"method {self.name} needs a 2-D weight matrix, got shape "
                                 f"{w.shape}", tensor=tensor)
        why = self.supports(scheme)
        if why:
            raise WorkbenchError(why, tensor=tensor)
        reason = scheme.ineligible_reason(w.shape)
        if reason:
            raise WorkbenchError(reason, tensor=tensor)
        if not np.isfinite(w).all():
            raise WorkbenchError(f"cannot quantize with {scheme.name}: NaN/Inf weights",
                                 tensor=tensor)
        if self.needs:
            if stats is None:
                raise WorkbenchError(f"method {self.name} needs calibration statistics "
                                     "(calib=FILE or imatrix=FILE)", tensor=tensor,
                                     params=("calib", "imatrix"))
            stats.check(w.shape[1], self.needs, tensor)
        scheme.check_range(w, tensor)
        return self._quantize(w, scheme, stats, tensor=tensor, **opts)

    def _quantize(self, w, scheme, stats, *, tensor=None, **opts):
        raise NotImplementedError

    @staticmethod
    def effective_weight(qt, scheme) -> np.ndarray:
        """The weight the model computes with: the dequantized tensor, divided by the AWQ
        input scale when the stored tensor holds W·diag(s) (meta ``awq_scale``; the 1/s is
        folded into the preceding op)."""
        if isinstance(scheme, str):
            from workbench.schemes import get_scheme
            scheme = get_scheme(scheme)
        wq = scheme.dequantize(qt).reshape(qt.matrix_shape).astype(np.float32)
        s = qt.meta.get("awq_scale") if qt.meta else None
        if s is not None:
            wq = wq / np.asarray(s, np.float32)[None, :]
        return wq

    def __repr__(self) -> str:
        return f"<Method {self.name}>"


def _import_all() -> None:
    from workbench.quant.methods import awq, gptq, imatrix, rtn  # noqa: F401  (registers the classes)


def get_method(name: str) -> Method:
    _import_all()
    key = str(name).strip().lower()
    cls = Method._registry.get(key)
    if cls is None:
        raise WorkbenchError(f"unknown method '{name}' (choose from {', '.join(METHOD_NAMES)})")
    return cls()


def list_methods() -> list[str]:
    _import_all()
    return [n for n in METHOD_NAMES if n in Method._registry]


def quantize_with_method(w, scheme, method: str = "rtn", stats=None, *, tensor=None, **opts):
    """Convenience: ``get_method(method).quantize(w, scheme, stats)``."""
    return get_method(method).quantize(w, scheme, stats, tensor=tensor, **opts)

"""Round-to-nearest: the scheme's own quantizer (the baseline every method is measured against)."""

from __future__ import annotations

from .base import Method


class RTN(Method):
    name = "rtn"
    row_local = True
    description = "the scheme's own round-to-nearest quantizer (no calibration)"

    def _quantize(self, w, scheme, stats, *, tensor=None, **opts):
        from ..evaluate import quantize
        return quantize(w, scheme.name, tensor=tensor)

"""Round-to-nearest: the scheme's own quantizer (the baseline every method is measured against)."""

from __future__ import annotations

from workbench.quant.methods.base import Method


class RTN(Method):
    name = "rtn"
    row_local = True
    description = "the scheme's own round-to-nearest quantizer (no calibration)"

    def _quantize(self, w, scheme, stats, *, tensor=None, **opts):
        from workbench.quant.evaluate import quantize
        return quantize(w, scheme.name, tensor=tensor)

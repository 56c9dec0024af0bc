"""GGML block formats (llama.cpp / GGUF), byte-compatible with ggml.

One module per type (or per family of types); each class is the only place its type is
described (``GGMLScheme``). The table of types, weights and bytes per block is in
docs/architecture.md ("GGML types"); the sizes themselves come from gguf.GGML_QUANT_SIZES.

Every scheme stores ``{"blocks": uint8 (rows, cols/QK * bytes_per_block)}``: exactly the
bytes a GGUF file holds for the tensor. Importing this package registers the schemes.
"""

from __future__ import annotations

import importlib
import pkgutil

from workbench.schemes.ggml.common import GGMLScheme

# the registry's order (the allocator's candidate order) is this import order; a module
# added later is imported by the loop below, so a new type needs no line here
from workbench.schemes.ggml import iq1, iq3, iq2, iq4_nl, iq4_xs, mxfp4, nvfp4  # noqa: F401,E402
from workbench.schemes.ggml import legacy, q2_k, q3_k, q4_k, q5_k, q6_k, tq  # noqa: F401,E402

for _m in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_m.name}")

__all__ = ["GGMLScheme", "ggml_scheme_for_type"]


def ggml_scheme_for_type(type_name: str) -> GGMLScheme | None:
    """The scheme for a GGML type name such as 'Q4_K' (None if not implemented here)."""
    from workbench.schemes.registry import ggml_schemes
    return ggml_schemes().get(str(type_name).lower())


def __getattr__(name):
    # GGML_SCHEMES: the registered GGML scheme names (built on first use: the registry is
    # complete only once this package has been imported)
    if name == "GGML_SCHEMES":
        from workbench.schemes.registry import ggml_schemes
        return tuple(ggml_schemes())
    raise AttributeError(name)

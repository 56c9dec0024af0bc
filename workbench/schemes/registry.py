"""The tables other layers need about the quantization types, built from the scheme registry.

A type is described once, by its scheme class (``GGMLScheme``: its GGML type number, block
geometry from ``gguf.GGML_QUANT_SIZES``, runtimes, llama.cpp fallback and kernel entry
points); everything below is read from :func:`workbench.schemes.list_schemes`, once, and the
modules that used to keep hand copies (quant.runtimes, export.llama_tensor_types,
planning.frontier, quant.methods.ggml_weighted, bench.warm) hold these very objects.
"""

from __future__ import annotations

from functools import lru_cache
from types import MappingProxyType

from workbench.schemes.base import Scheme, get_scheme, list_schemes


@lru_cache(maxsize=None)
def ggml_schemes() -> MappingProxyType:
    """Every registered GGML block type: scheme name -> scheme, in registry order."""
    from workbench.schemes.ggml.common import GGMLScheme
    out = {}
    for name in list_schemes():
        s = get_scheme(name)
        if isinstance(s, GGMLScheme):
            out[name] = s
    return MappingProxyType(out)


@lru_cache(maxsize=None)
def ggml_by_number() -> tuple:
    """The GGML scheme names by GGML type number (the benchmarks' row order)."""
    return tuple(sorted(ggml_schemes(), key=lambda n: int(ggml_schemes()[n].ggml_type)))


def _schemes() -> list[Scheme]:
    return [get_scheme(n) for n in list_schemes()]


@lru_cache(maxsize=None)
def llama_schemes() -> frozenset:
    """The scheme names llama.cpp runs (``"llama.cpp"`` in the class's ``runtimes``)."""
    return frozenset(s.name for s in _schemes() if "llama.cpp" in s.runtimes)


@lru_cache(maxsize=None)
def llama_type_names() -> MappingProxyType:
    """scheme name -> its tensor type as llama.cpp spells it (``q4_K``, ``f16``), for every
    scheme llama.cpp runs (F32, F16, BF16 and the GGML block types), in registry order."""
    names = llama_schemes()
    out = {}
    for s in _schemes():
        if s.name in names:
            if not s.llama_type:
                raise TypeError(f"scheme {s.name} runs on llama.cpp but declares no llama_type")
            out[s.name] = s.llama_type
    return MappingProxyType(out)


@lru_cache(maxsize=None)
def llama_types_text(llama_spelling: bool = True) -> str:
    """The llama.cpp tensor types, space-separated for messages: the float types, then the GGML
    types by type number; as llama.cpp spells them (``q4_K``), or as scheme names (``q4_k``)."""
    names = llama_type_names()
    ggml = ggml_schemes()
    floats = [names[n] for n in names if n not in ggml]
    blocks = [n for n in ggml_by_number() if n in names]
    return " ".join(floats + [names[n] if llama_spelling else n for n in blocks])


@lru_cache(maxsize=None)
def block_sizes() -> MappingProxyType:
    """GGML scheme name -> weights per block (gguf.GGML_QUANT_SIZES)."""
    return MappingProxyType({n: s.block_size for n, s in ggml_schemes().items()})


@lru_cache(maxsize=None)
def llama_fallbacks() -> MappingProxyType:
    """GGML scheme name -> llama.cpp's tensor_type_fallback (types that have one)."""
    return MappingProxyType({n: s.llama_fallback for n, s in ggml_schemes().items()
                             if s.llama_fallback})


@lru_cache(maxsize=None)
def low_bit_only() -> MappingProxyType:
    """The types that are default candidates only at low budgets -> their bits/weight."""
    return MappingProxyType({n: s.bits_per_weight() for n, s in ggml_schemes().items()
                             if s.low_bit_only})


@lru_cache(maxsize=None)
def weighted_types() -> tuple:
    """The GGML types with an importance-weighted encoder (quant.methods.ggml_weighted)."""
    return tuple(n for n, s in ggml_schemes().items() if s.weighted_encoder)


def kernel_family(name: str) -> str:
    """The scheme whose compiled kernels `name` uses (itself when it has its own)."""
    return get_scheme(name).kernel_family or get_scheme(name).name

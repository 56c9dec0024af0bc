"""Precision tiers (Qt-free): named columns of the tier board, each with its scheme.

A tensor belongs to the tier whose scheme it is assigned; otherwise to the first tier
(highest precision first) whose `min_bits` its scheme's nominal bits reach. Tensors kept
in their own dtype count with that dtype's bits (BF16 -> 16).
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.errors import WorkbenchError
from workbench.plan import KEEP
from workbench.schemes import get_scheme


@dataclass(frozen=True)
class Tier:
    name: str
    scheme: str
    min_bits: float

    def to_dict(self) -> dict:
        return {"name": self.name, "scheme": self.scheme, "min_bits": self.min_bits}

    @classmethod
    def from_dict(cls, d) -> "Tier":
        if not isinstance(d, dict) or not isinstance(d.get("name"), str) \
                or not isinstance(d.get("scheme"), str):
            raise WorkbenchError("a tier needs a 'name' and a 'scheme'")
        if d["scheme"] != KEEP:
            get_scheme(d["scheme"])
        return cls(d["name"], d["scheme"], float(d.get("min_bits", 0)))


DEFAULT_TIERS: tuple[Tier, ...] = (
    Tier("FP16", "fp16", 16),
    Tier("INT8", "int8-channel", 8),
    Tier("4-bit", "int4-g128", 4),
    Tier("3-bit and less", "int3-g128", 0),
)


def scheme_bits(scheme: str, info=None) -> float:
    """Nominal bits of a scheme; for `keep`, the stored bits of the tensor."""
    if scheme == KEEP:
        return info.bits_per_weight if info is not None else 32.0
    try:
        return float(get_scheme(scheme).nominal_bits)
    except WorkbenchError:
        return 0.0


def tier_index(tiers, scheme: str, info=None) -> int:
    for i, t in enumerate(tiers):
        if t.scheme == scheme:
            return i
    bits = scheme_bits(scheme, info)
    for i, t in enumerate(tiers):
        if bits >= t.min_bits:
            return i
    return len(tiers) - 1


def on_board(info) -> bool:
    """Only weight matrices are cards: vectors and integer tensors are always kept."""
    return info.ndim >= 2 and info.is_float


def tiers_to_list(tiers) -> list[dict]:
    return [t.to_dict() for t in tiers]


def tiers_from_list(data) -> tuple[Tier, ...]:
    if not isinstance(data, list) or not data:
        raise WorkbenchError("'tiers' must be a non-empty list")
    return tuple(Tier.from_dict(d) for d in data)

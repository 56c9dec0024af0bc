"""Precision tiers (Qt-free): named columns of the tier board, each with its scheme.

A tensor belongs to the tier whose scheme it is assigned; otherwise to the tier whose scheme's
bits per weight (exact, scale overhead included) are nearest its own (ties: the higher
precision tier), so an int6-g64 card (6.25 bits/weight) sits with INT8, not with 4-bit.
Tensors kept in their own dtype count with that dtype's bits (BF16 -> 16).

Tiers are a view over the plan: adding, renaming or removing a tier never changes a
tensor's scheme, only the column it shows in. A removed tier's members keep their schemes
and fall to the tier their bits reach (the rule above). A new tier's `min_bits` is its
scheme's nominal bits, clamped between its neighbours' so the order stays highest first.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.core.errors import WorkbenchError
from workbench.api.plans import KEEP
from workbench.api.plans import get_scheme


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


_BPW: dict[str, float] = {}


def scheme_bpw(scheme: str, info=None) -> float:
    """Bits per weight of a scheme including its scale overhead (a 4096x4096 matrix; keep:
    the tensor's stored bits)."""
    if scheme == KEEP:
        return info.bits_per_weight if info is not None else 32.0
    if scheme not in _BPW:
        try:
            _BPW[scheme] = float(get_scheme(scheme).bits_per_weight())
        except WorkbenchError:
            _BPW[scheme] = 0.0
    return _BPW[scheme]


def tier_index(tiers, scheme: str, info=None) -> int:
    """The tier a tensor with `scheme` shows in: its scheme's tier, else the nearest tier in
    bits per weight (ties: the higher precision one)."""
    for i, t in enumerate(tiers):
        if t.scheme == scheme:
            return i
    bits = scheme_bpw(scheme, info)
    best, best_d = len(tiers) - 1, float("inf")
    for i, t in enumerate(tiers):
        d = abs(bits - scheme_bpw(t.scheme, info))
        if d < best_d - 1e-9:
            best, best_d = i, d
    return best


def shown_scheme(tier, schemes) -> str:
    """The one scheme a tier stands for, read by its box, its summary and a drop on it: the
    scheme its members all share, else (mixed, or no members) the tier's own."""
    distinct = set(schemes)
    return next(iter(distinct)) if len(distinct) == 1 else tier.scheme


def tier_mix(tier, schemes) -> str:
    """'' when every member has the tier's scheme; else 'all q4_0' or 'mixed: 3 schemes'."""
    distinct = set(schemes)
    if not distinct or distinct == {tier.scheme}:
        return ""
    if len(distinct) == 1:
        return f"all {distinct.pop()}"
    return f"mixed: {len(distinct)} schemes"


def on_board(info) -> bool:
    """Only weight matrices are cards: vectors and integer tensors are always kept."""
    return info.ndim >= 2 and info.is_float


def tiers_to_list(tiers) -> list[dict]:
    return [t.to_dict() for t in tiers]


def tiers_from_list(data) -> tuple[Tier, ...]:
    if not isinstance(data, list) or not data:
        raise WorkbenchError("'tiers' must be a non-empty list")
    return tuple(Tier.from_dict(d) for d in data)


def name_problem(tiers, name: str, ignore: int | None = None) -> str | None:
    """Why `name` cannot name a tier (empty, or another tier's name); None when it can."""
    name = name.strip()
    if not name:
        return "a tier needs a name"
    for i, t in enumerate(tiers):
        if i != ignore and t.name.casefold() == name.casefold():
            return f"there is already a tier named '{t.name}'"
    return None


def _check_index(tiers, index: int) -> None:
    if not 0 <= index < len(tiers):
        raise WorkbenchError(f"no tier {index} (there are {len(tiers)})")


def insert_tier(tiers, after: int, name: str, scheme: str) -> tuple[Tier, ...]:
    """The tiers with a new one (name, scheme) right after tier `after` (-1: first)."""
    tiers = tuple(tiers)
    if after != -1:
        _check_index(tiers, after)
    problem = name_problem(tiers, name)
    if problem:
        raise WorkbenchError(problem)
    if scheme != KEEP:
        get_scheme(scheme)  # unknown scheme -> WorkbenchError
    bits = scheme_bits(scheme)
    hi = tiers[after].min_bits if after >= 0 else float("inf")
    lo = tiers[after + 1].min_bits if after + 1 < len(tiers) else 0.0
    new = Tier(name.strip(), scheme, float(max(lo, min(hi, bits))))
    return tiers[:after + 1] + (new,) + tiers[after + 1:]


def rename_tier(tiers, index: int, name: str) -> tuple[Tier, ...]:
    tiers = tuple(tiers)
    _check_index(tiers, index)
    problem = name_problem(tiers, name, ignore=index)
    if problem:
        raise WorkbenchError(problem)
    return tuple(Tier(name.strip(), t.scheme, t.min_bits) if i == index else t
                 for i, t in enumerate(tiers))


def remove_tier(tiers, index: int) -> tuple[Tier, ...]:
    """The tiers without tier `index`; the last remaining tier cannot be removed."""
    tiers = tuple(tiers)
    _check_index(tiers, index)
    if len(tiers) == 1:
        raise WorkbenchError(f"'{tiers[0].name}' is the only tier; the board needs at least one")
    # bits below every remaining tier's floor fall to the last tier (tier_index)
    return tiers[:index] + tiers[index + 1:]

"""Choosing a scheme for one tensor: the schemes grouped by family, and every scheme's
bits per weight and error on that tensor with the Pareto points marked.

Headless (the GUI's scheme picker and comparison tab show exactly these numbers; the CLI's
`schemes --tensor NAME [MODEL] [--json]` prints them).
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.quant.plan import KEEP
from workbench.schemes.registry import ggml_schemes

#: display order of the families
FAMILIES = ("Float", "Integer", "GGML legacy", "K-quants", "Codebooks", "MLX")
FAMILY_NOTES = {
    "Float": "IEEE / bfloat / fp8 element formats",
    "Integer": "affine integers: bits x granularity (tensor / channel / group), sym or asym",
    "GGML legacy": "llama.cpp's 32-weight block types",
    "K-quants": "llama.cpp's 256-weight super-block types",
    "Codebooks": "non-uniform value tables (NF4, IQ4_NL, IQ4_XS, MXFP4, NVFP4, ternary, TQ1_0/TQ2_0, "
                 "IQ3, IQ2 and IQ1 lattices)",
    "MLX": "Apple MLX's affine and microscaling modes, as mlx-lm folders store them",
}
#: the non-GGML codebook schemes (a GGML type's family is its scheme class's ``family``)
_CODEBOOK_PREFIX = ("nf4", "mxfp4", "nvfp4", "ternary")


def family_of(scheme: str) -> str:
    """The family a scheme is listed under ("keep" is listed with the floats)."""
    base = scheme.split("@", 1)[0]
    if base == KEEP or base.startswith(("fp", "bf")):
        return "Float"
    if base.startswith("int"):
        return "Integer"
    ggml = ggml_schemes().get(base)
    if ggml is not None:
        return ggml.family
    if base.startswith("mlx-"):
        from workbench.schemes import get_scheme
        return get_scheme(base).family     # the scheme class's (MLX)
    if base.startswith(_CODEBOOK_PREFIX):
        return "Codebooks"
    return "Other"


def grouped(schemes) -> list[tuple[str, list[str]]]:
    """(family, schemes in the given order) for each family present, in FAMILIES order."""
    groups: dict[str, list[str]] = {}
    for s in schemes:
        groups.setdefault(family_of(s), []).append(s)
    order = list(FAMILIES) + sorted(f for f in groups if f not in FAMILIES)
    return [(f, groups[f]) for f in order if f in groups]


def bits_per_weight(scheme: str, info) -> float:
    """Stored bits per weight of `scheme` on this tensor's shape (scales included; keep: the
    tensor's own dtype). A scheme that cannot take the shape: NaN."""
    if scheme == KEEP or not info.is_float:
        return 8.0 * info.nbytes / info.numel if info.numel else 0.0
    from workbench.core.errors import WorkbenchError
    from workbench.schemes import get_scheme
    try:
        s = get_scheme(scheme)
        if s.ineligible_reason(tuple(info.shape)) is not None:
            return float("nan")
        return 8.0 * s.nbytes(tuple(info.shape)) / info.numel
    except (WorkbenchError, NotImplementedError):
        return float("nan")


@dataclass(frozen=True)
class SchemePoint:
    scheme: str
    family: str
    bits_per_weight: float
    sqnr_db: float
    rel_rmse: float
    max_abs_err: float
    bytes: int
    pareto: bool = False

    def to_dict(self) -> dict:
        return {"scheme": self.scheme, "family": self.family,
                "bits_per_weight": self.bits_per_weight, "sqnr_db": self.sqnr_db,
                "rel_rmse": self.rel_rmse, "max_abs_err": self.max_abs_err,
                "bytes": self.bytes, "pareto": self.pareto}


def pareto_front(points) -> set[str]:
    """Schemes not dominated by another: no other point has <= bits/weight and >= SQNR with
    one of them strictly better. `points`: iterables of (scheme, bits_per_weight, sqnr_db)."""
    pts = sorted(((b, -q, s) for s, b, q in points if b == b and q == q))
    front, best = set(), -float("inf")
    for b, negq, s in pts:           # ascending bits; among equal bits, best SQNR first
        q = -negq
        if q > best:
            front.add(s)
            best = q
    return front


def points_from_results(results, info) -> list[SchemePoint]:
    """SchemePoints from TensorResults of one tensor (one per requested scheme)."""
    rows = []
    for r in results:
        bpw = 8.0 * r.bytes / r.params if r.params else bits_per_weight(r.requested, info)
        rows.append((r, bpw))
    front = pareto_front((r.requested, b, r.error.sqnr_db) for r, b in rows)
    return [SchemePoint(r.requested, family_of(r.requested), b, r.error.sqnr_db,
                        r.error.rel_rmse, r.error.max_abs_err, r.bytes, r.requested in front)
            for r, b in rows]


def eligible_schemes(info) -> list[str]:
    """keep plus every registered scheme that can take the tensor's shape (registry order)."""
    from workbench.schemes import get_scheme, list_schemes
    if not info.is_float:
        return [KEEP]
    return [KEEP] + [s for s in list_schemes()
                     if get_scheme(s).ineligible_reason(tuple(info.shape)) is None]


def tensor_points(model, name: str, schemes=None) -> list[SchemePoint]:
    """Evaluate `name` under every scheme (default: every eligible one) and mark the Pareto
    points (cached per tensor and scheme by workbench.quant.evaluate)."""
    from workbench.quant.evaluate import evaluate_tensor
    info = model.info(name)
    schemes = list(schemes) if schemes is not None else eligible_schemes(info)
    return points_from_results([evaluate_tensor(model, name, s) for s in schemes], info)

"""Mixture-of-experts selectors: a plan rule whose ``match`` is ``moe:KIND[.PROJ][@LAYERS]``
addresses a set of MoE tensors by role (workbench.formats.catalog), whatever the file names them.

* KIND: ``experts`` (routed experts), ``shared`` (shared experts) or ``router`` (routers and
  Qwen2-MoE's shared-expert gate; the only way besides an exact name to quantize a router);
* PROJ (experts and shared only): ``gate``, ``up``, ``down`` or ``gate_up`` (transformers' fused
  gate+up tensor); Mixtral's w1 / w3 / w2 are gate / up / down;
* LAYERS: ``@5`` one block, ``@2-7`` an inclusive range; omitted: every block.

``moe:experts.down@5`` is every expert's down projection of layer 5 (``model.layers.5.mlp.
experts.N.down_proj.weight`` for every N, or GGUF ``blk.5.ffn_down_exps.weight``);
``moe:experts`` is every expert of the model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from workbench.formats import catalog
from workbench.core.errors import WorkbenchError

PREFIX = "moe:"
KINDS = {"experts": "expert", "shared": "shared_expert", "router": "router"}
PROJECTIONS = ("gate", "up", "down", "gate_up")
_SELECTOR = re.compile(r"^moe:(experts|shared|router)(?:\.([a-z0-9_]+))?(?:@(\d+)(?:-(\d+))?)?$")


@dataclass(frozen=True)
class Selector:
    role: str                      # catalog role: expert | shared_expert | router
    projection: str | None = None
    first: int | None = None       # block range (inclusive); None: every block
    last: int | None = None

    def matches(self, name: str) -> bool:
        if catalog.moe_role(name) != self.role:
            return False
        if self.projection is not None and catalog.projection(name) != self.projection:
            return False
        if self.first is not None:
            b = catalog.block_index(name)
            if b is None or not self.first <= b <= self.last:
                return False
        return True


def is_selector(match: str) -> bool:
    return match.startswith(PREFIX)


def parse_selector(match: str) -> Selector:
    """The Selector of a ``moe:`` rule, or a WorkbenchError saying what is wrong with it."""
    m = _SELECTOR.match(match.strip())
    if not m:
        raise WorkbenchError(f"bad MoE selector {match[:80]!r}: expected moe:KIND[.PROJ][@N or "
                             "@N-M] with KIND experts|shared|router, PROJ gate|up|down|gate_up "
                             "(e.g. moe:experts.down@5)")
    kind, proj, a, b = m.groups()
    if proj is not None and (proj not in PROJECTIONS or kind == "router"):
        raise WorkbenchError(f"bad MoE selector {match[:80]!r}: "
                             + ("a router has no projection" if kind == "router" else
                                f"unknown projection {proj!r} (gate, up, down, gate_up)"))
    first = int(a) if a is not None else None
    last = int(b) if b is not None else first
    if first is not None and last < first:
        raise WorkbenchError(f"bad MoE selector {match[:80]!r}: layer range {first}-{last} is "
                             "empty")
    return Selector(KINDS[kind], proj, first, last)

"""Calibration batches and the activations between blocks: a Batch (token ids, mask, each
block's captured call arguments) and an ActivationStore that keeps tensors in RAM up to a
shared byte budget and spills them to a temporary folder beyond it.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field

import numpy as np


class _Stop(Exception):
    pass


@dataclass
class Batch:
    ids: np.ndarray
    mask: np.ndarray
    calls: list = field(default_factory=list)   # per block: (positional?, args, kwargs)

    @property
    def keep(self):
        import torch
        return torch.from_numpy(self.mask.reshape(-1) > 0)


class ActivationStore:
    """Per-batch activations (tensors) kept in RAM up to a shared byte budget, spilled to a
    temporary folder (safetensors files) beyond it."""

    def __init__(self, budget: dict | None = None):
        self.budget = budget if budget is not None else new_budget()
        self.items: dict = {}
        self.dir = None

    def put(self, key, t) -> None:
        self.drop(key)
        t = t.detach()
        nbytes = t.numel() * t.element_size()
        if self.budget["used"] + nbytes <= self.budget["limit"]:
            self.items[key] = ("ram", t, nbytes)
            self.budget["used"] += nbytes
            return
        from safetensors.torch import save_file
        if self.dir is None:
            self.dir = tempfile.TemporaryDirectory(prefix="qw-activations-")
        path = os.path.join(self.dir.name, f"{abs(hash(key))}-{len(self.items)}.safetensors")
        save_file({"x": t.to("cpu").contiguous()}, path)
        self.items[key] = ("disk", (path, t.device), nbytes)

    def get(self, key):
        kind, v, _ = self.items[key]
        if kind == "ram":
            return v
        from safetensors.torch import load_file
        path, dev = v
        return load_file(path)["x"].to(dev)

    def drop(self, key) -> None:
        old = self.items.pop(key, None)
        if old is None:
            return
        if old[0] == "ram":
            self.budget["used"] -= old[2]
        else:
            try:
                os.remove(old[1][0])
            except OSError:
                pass

    def close(self) -> None:
        for k in list(self.items):
            self.drop(k)
        if self.dir is not None:
            self.dir.cleanup()
            self.dir = None

    @property
    def spilled(self) -> int:
        return sum(1 for v in self.items.values() if v[0] == "disk")


def new_budget() -> dict:
    mb = float(os.environ.get("QUANT_WORKBENCH_ACTIVATION_MB", "2048"))
    return {"limit": int(mb * (1 << 20)), "used": 0}

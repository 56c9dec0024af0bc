"""Sessions (Qt-free): model path + plan + tier setup + UI state, as versioned JSON.

    {"format": "quant-workbench-session", "version": 1,
     "model": "/path/model.safetensors", "plan": {...plan JSON...},
     "tiers": [{"name": "FP16", "scheme": "fp16", "min_bits": 16}, ...],
     "ui": {"current": "...", "filter": "", "tab": 0, "log": false, ...}}
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from workbench.core.atomic import write_text_atomic
from workbench.core.errors import WorkbenchError
from workbench.api.plans import Plan

from .tiers import DEFAULT_TIERS, tiers_from_list, tiers_to_list

SESSION_FORMAT = "quant-workbench-session"
SESSION_VERSION = 1


@dataclass
class Session:
    model: str
    plan: Plan = field(default_factory=Plan)
    tiers: tuple = DEFAULT_TIERS
    ui: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"format": SESSION_FORMAT, "version": SESSION_VERSION, "model": self.model,
                "plan": self.plan.to_dict(), "tiers": tiers_to_list(self.tiers), "ui": self.ui}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data, path=None) -> "Session":
        if not isinstance(data, dict) or data.get("format") != SESSION_FORMAT:
            raise WorkbenchError("not a session file", path=path)
        if data.get("version") != SESSION_VERSION:
            raise WorkbenchError(f"unsupported session version {data.get('version')!r}", path=path)
        if not isinstance(data.get("model"), str):
            raise WorkbenchError("session has no model path", path=path)
        plan = Plan.from_dict(data.get("plan", {}), path)
        try:
            tiers = tiers_from_list(data["tiers"]) if "tiers" in data else DEFAULT_TIERS
        except WorkbenchError as exc:
            raise WorkbenchError(str(exc), path=path) from None
        ui = data.get("ui") if isinstance(data.get("ui"), dict) else {}
        return cls(data["model"], plan, tiers, ui)

    @classmethod
    def load(cls, path) -> "Session":
        p = Path(path)
        try:
            from workbench.core.limits import MAX_JSON_BYTES, loads, read_sidecar
            if not p.exists():
                raise FileNotFoundError(str(p))
            # its size before any byte is read, a regular file (not a FIFO)
            data = loads(read_sidecar(p, "session JSON", MAX_JSON_BYTES), str(p), "session JSON")
        except FileNotFoundError:
            raise WorkbenchError("session file not found", path=str(p)) from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise WorkbenchError(f"cannot read session ({exc})", path=str(p)) from None
        return cls.from_dict(data, str(p))

    def save(self, path) -> None:
        write_text_atomic(path, self.to_json())


def is_session_file(path) -> bool:
    try:
        with open(path, encoding="utf-8") as fh:
            head = fh.read(4096)
    except (OSError, UnicodeDecodeError):
        return False
    return SESSION_FORMAT in head

"""python -m tests.fuzz --minutes N [--seed S] [--area A ...]"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .cases import AREAS
from .runner import fuzz


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fuzz")
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--area", action="append", choices=AREAS)
    p.add_argument("--save", default="fuzz-failures", help="folder for failing cases")
    p.add_argument("--json", default=None, help="write the tallies per area to this file")
    a = p.parse_args()
    tallies = fuzz(a.minutes * 60, a.seed, tuple(a.area or AREAS), Path(a.save),
                   log=lambda s: print(s, file=sys.stderr))
    print(f"{'area':<12} {'tried':>7} {'correct':>8} {'errors':>7} {'failures':>9}  "
          f"{'seconds':>7}  failure kinds")
    for area, t in tallies.items():
        d = t.to_dict()
        print(f"{area:<12} {d['tried']:>7} {d['correct_loads']:>8} {d['clean_errors']:>7} "
              f"{d['failures']:>9}  {d['seconds']:>7}  {d['failure_kinds'] or ''}")
    if a.json:
        Path(a.json).write_text(json.dumps({k: t.to_dict() for k, t in tallies.items()},
                                           indent=2))
    total = {k: sum(t.to_dict()[k] for t in tallies.values())
             for k in ("tried", "correct_loads", "clean_errors", "failures")}
    print(json.dumps(total))
    return 1 if total["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())

"""What the fuzz worker does with the api-args kind (tests/fuzz/cases_api.py): the function is
called on the demo model with its baseline arguments and the case's replacements. A result is
a correct exit; a WorkbenchError (an ArgumentError naming a replaced parameter, or another
clean refusal) or a TypeError / ValueError whose message names a replaced parameter is a clean
refusal; anything else is a finding: a bare exception, an ArgumentError that blames a parameter
the case did not touch, a file written outside the case's folder.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from workbench.core.errors import WorkbenchError

_CACHE: dict = {}


def Finding(message: str) -> Exception:
    from .hostile import Finding as F
    return F(message)


def _demo():
    if "demo" not in _CACHE:
        import workbench as qw
        _CACHE["demo"] = qw.open_model()
    return _CACHE["demo"]


def _decode(v: dict, param: str, d: Path):
    import numpy as np

    import workbench as qw
    tag = v["$"]
    simple = {"int": lambda: v["v"], "float": lambda: float(v["v"]), "nan": lambda: math.nan,
              "inf": lambda: math.inf, "-inf": lambda: -math.inf, "str": lambda: v["v"],
              "none": lambda: None, "bool": lambda: v["v"], "list": lambda: list(v["v"]),
              "tuple": lambda: tuple(tuple(x) if isinstance(x, list) else x for x in v["v"]),
              "dict": lambda: {str(i): x for i, x in enumerate(v["v"])},
              "set": lambda: {str(x) for x in v["v"]},
              "np.int64": lambda: np.int64(v["v"]), "np.float32": lambda: np.float32(v["v"]),
              "np.bool_": lambda: np.bool_(v["v"]), "np.array": lambda: np.array([v["v"]] * 2),
              "object": object, "bytes": lambda: b"q8_0",
              "model": _demo, "plan": lambda: qw.make_plan("q8_0"),
              "budget": lambda: qw.Budget.bits_per_weight(6.0),
              "path-object": lambda: d / "nothing-here"}
    if tag == "out":     # a path the call may write: inside the case's folder only
        return str(d / v["v"]) if v["v"] not in ("", "x\x00y") else v["v"]
    if tag == "callable":
        if param in ("driver", "kld_driver"):
            from workbench.core.progress import run
            return lambda job: run(job)
        return lambda *a, **k: None
    return simple[tag]()


def _baseline(fn: str, d: Path):
    import workbench as qw
    from .hostile_cli import _tiny_gguf
    m = _demo()
    plan = d / "a.json"
    qw.make_plan("q8_0").save(str(plan))
    shutil.copyfile(plan, d / "b.json")
    first = next(iter(m.tensors))
    calib = d / "calib.txt"    # short, so that samples=None (all of it) stays a quick check
    calib.write_text("The quick brown fox.\nA second line of text.\nAnd a third one.\n")
    table = {
        "open_model": ((), {"path": qw.demo_model_path()}),
        "statistics": ((m,), {"names": [first]}),
        "make_plan": ((), {"scheme": "q8_0"}),
        "with_methods": ((m, qw.make_plan("q8_0")), {}),
        "evaluate_plan": ((m, "q8_0"), {}),
        "check_plan": ((m, "q8_0"), {"samples": 2, "scoring": "lines", "calib": str(calib)}),
        "export_plan": ((m, "q8_0", "plan", str(d / "p.json")), {}),
        "parse_schemes": (("q8_0,q4_0",), {}),
        "list_schemes": ((), {}),
        "get_scheme": (("q8_0",), {}),
        "resolve_measure": ((m,), {"measure": "weight"}),
        "measure_sensitivity": ((m,), {"schemes": "q8_0,q4_0", "measure": "weight"}),
        "allocate_plan": ((m, qw.Budget.bits_per_weight(6.0)),
                          {"schemes": "q8_0,q4_0", "measure": "weight", "methods": "rtn"}),
        "compute_frontier": ((m,), {"schemes": "q8_0,q4_0", "measure": "weight",
                                    "recipes": [], "points": 2}),
        "diff_quantizations": ((str(plan), str(d / "b.json")), {"source": m, "check": False}),
        "map_model": ((m,), {"plan": "q8_0", "overlay": "bits"}),
        "convert_gguf": ((), {"source": str(_tiny_gguf()), "to": "gguf",
                              "output": str(d / "c.gguf")}),
        "Budget.bits_per_weight": ((), {"value": 4.5}),
        "Budget.tensor_bytes": ((), {"value": 10 ** 6}),
        "Budget.file_bytes": ((), {"value": 10 ** 6}),
        "Budget.of_file": ((), {"path": str(_tiny_gguf())}),
    }
    args, kwargs = table[fn]
    if fn.startswith("Budget."):
        call = getattr(qw.Budget, fn.split(".", 1)[1])
    else:
        call = getattr(qw, fn)
    return call, list(args), dict(kwargs)


def exercise_api(path: str) -> None:
    import inspect
    spec = json.loads(Path(path).read_text())
    d = Path(path).parent
    call, args, kwargs = _baseline(spec["fn"], d)
    names = list(inspect.signature(call).parameters)
    replaced = set(spec["set"])
    for p, v in spec["set"].items():
        value = _decode(v, p, d)
        i = names.index(p)
        if i < len(args):
            args[i] = value
        else:
            kwargs[p] = value
    before = set(Path(".").iterdir())
    try:
        call(*args, **kwargs)
    except WorkbenchError as exc:
        from workbench.core.checks import ArgumentError
        if isinstance(exc, ArgumentError) and exc.param not in replaced:
            raise Finding(f"{spec['fn']}: the refusal names {exc.param!r}, but the case "
                          f"replaced {sorted(replaced)}: {exc}") from None
        raise
    except (TypeError, ValueError) as exc:
        msg = str(exc)
        if not any(msg.startswith(p) or f"{p!r}" in msg or f" {p} " in msg for p in replaced):
            raise
        raise WorkbenchError(f"{type(exc).__name__}: {msg}") from None
    finally:
        after = set(Path(".").iterdir())
        if after - before:
            raise Finding(f"{spec['fn']} wrote {sorted(map(str, after - before))} outside the "
                          "case's folder")


EXERCISES = {"api-args": exercise_api}

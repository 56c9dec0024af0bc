"""A fuzz worker: reads `area<TAB>path` lines, exercises the loader of that area on the file,
answers one JSON line per case. Runs under a memory limit set after its own imports."""

from __future__ import annotations

import json
import resource
import sys
import traceback

import numpy as np


def exercise(area: str, path: str) -> None:
    from workbench.core.errors import WorkbenchError
    from .hostile import EXERCISES
    if area in EXERCISES:
        EXERCISES[area](path)
        return
    if area == "plan":
        from workbench.quant.plan import Plan
        Plan.load(path)
        return
    if area == "session":
        from app.session import Session
        Session.load(path)
        return
    from workbench.quant.evaluate import evaluate_tensor
    from workbench.formats.loaders import open_model
    from workbench.core.progress import run
    from workbench.quant.stats import tensor_stats
    m = open_model(path)
    for name in list(m.tensors)[:16]:
        run(tensor_stats(m, name))
        info = m.info(name)
        if info.is_float and info.ndim == 2:
            try:
                evaluate_tensor(m, name, "q8_0", cache=None)
            except WorkbenchError:
                pass
    json.dumps([str(n) for n in m.tensors], ensure_ascii=True)
    print("\n".join(m.tensors), file=open("/dev/null", "w", errors="backslashreplace"))


def main() -> None:
    from workbench.core.errors import WorkbenchError
    import app.session  # noqa: F401 - imported before the limit (Qt-free)
    import torch  # noqa: F401
    import workbench.formats.loaders  # noqa: F401
    import workbench.quant.stats  # noqa: F401
    import workbench.quant.evaluate  # noqa: F401
    from . import hostile  # noqa: F401
    try:   # the runnable-model commands' imports, paid once (not per case)
        import tokenizers  # noqa: F401
        import transformers  # noqa: F401
        import workbench.running.runner  # noqa: F401
    except ImportError:
        pass
    import workbench.running.calibration  # noqa: F401
    import workbench.export  # noqa: F401
    import workbench.running.imatrix  # noqa: F401
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 30
    try:
        import psutil
        base = psutil.Process().memory_info().vms
    except ImportError:
        base = 4 << 30
    resource.setrlimit(resource.RLIMIT_AS, (base + limit, base + limit))
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        area, path = line.rstrip("\n").split("\t", 1)
        try:
            exercise(area, path)
            out = {"result": "ok"}
        except WorkbenchError as exc:
            msg = str(exc)
            out = {"result": "error", "message": msg[:300]}
            if "\n" in msg:
                out = {"result": "fail", "kind": "multi-line error", "message": msg[:500]}
        except hostile.Finding as exc:
            out = {"result": "fail", "kind": "finding", "message": str(exc)[:800]}
        except MemoryError:
            out = {"result": "fail", "kind": "memory", "message": traceback.format_exc()[-800:]}
        except RecursionError:
            out = {"result": "fail", "kind": "recursion", "message": traceback.format_exc()[-800:]}
        except Exception as exc:  # noqa: BLE001 - any other exception is what we look for
            out = {"result": "fail", "kind": f"traceback {type(exc).__name__}",
                   "message": traceback.format_exc()[-1500:]}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()

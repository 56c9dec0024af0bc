"""`import workbench as qw`: cheap to import, every API name reachable and documented, none
shadowed by a submodule, progress and cancelling, and the budgets as objects."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_import_stays_cheap():
    code = ("import sys, workbench as qw; qw.Budget; qw.allocate_plan; "
            "print(sorted(m for m in ('numpy', 'torch', 'numba', 'transformers', 'PySide6') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]"


def test_names_are_the_api_and_no_submodule():
    import workbench
    from workbench import api
    assert set(api.__all__) == set(workbench._API)
    submodules = {p.stem for p in (ROOT / "workbench").iterdir()
                  if p.suffix == ".py" or (p / "__init__.py").is_file()}
    assert not set(api.__all__) & submodules
    for name in api.__all__:
        obj = getattr(workbench, name)
        assert obj is getattr(api, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            assert obj.__doc__, name


def test_progress_and_cancel(demo_model_path):
    import workbench as qw
    model = qw.open_model(demo_model_path)
    seen = []
    stats = qw.statistics(model, progress=seen.append)
    assert len(stats) == len(model.tensors) and seen and seen[-1].fraction == 1.0
    calls = []
    with pytest.raises(qw.Cancelled):
        qw.evaluate_plan(model, "q4_0", cancel=lambda: calls.append(1) or len(calls) > 2)
    assert len(calls) == 3


def test_budgets_and_plans(demo_model_path, tmp_path):
    import workbench as qw
    model = qw.open_model()          # the bundled demo model
    assert Path(model.path) == demo_model_path
    with pytest.raises(qw.WorkbenchError, match="value is 0: give a finite number above 0 and "
                                                "at most 1024"):
        qw.Budget.bits_per_weight(0)
    with pytest.raises(qw.WorkbenchError, match="over is 'every': choose one of all, linear"):
        qw.Budget.bits_per_weight(4, over="every")
    plan = qw.make_plan("q4_k", rules=[("re:.*down_proj.*", "q6_k")])
    assert plan.default == "q4_k" and plan.rules[0].scheme == "q6_k"
    a = qw.allocate_plan(model, qw.Budget.bits_per_weight(5.0), measure="weight",
                         schemes="q4_0,q8_0", methods="rtn", output=tmp_path / "p.json")
    assert a.evaluation.totals.bits_per_weight <= 5.0 and a.measure_reason == "given"
    assert qw.make_plan(path=tmp_path / "p.json").to_dict() == a.plan.to_dict()
    d = a.to_dict(str(tmp_path / "p.json"))
    assert d["candidates"] == ["q4_0", "q8_0"] and d["methods_weighed"] == ["rtn"]
    # the same document `allocate --json` prints, for the same flags
    from workbench.cli import main
    import io
    import json
    from contextlib import redirect_stdout
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["allocate", str(demo_model_path), "--budget-bpw", "5", "--measure",
                     "weight", "--schemes", "q4_0,q8_0", "--methods", "rtn", "-o",
                     str(tmp_path / "q.json"), "--json"]) == 0
    cli = json.loads(buf.getvalue())
    for k in ("budget_bytes", "bytes", "bits_per_weight", "predicted", "schemes", "methods",
              "measure", "measure_reason", "accounting"):
        assert cli[k] == d[k], k
    assert list(cli) == list(d)


def test_no_domain_function_takes_the_command_line():
    """Below the CLI (workbench/ outside cli/ and the bench/ entry points) no module imports
    workbench.cli, and no function takes argparse's parsed `args` (a parameter named args
    read as a namespace), except a module's own `main(argv)` that parses them itself."""
    import ast
    bad = []
    for path in sorted((ROOT / "workbench").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(("workbench/cli/", "workbench/bench/")):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                mod = "." * node.level + (node.module or "")
                if mod.lstrip(".").split(".")[0] == "cli" or mod.startswith("workbench.cli"):
                    bad.append(f"{rel}:{node.lineno} imports {mod}")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = [a.arg for a in node.args.posonlyargs + node.args.args
                         + node.args.kwonlyargs]
                # a parameter `args` read as a namespace (args.flag; a dict's .get is not)
                flags = {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
                         and isinstance(n.value, ast.Name) and n.value.id == "args"}
                if "args" in names and flags - {"get", "items", "keys", "values",
                                                "model_dump"}:
                    bad.append(f"{rel}:{node.lineno} {node.name}(args): {sorted(flags)}")
    assert bad == []

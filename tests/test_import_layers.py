"""The packages' imports read one way (docs/architecture.md): import-linter's contracts in
pyproject.toml hold for the sources, and an import that runs the wrong way breaks them.

The contracts are checked by `lint-imports` as CI runs it. The second test copies the sources,
adds one import that runs the wrong way (the core reaching into planning, one export format
into another, the cluster into the model runner, the app into a domain internal instead of
workbench.api) or a Qt import in the domain, and shows that
the same command then fails and names the import."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "workbench", "kernels")


def lint(cwd: Path) -> subprocess.CompletedProcess:
    """`lint-imports` on the sources under `cwd` (its pyproject.toml, its packages first on the
    path, no cache)."""
    env = dict(os.environ, PYTHONPATH=str(cwd))
    code = "import sys; from importlinter.cli import lint_imports_command; lint_imports_command()"
    return subprocess.run([sys.executable, "-c", code, "--no-cache"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def copy_sources(dst: Path) -> None:
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, dst / pkg,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.nbi", "*.nbc"))
    shutil.copy(ROOT / "pyproject.toml", dst / "pyproject.toml")


def test_the_layers_hold():
    r = lint(ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout
    # every package of the domain is a layer of the contract: none is left out of the check
    toml = (ROOT / "pyproject.toml").read_text()
    for pkg in sorted(p.name for p in (ROOT / "workbench").iterdir()
                      if p.is_dir() and (p / "__init__.py").exists()):
        assert f'"workbench.{pkg}' in toml or f": workbench.{pkg}" in toml, pkg
    # and no module of the domain sits beside the packages (the API is one: workbench/api/)
    loose = sorted(p.name for p in (ROOT / "workbench").glob("*.py"))
    assert loose == ["__init__.py"], loose


@pytest.mark.parametrize("file, line, message", [
    ("workbench/core/errors.py", "from workbench.planning import allocate  # upward",
     "workbench.core is not allowed to import workbench.planning"),
    ("workbench/quant/evaluate.py", "from workbench.jobs import cluster  # upward",
     "workbench.quant is not allowed to import workbench.jobs"),
    ("workbench/formats/model.py", "import PySide6  # Qt in the domain",
     "workbench.formats.model -> PySide6"),
    ("workbench/export/onnx_format.py", "from workbench.export import gguf_file  # sideways",
     "workbench.export.onnx_format is not allowed to import workbench.export.gguf_file"),
    ("workbench/jobs/cluster.py", "from workbench.running import runner  # sideways",
     "workbench.jobs is not allowed to import workbench.running"),
    ("app/tiers.py", "from workbench.schemes import get_scheme  # a domain internal",
     "app is not allowed to import workbench.schemes"),
    ("app/plots/panel.py", "from workbench.quant.evaluate import evaluate  # a domain internal",
     "app.plots.panel -> workbench.quant.evaluate"),
])
def test_a_wrong_way_import_breaks_the_contract(tmp_path, file, line, message):
    copy_sources(tmp_path)
    target = tmp_path / file
    target.write_text(target.read_text() + "\n" + line + "\n")
    r = lint(tmp_path)
    assert r.returncode != 0
    assert " broken" in r.stdout and "0 broken" not in r.stdout, r.stdout[-3000:]
    assert message in " ".join(r.stdout.split()), r.stdout[-3000:]

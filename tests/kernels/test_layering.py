"""The layers read top to bottom: ``kernels/`` imports nothing from ``workbench`` (or Qt), and
each scheme declares its kernel layout as data."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from kernels.spec import Spec, make_spec
from workbench.quant.accel import spec_for
from workbench.schemes import get_scheme, list_schemes

ROOT = Path(__file__).resolve().parents[2]


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_kernels_import_nothing_from_workbench_or_qt():
    files = sorted((ROOT / "kernels").glob("*.py"))
    assert len(files) >= 10
    for f in files:
        bad = _imports(f) & {"workbench", "app", "PySide6", "pyqtgraph"}
        assert not bad, f"{f.name} imports {bad}"


def test_importing_every_kernel_module_loads_no_workbench_module():
    mods = [f"kernels.{f.stem}" for f in sorted((ROOT / "kernels").glob("*.py"))
            if f.stem not in ("__init__", "cuda_kernels")]
    code = ("import importlib, sys\n"
            f"for m in {mods!r}: importlib.import_module(m)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('workbench', 'app')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_every_scheme_with_a_kernel_declares_it_as_data():
    seen = set()
    for name in list_schemes():
        s = get_scheme(name)
        layout = s.kernel_layout()
        spec = spec_for(s)
        if layout is None:
            assert spec is None
            continue
        assert isinstance(layout, dict) and layout["family"] in ("affine", "u16", "f32", "ggml", "mlx")
        rebuilt = make_spec(dict(layout))
        assert isinstance(spec, Spec) and rebuilt.family == spec.family
        assert (rebuilt.quant, rebuilt.bits, rebuilt.gran, rebuilt.ggml_name) == \
            (spec.quant, spec.bits, spec.gran, spec.ggml_name)
        seen.add(spec.family)
    assert seen == {"affine", "u16", "f32", "ggml", "mlx"}
    assert spec_for("int4-g128").gran == 128 and spec_for("int4-g128").scale_f16
    assert spec_for("int8-channel").gran == "row" and not spec_for("int8-channel").scale_f16
    assert spec_for("q4_k").ggml_name == "Q4_K"
    assert make_spec({"family": "ggml", "ggml_name": "Q9_Z"}) is None
    # a GGML type number no block decoder covers: no spec (the numpy reference), never a
    # kernel that leaves the output unwritten
    assert make_spec(dict(get_scheme("q4_k").kernel_layout(), ggml_type=9999)) is None

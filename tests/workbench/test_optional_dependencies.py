"""A missing optional package (the vllm, model or onnx extras) is one line naming the extra to
install, exit 2, whether the command imports it itself or a library it calls does."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.core.errors import WorkbenchError

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "resources" / "demo_model"
PROGRESS = re.compile(r"^[\w-]+: +\d+\.\d% .*\(\d+m\d+s elapsed, ETA [^)]*\)$")


MISSING = """
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None
from workbench.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("modules,argv,extra", [
    ("compressed_tensors,compressed_tensors.quantization",
     ["export", str(DEMO), "--scheme", "int4-g32", "--format", "compressed-tensors", "-o",
      "{tmp}/ct"], "[vllm]"),
    ("transformers", ["check", str(DEMO), "--scheme", "q8_0"], "[model]"),
    ("tokenizers", ["calibrate", str(DEMO), "-o", "{tmp}/im.gguf"], "[model]"),
])
def test_missing_optional_dependency_is_one_line_exit_2(tmp_path, modules, argv, extra):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", MISSING, modules,
                        *[a.format(tmp=tmp_path) for a in argv]], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 2, r.stderr[-1500:]
    # one line, after whatever progress lines a slow start printed (a busy machine prints one)
    *before, line = r.stderr.strip().split("\n")
    assert all(PROGRESS.match(b) for b in before), r.stderr
    assert extra in line and "not installed" in line


def test_require_and_missing_from():
    from workbench.core.optional import missing_from, require
    assert require("json").dumps([1]) == "[1]"
    with pytest.raises(WorkbenchError, match=r"quant-workbench\[onnx\]"):
        require("onnx_not_here_for_test", "onnx")
    try:
        try:
            raise ModuleNotFoundError("No module named 'tokenizers'", name="tokenizers")
        except ImportError as inner:
            raise ModuleNotFoundError("Could not import module 'X'") from inner
    except ImportError as exc:
        assert "[model]" in missing_from(exc)
    assert missing_from(ImportError("other", name="zzz")) is None

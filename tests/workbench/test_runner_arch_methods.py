"""The methods on the tiny models of every architecture (tests/tiny_archs.py): imatrix / GPTQ /
AWQ, their statistics from the layer-by-layer pass (experts' from their routed tokens), run
through `check --method` and give outputs at least about as close as round-to-nearest. (Its own
file, apart from test_runner_archs.py: under pytest-xdist's --dist loadfile the two run on two
workers.)"""

import json

import pytest

pytest.importorskip("transformers")

from tests.tiny_archs import ARCHS, ENCODERS  # noqa: E402
from workbench.cli import main  # noqa: E402

pytestmark = pytest.mark.slow      # minutes in all: started first under pytest-xdist (conftest)

#: lines of the shipped calibration text the methods are fitted on and `check` scores (the
#: whole text, 298 lines: the four checks of 4 of the archs took 152 s of CPU, 87 s on 64 lines)
CALIB_LINES = 64


@pytest.fixture(scope="module")
def calib(tmp_path_factory):
    from workbench.running.calibration import DEFAULT_CALIB
    path = tmp_path_factory.mktemp("calib") / "calib.txt"
    path.write_text("\n".join(DEFAULT_CALIB.read_text().splitlines()[:CALIB_LINES]) + "\n")
    return path


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_methods_run(tiny_arch, arch, calib, capsys):
    """(GPT-2's Conv1D weights, stored (in, out), are rounded to nearest with a note.)"""
    folder = str(tiny_arch(arch))
    args = [folder, "--scheme", "int4-g128", "--calib", str(calib), "--samples", "3", "--json"]
    assert main(["check", *args, "--method", "rtn"]) == 0
    rtn = json.loads(capsys.readouterr().out)
    for method in ("imatrix", "gptq", "awq"):
        assert main(["check", *args, "--method", method]) == 0
        got = json.loads(capsys.readouterr().out)
        if arch in ENCODERS:
            assert got["cosine_mean"] > 0.9 and got["cosine_mean"] >= rtn["cosine_mean"] - 0.02
        else:
            assert 0 < got["kl_mean"] < 1.5 * rtn["kl_mean"], method

"""The fit cache (workbench.running.method_fits): a GPTQ fit is made once for the same model,
tensor, scheme, method and calibration input and read back by later checks and exports
(byte-identical output); any edited input misses; a damaged entry is not served;
``--no-cache`` / ``use_cache=False`` fits again and writes nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from workbench.cli import main
from workbench.core import cache as C
from workbench.core.progress import run
from workbench.formats.loaders import open_model
from workbench.quant.methods.gptq import GPTQ
from workbench.quant.plan import Plan

ROOT = Path(__file__).resolve().parents[2]
DEMO_DIR = ROOT / "resources" / "demo_model"
N = "model.layers.1.mlp.down_proj.weight"


@pytest.fixture(autouse=True)
def caches(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    C._MEMO.clear()
    return tmp_path


def _counted(monkeypatch, method_class) -> list:
    """The number of fits `method_class` makes (its _quantize called), as a one-item list."""
    count = [0]
    real = method_class._quantize

    def counted(self, *a, **k):
        count[0] += 1
        return real(self, *a, **k)
    monkeypatch.setattr(method_class, "_quantize", counted)
    return count


@pytest.fixture
def fits(monkeypatch):
    """The number of GPTQ fits made, as a one-item list."""
    return _counted(monkeypatch, GPTQ)


def _calib(tmp_path, lines=slice(0, 24, 2), name="calib.txt"):
    text = [ln for ln in (ROOT / "resources" / "calibration.txt").read_text().splitlines()
            if ln.strip()]
    p = tmp_path / name
    p.write_text("\n".join(text[lines]) + "\n")
    return p


def _fit(model_path, calib, scheme="q4_k", use_cache=True, tensor=N):
    from workbench.running.methods_apply import prepare
    model = open_model(str(model_path))
    mm = run(prepare(model, Plan(scheme, method="gptq"), calib=str(calib),
                     use_cache=use_cache))
    return mm.quantize_tensor(tensor, mm.read_matrix(tensor), scheme)


def _entries(tmp_path):
    return sorted((tmp_path / "xdg" / "quant-workbench" / "method-fits").glob("*.npz"))


def test_export_and_check_fit_once_then_reuse(tmp_path, fits, capsys):
    calib = _calib(tmp_path)
    args = [str(DEMO_DIR), "--scheme", "q4_k", "--method", "gptq", "--calib", str(calib)]
    assert main(["export", *args, "--format", "gguf", "-o", str(tmp_path / "a.gguf")]) == 0
    first = fits[0]
    assert first > 0
    # one entry per fit, and one for the word embeddings: no statistics (not a Linear input)
    assert len(_entries(tmp_path)) == first + 1
    # a second export and a check of the same plan: no fit, the same bytes
    assert main(["export", *args, "--format", "gguf", "-o", str(tmp_path / "b.gguf")]) == 0
    assert fits[0] == first
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()
    # --no-cache fits every tensor again, writes nothing new, and gives the same file
    assert main(["export", *args, "--format", "gguf", "-o", str(tmp_path / "c.gguf"),
                 "--no-cache"]) == 0
    assert fits[0] == 2 * first
    assert (tmp_path / "c.gguf").read_bytes() == (tmp_path / "a.gguf").read_bytes()
    assert len(_entries(tmp_path)) == first + 1
    # check (target any, not llama.cpp's rules) fits only what the exports did not ask for
    capsys.readouterr()
    assert main(["check", *args, "--json"]) == 0
    cached = _figures(capsys.readouterr().out)
    new = fits[0] - 2 * first
    assert new < first
    before = fits[0]
    assert main(["check", *args, "--json", "--no-cache"]) == 0
    assert _figures(capsys.readouterr().out) == cached          # the same figures
    assert fits[0] - before > new                     # every tensor fitted again


def _figures(out: str):
    """check --json's figures, without its timings and the KLD cache's state."""
    import json

    def strip(d):
        if isinstance(d, dict):
            return {k: strip(v) for k, v in d.items() if k not in ("seconds", "cache")}
        return [strip(v) for v in d] if isinstance(d, list) else d
    return strip(json.loads(out))


def test_edited_inputs_miss(tmp_path, fits):
    calib = _calib(tmp_path)
    base = _fit(DEMO_DIR, calib)
    assert fits[0] == 1
    np.testing.assert_array_equal(_fit(DEMO_DIR, calib).arrays["blocks"], base.arrays["blocks"])
    assert fits[0] == 1
    # another calibration text (other lines), another scheme, another tensor: fitted
    _fit(DEMO_DIR, _calib(tmp_path, slice(1, 25, 2), "other.txt"))
    assert fits[0] == 2
    _fit(DEMO_DIR, calib, scheme="q4_0")
    assert fits[0] == 3
    _fit(DEMO_DIR, calib, tensor="model.layers.0.mlp.down_proj.weight")
    assert fits[0] == 4
    # the same calibration text in another file: the same input, a hit
    shutil.copy(calib, tmp_path / "copy.txt")
    _fit(DEMO_DIR, tmp_path / "copy.txt")
    assert fits[0] == 4
    # an edited model (one tensor's values negated, size and mtime kept): fitted again
    edited = tmp_path / "edited"
    shutil.copytree(DEMO_DIR, edited)
    from tests.workbench.test_caches import _edit_middle_keeping_size_and_mtime
    _edit_middle_keeping_size_and_mtime(edited / "model.safetensors")
    _fit(edited, calib)
    assert fits[0] == 5
    # the original still hits
    _fit(DEMO_DIR, calib)
    assert fits[0] == 5


def test_damaged_entry_is_not_served(tmp_path, fits):
    calib = _calib(tmp_path)
    base = _fit(DEMO_DIR, calib)
    (entry,) = _entries(tmp_path)
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0xFF
    entry.write_bytes(bytes(data))
    again = _fit(DEMO_DIR, calib)
    assert fits[0] == 2          # fitted again, not read
    np.testing.assert_array_equal(again.arrays["blocks"], base.arrays["blocks"])
    # a payload under the right name with a matching record but another fit's bytes: refused
    from workbench.running import method_fits as F
    other = bytes(F._dump(_fit(DEMO_DIR, calib, scheme="q4_0"), "another key"))
    (entry,) = [p for p in _entries(tmp_path) if p.name == entry.name]
    F.fit_cache().put_bytes(_key_of(entry), other)
    third = _fit(DEMO_DIR, calib)
    assert fits[0] == 4
    np.testing.assert_array_equal(third.arrays["blocks"], base.arrays["blocks"])


def _key_of(entry):
    import json
    return json.loads(entry.with_name(entry.name + ".json").read_text())["key"]


def test_no_cache_refits_and_writes_nothing(tmp_path, fits):
    calib = _calib(tmp_path)
    a = _fit(DEMO_DIR, calib, use_cache=False)
    b = _fit(DEMO_DIR, calib, use_cache=False)
    assert fits[0] == 2
    assert _entries(tmp_path) == []
    np.testing.assert_array_equal(a.arrays["blocks"], b.arrays["blocks"])


def test_cache_bytes_bound_evicts_least_recently_used(tmp_path):
    c = C.Cache("bound", ".bin", keep=100, folder=tmp_path / "bound")
    import os
    for i in range(4):
        assert c.put_bytes(f"k{i}" * 8, bytes(1000))
        t = 1_000_000 + i * 10
        os.utime(c.record(f"k{i}" * 8), (t, t))
    c.max_bytes = 2500                               # 2 entries of 1000 bytes fit, not 3
    assert c.get_bytes("k0" * 8) is not None        # used: the most recent now
    c.put_bytes("k9" * 8, bytes(1000))
    kept = {k for k in ("k0", "k1", "k2", "k3", "k9") if c.record(k * 8).exists()}
    assert kept == {"k9", "k0"}


@pytest.fixture
def imatrix_fits(monkeypatch):
    """The number of imatrix fits made, as a one-item list."""
    from workbench.quant.methods.imatrix import Imatrix
    return _counted(monkeypatch, Imatrix)


def test_mlx_imatrix_fits_kept_from_allocate_to_export(tmp_path, imatrix_fits, capsys):
    """imatrix under an MLX scheme (a 98-candidate search a group) is kept like GPTQ: allocate
    fits the plan's tensors on the whole calibration text, export reads them (no fit, no
    calibration pass) and writes the bytes a fit without the cache writes; imatrix under a
    GGML scheme (milliseconds) keeps nothing."""
    calib = _calib(tmp_path)
    plan = tmp_path / "plan.json"
    assert main(["allocate", str(DEMO_DIR), "--target", "mlx", "--budget-bpw", "4.5",
                 "--measure", "weight", "--methods", "rtn,imatrix", "--schemes", "mlx-q3-g64,mlx-q4-g64,mlx-q6-g64",
                 "--calib", str(calib),
                 "-o", str(plan)]) == 0
    said = capsys.readouterr()
    p = Plan.load(str(plan))
    assert "imatrix" in p.methods_used()
    assert "imatrix fitted on the whole calibration text" in said.out + said.err
    made = imatrix_fits[0]
    kept = len(_entries(tmp_path))
    assert made > 0 and kept > 0
    args = [str(DEMO_DIR), "--plan", str(plan), "--format", "mlx", "--calib", str(calib)]
    assert main(["export", *args, "-o", str(tmp_path / "a")]) == 0
    assert imatrix_fits[0] == made                        # read, not fitted
    said = capsys.readouterr()
    assert "read from the cache" in said.out + said.err
    assert main(["export", *args, "-o", str(tmp_path / "b"), "--no-cache"]) == 0
    assert imatrix_fits[0] > made                         # fitted again: the same bytes
    a, b = ((tmp_path / d / "model.safetensors").read_bytes() for d in ("a", "b"))
    assert a == b
    # imatrix on a GGML scheme: nothing kept
    assert main(["export", str(DEMO_DIR), "--scheme", "q4_k", "--method", "imatrix", "--calib",
                 str(calib), "--format", "gguf", "-o", str(tmp_path / "c.gguf")]) == 0
    assert len(_entries(tmp_path)) == kept

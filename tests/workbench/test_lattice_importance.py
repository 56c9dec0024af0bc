"""The lattice types llama.cpp quantizes only with an importance matrix (IQ1_S, IQ1_M, IQ2_XXS,
IQ2_XS, IQ2_S, IQ3_XXS: llama-quant.cpp refuses them without one): an export that puts them on
a model that runs calibrates an imatrix for them and says so; one that cannot warns, naming the
types and the way out; --method rtn is honoured, with the warning."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from workbench.cli import main

pytest.importorskip("transformers")


def _export(capsys, src, out, *extra):
    rc = main(["export", str(src), "--scheme", "iq2_xxs", "--format", "gguf", "-o", str(out),
               *extra])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    return cap.err


def _data(path):
    from gguf import GGUFReader
    r = GGUFReader(str(path))
    return {t.name: np.array(t.data).tobytes() for t in r.tensors
            if t.tensor_type.name == "IQ2_XXS"}


def test_a_runnable_model_gets_an_imatrix_for_its_lattice_tensors(tiny_arch, tmp_path, capsys):
    folder = tiny_arch("llama")
    auto = tmp_path / "auto.gguf"
    err = _export(capsys, folder, auto)
    line = next(ln for ln in err.splitlines() if ln.startswith("note: iq2_xxs on "))
    assert "only with an importance matrix, so they use --method imatrix" in line
    explicit = tmp_path / "imatrix.gguf"
    _export(capsys, folder, explicit, "--method", "imatrix")
    plain = tmp_path / "rtn.gguf"
    err = _export(capsys, folder, plain, "--method", "rtn")
    assert "warning: iq2_xxs on " in err and "as --method rtn asks" in err
    a, b, c = _data(auto), _data(explicit), _data(plain)
    assert a and a.keys() == b.keys() == c.keys()
    assert a == b                                  # the same bytes as --method imatrix
    assert sum(a[n] != c[n] for n in a) >= len(a) // 2      # and not plain rounding's


def test_a_model_that_cannot_run_is_warned(tiny_arch, tmp_path, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(tiny_arch("llama") / "model.safetensors", bare / "model.safetensors")
    err = _export(capsys, bare / "model.safetensors", tmp_path / "o.gguf")
    line = next(ln for ln in err.splitlines() if ln.startswith("warning: iq2_xxs on "))
    assert "llama.cpp refuses these types without one" in line and "--imatrix FILE" in line
    assert "note: iq2_xxs" not in err

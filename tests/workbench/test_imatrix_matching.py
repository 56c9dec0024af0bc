"""Issue 47: an importance matrix is matched against the model (workbench.running.imatrix:
imatrix_for_model). One naming none of the model's tensors is refused, naming the file, a few
of its entries and a few of the names it would need; a partial one is a one-line warning
listing (a few of, with a count) the weight matrices left without importance. A legacy .dat is
read entry by entry, each count checked against the bytes left before its values are read."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import workbench as qw
from workbench.core.errors import WorkbenchError

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "resources" / "demo_model"          # qwen2: 3 blocks of 7 matrices + lm_head
LAYER0 = ["blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight",
          "blk.0.attn_output.weight", "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight",
          "blk.0.ffn_down.weight"]
COLS = {"blk.0.ffn_down.weight": 512}             # every other one reads the 256-wide stream


def _dat(path: Path, entries) -> Path:
    out = struct.pack("<i", len(entries))
    for name, vals in entries:
        nb = name.encode()
        out += struct.pack("<i", len(nb)) + nb + struct.pack("<ii", 1, len(vals))
        out += np.asarray(vals, "<f4").tobytes()
    path.write_bytes(out)
    return path


def _gguf(path: Path, entries) -> Path:
    import gguf
    w = gguf.GGUFWriter(str(path), arch="")
    w.add_type("imatrix")
    w.add_array("imatrix.datasets", ["x.txt"])
    w.add_uint32("imatrix.chunk_count", 1)
    w.add_uint32("imatrix.chunk_size", 8)
    for name, vals in entries:
        w.add_tensor(f"{name}.in_sum2", np.asarray(vals, np.float32).reshape(1, -1))
        w.add_tensor(f"{name}.counts", np.ones((1, 1), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


FOREIGN = [("model.decoder.layers.0.fc1.weight", np.ones(256)),
           ("blk.0.attn_qkv.weight", np.ones(256)), ("enc.0.ffn.weight", np.ones(256))]
PARTIAL = [(n, np.full(COLS.get(n, 256), 2.0)) for n in LAYER0]


@pytest.fixture(params=["dat", "gguf"])
def write(request):
    return _dat if request.param == "dat" else _gguf


def _export(main, capsys, im, out, scheme="q4_k"):
    rc = main(["export", str(DEMO), "--scheme", scheme, "--format", "gguf", "--method",
               "imatrix", "--imatrix", str(im), "-o", str(out)])
    return rc, capsys.readouterr().err.strip()


def test_an_imatrix_of_another_model_is_refused(tmp_path, write, capsys):
    from workbench.cli import main
    im = write(tmp_path / f"other.imatrix.{write.__name__[1:]}", FOREIGN)
    out = tmp_path / "out.gguf"
    rc, err = _export(main, capsys, im, out)
    assert rc == 2 and "\n" not in err, err
    assert err.startswith(f"quant-workbench: error: {im}: the imatrix names none of the "
                          "model's tensors: its 3 entries are "), err
    assert "blk.0.attn_qkv.weight" in err and "model.decoder.layers.0.fc1.weight" in err
    assert "the model's would be blk.0.attn_q.weight, blk.0.attn_k.weight" in err
    assert not out.exists() and not list(tmp_path.glob("out.gguf*"))
    rc = main(["sensitivity", str(DEMO), "--measure", "activation", "--schemes", "q4_k",
               "--imatrix", str(im)])
    assert rc == 2 and "names none of the model's tensors" in capsys.readouterr().err
    model = qw.open_model(DEMO)
    with pytest.raises(WorkbenchError, match="names none of the model's tensors") as e:
        qw.export_plan(model, "q4_k", "gguf", out, method="imatrix", imatrix=im)
    assert str(im) in str(e.value) and not out.exists()
    for call in (lambda: qw.measure_sensitivity(model, "q4_k", measure="activation",
                                                imatrix=im),
                 lambda: qw.evaluate_plan(model, "int4-g128", method="imatrix", imatrix=im),
                 lambda: qw.allocate_plan(model, qw.Budget.bits_per_weight(5.0),
                                          schemes="q4_k,q8_0", imatrix=im)):
        with pytest.raises(WorkbenchError, match="names none of the model's tensors"):
            call()


def test_a_partial_imatrix_says_which_matrices_have_no_importance(tmp_path, write, capsys):
    from workbench.cli import main
    im = write(tmp_path / f"half.imatrix.{write.__name__[1:]}", PARTIAL)
    out = tmp_path / "out.gguf"
    rc, err = _export(main, capsys, im, out)
    assert rc == 0, err
    warn = [ln for ln in err.splitlines() if ln.startswith("warning: the imatrix")]
    assert warn == [f"warning: the imatrix {im} has no entry for 15 weight matrices of the "
                    "model (7 tensors matched), which get no importance (rtn, or the mean "
                    "second moment in the activation measure): model.layers.1.self_attn."
                    "q_proj.weight, model.layers.1.self_attn.k_proj.weight, model.layers.1."
                    "self_attn.v_proj.weight, ... (15 in all)"], err
    lines = []
    qw.measure_sensitivity(qw.open_model(DEMO), "q4_k", measure="activation", imatrix=im,
                           say=lines.append)
    assert sum("has no entry for 15 weight matrices" in ln for ln in lines) == 1, lines


def test_a_whole_imatrix_from_calibrate_warns_of_nothing(tmp_path, capsys):
    from workbench.cli import main
    im = tmp_path / "demo.imatrix.gguf"
    assert main(["calibrate", str(DEMO), "-o", str(im), "--samples", "4"]) == 0
    capsys.readouterr()
    rc, err = _export(main, capsys, im, tmp_path / "out.gguf")
    assert rc == 0 and "warning: the imatrix" not in err, err


def test_matching_keeps_the_values_and_names(tmp_path):
    from workbench.running.imatrix import imatrix_for_model
    im = _dat(tmp_path / "half.dat", PARTIAL)
    vals, missing = imatrix_for_model(qw.open_model(DEMO), im)
    assert sorted(vals) == sorted(f"model.layers.0.{p}.weight" for p in (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"))
    assert all(np.all(v == 2.0) for v in vals.values())
    assert len(missing) == 15 and "lm_head.weight" in missing


_BOUNDED = r"""
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 31, 1 << 31))     # 2 GiB of address space
from workbench.core.errors import WorkbenchError
from workbench.running.imatrix import read_imatrix
try:
    read_imatrix(sys.argv[1])
    print("read")
except WorkbenchError as exc:
    print("refused:", exc)
"""


def _sparse_dat(path: Path, nval: int, size: int) -> Path:
    name = b"blk.0.attn_q.weight"
    head = struct.pack("<i", 2) + struct.pack("<i", len(name)) + name + struct.pack("<ii", 1,
                                                                                      nval)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)                 # sparse: no disk used
    return path


@pytest.mark.parametrize("nval, size, words", [
    (64, 8 << 30, "entry name of 0 bytes"),                   # 8 GiB of zeros after entry 1
    ((1 << 27) + 1, 3 << 30, "at most 67,108,864 values"),    # one entry of 512 MiB
])
def test_a_dat_is_read_entry_by_entry_within_its_bounds(tmp_path, nval, size, words):
    """The old reader read the whole file first (8 GiB: a MemoryError under the limit) and
    took any count the bytes could hold (2^27 values: 1.5 GiB of arrays)."""
    p = _sparse_dat(tmp_path / "big.imatrix.dat", nval, size)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", _BOUNDED, str(p)], capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-800:]
    assert r.stdout.startswith(f"refused: {p}: ") and words in r.stdout, r.stdout


def test_a_gguf_imatrix_tensor_beyond_the_bound_is_refused(tmp_path):
    import gguf
    p = tmp_path / "big.imatrix.gguf"
    w = gguf.GGUFWriter(str(p), arch="")
    w.add_type("imatrix")
    n = (1 << 26) + 32
    w.add_tensor_info("blk.0.attn_q.weight.in_sum2", (1, n), np.dtype(np.float32), n * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    with open(p, "r+b") as f:            # the data, sparse
        f.truncate(os.path.getsize(p) + 64 + n * 4)
    from workbench.running.imatrix import read_imatrix
    with pytest.raises(WorkbenchError, match="imatrix tensor of 67,108,896 values") as e:
        read_imatrix(p)
    assert str(p) in str(e.value)
